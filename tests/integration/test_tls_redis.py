"""The cache over TLS with an ACL user: the local redis-server started with a certificate
the test's own CA signed, TLS only, its default user off.

The cache store writes and reads through cdc's client; a reader of the test's own (redis-py,
built here) sees the row; plain-text, unauthenticated, wrong-password and wrong-CA
connections are refused; the password is in no file of the server's and in no `ps` line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cdc.core.catalog import Column, Table
from cdc.core.settings import Settings, load_settings
from cdc.log.position import Event
from cdc.stack.components.redis import Redis
from cdc.stores.registry import make_row_store
from tests import tls
from tests.helpers import free_ports

PASSWORD = "tls test pw 'quoted' #1"  # a space, quotes and a hash: passed, never parsed
USER = "cdc_cache"
TABLE = Table(
    "public",
    "items",
    (
        Column("id", "integer", "int4", "N", False, None, True),
        Column("name", "text", "text", "S", False, None, False),
    ),
    ("id",),
    "d",
    0,
    0,
)


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[tuple[Settings, tls.TestCA]]:
    root = Path(tempfile.mkdtemp(prefix="cdc-tls-redis-"))
    try:
        ca = tls.make_ca(root / "ca")
        server = ca.server_cert("redis")
        settings = load_settings(
            data_dir=str(root / "data"),
            redis={
                "port": free_ports(1)[0],
                "tls": True,
                "ca_file": str(ca.ca_file),
                "cert_file": str(server.cert_file),
                "key_file": str(server.key_file),
                "username": USER,
                "password": PASSWORD,
            },
        )
        component = Redis(settings)
        try:
            component.start()  # waits until cdc's own client (TLS, the ACL user) pings it
            yield settings, ca
        finally:
            component.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _plain(settings: Settings, **kwargs: object) -> redis.Redis:
    r = settings.redis
    return redis.Redis(host=r.host, port=r.port, socket_timeout=5, **kwargs)  # type: ignore[arg-type]


def test_cache_store_writes_and_reads_over_tls_as_the_acl_user(
    tls_redis: tuple[Settings, tls.TestCA],
) -> None:
    settings, ca = tls_redis
    store = make_row_store(settings, "cache")
    store.prepare([TABLE])
    event = Event("public.items", '{"id":1}', 0, 7, "c", {"id": 1, "name": "a"}, 1, 100, 100)
    result = store.write({"public.items": TABLE}, [event])
    assert result.written == 1
    assert store.rows(TABLE) == {'{"id":1}': {"id": "1", "name": "a"}}  # as text
    # a reader of the test's own, over TLS as the ACL user, sees the hash
    own = _plain(
        settings,
        ssl=True,
        ssl_ca_certs=str(ca.ca_file),
        username=USER,
        password=PASSWORD,
        decode_responses=True,
    )
    keys = own.keys(f"{settings.pipeline.topic_prefix}:public.items:*")
    assert len(keys) == 1
    assert own.hget(keys[0], "name") == "a"
    assert own.acl_whoami() == USER
    store.close()


def test_plaintext_unauthenticated_wrong_password_and_wrong_ca_are_refused(
    tls_redis: tuple[Settings, tls.TestCA], tmp_path: Path
) -> None:
    settings, ca = tls_redis
    with pytest.raises(redis.ConnectionError):  # no plain-text port at all
        _plain(settings, username=USER, password=PASSWORD).ping()
    with pytest.raises(redis.AuthenticationError):  # the default user is off
        _plain(settings, ssl=True, ssl_ca_certs=str(ca.ca_file)).ping()
    with pytest.raises(redis.AuthenticationError):
        _plain(
            settings, ssl=True, ssl_ca_certs=str(ca.ca_file), username=USER, password="wrong"
        ).ping()
    other = tls.make_ca(
        tmp_path / "other", name="another-test-ca"
    )  # a server this CA did not sign: refused by the client
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        _plain(
            settings, ssl=True, ssl_ca_certs=str(other.ca_file), username=USER, password=PASSWORD
        ).ping()


def test_the_password_is_in_no_server_file_and_no_process_line(
    tls_redis: tuple[Settings, tls.TestCA],
) -> None:
    settings, _ = tls_redis
    state = settings.data_dir / "redis"
    conf = state / "redis.conf"
    assert conf.stat().st_mode & 0o777 == 0o600
    for secret in (PASSWORD, json.dumps(PASSWORD)):
        for path in state.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
        assert secret not in ps.stdout
