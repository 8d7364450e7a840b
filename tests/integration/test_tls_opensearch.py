"""The search store over https with basic auth: the local OpenSearch node started with a
certificate the test's own CA signed and the security plugin on, one user.

The search store prepares an index and writes a row through cdc's client; a reader of the
test's own (opensearch-py, built here) reads it back over https as that user; plain http,
no credentials, a wrong password and a wrong CA are refused; the password is in no file
of the node's and in no `ps` line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from opensearchpy import AuthenticationException, OpenSearch
from opensearchpy import SSLError as OpenSearchSSLError

from cdc.core.catalog import Column, Table
from cdc.core.settings import Settings, load_settings
from cdc.log.position import Event
from cdc.stack.components.opensearch import OpenSearch as OpenSearchNode
from cdc.stores.registry import make_row_store
from cdc.stores.search.store import index_name
from tests.helpers import free_ports
from tests.tls import TestCA, make_ca

PASSWORD = "tls test pw 'quoted' #1 \"x\""  # a space, quotes and a hash: passed, never parsed
USER = "cdc_search"
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
def tls_opensearch() -> Iterator[tuple[Settings, TestCA]]:
    root = Path(tempfile.mkdtemp(prefix="cdc-tls-opensearch-"))
    root.chmod(0o755)  # OpenSearch runs as the service user when the tests run as root
    try:
        ca = make_ca(root / "ca")
        server = ca.server_cert("opensearch")
        port, transport_port = free_ports(2)
        settings = load_settings(
            data_dir=str(root / "data"),
            opensearch={
                "port": port,
                "transport_port": transport_port,
                "heap": "512m",
                "tls": True,
                "ca_file": str(ca.ca_file),
                "cert_file": str(server.cert_file),
                "key_file": str(server.key_file),
                "username": USER,
                "password": PASSWORD,
            },
        )
        node = OpenSearchNode(settings)
        try:
            node.start()  # waits until cdc's own client (https, the user) sees it yellow
            yield settings, ca
        finally:
            node.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _own_client(settings: Settings, ca_file: Path, password: str = PASSWORD) -> OpenSearch:
    """The test's own reader: opensearch-py over https, the certificate checked."""
    o = settings.opensearch
    return OpenSearch(
        hosts=[{"host": o.host, "port": o.port}],
        use_ssl=True,
        verify_certs=True,
        ca_certs=str(ca_file),
        http_auth=(USER, password),
        max_retries=0,
        timeout=30,
    )


def test_search_store_writes_and_reads_over_https_as_the_user(
    tls_opensearch: tuple[Settings, TestCA],
) -> None:
    settings, ca = tls_opensearch
    assert settings.opensearch.url.startswith("https://")
    store = make_row_store(settings, "search")
    store.prepare([TABLE])
    event = Event("public.items", '{"id":1}', 0, 7, "c", {"id": 1, "name": "a"}, 1, 100, 100)
    result = store.write({"public.items": TABLE}, [event])
    assert result.written == 1
    own = _own_client(settings, ca.ca_file)
    index = index_name(settings.pipeline.topic_prefix, "public.items")
    own.indices.refresh(index=index)
    doc = own.get(index=index, id='{"id":1}')
    assert doc["_source"]["name"] == "a"
    assert doc["_version"] == 100
    # the node runs the security plugin and knows the request's user
    who: Any = own.transport.perform_request("GET", "/_plugins/_security/authinfo")
    assert who["user_name"] == USER
    plugins = own.cat.plugins(format="json")
    assert "opensearch-security" in {p["component"] for p in plugins}


def test_plain_http_no_credentials_wrong_password_and_wrong_ca_are_refused(
    tls_opensearch: tuple[Settings, TestCA], tmp_path: Path
) -> None:
    settings, ca = tls_opensearch
    o = settings.opensearch
    plain = f"http://{o.host}:{o.port}/_cluster/health"
    with pytest.raises(requests.ConnectionError):  # no plain-text http at all
        requests.get(plain, auth=(USER, PASSWORD), timeout=10)
    https = f"https://{o.host}:{o.port}/_cluster/health"
    assert requests.get(https, verify=str(ca.ca_file), timeout=10).status_code == 401
    wrong = requests.get(https, verify=str(ca.ca_file), auth=(USER, "wrong"), timeout=10)
    assert wrong.status_code == 401
    with pytest.raises(AuthenticationException):
        _own_client(settings, ca.ca_file, password="wrong").cluster.health()
    other = make_ca(tmp_path / "other")  # a server this CA did not sign: refused by the client
    with pytest.raises(OpenSearchSSLError, match="CERTIFICATE_VERIFY_FAILED"):
        _own_client(settings, other.ca_file).cluster.health()
    # and the right ones are let in
    ok = requests.get(https, verify=str(ca.ca_file), auth=(USER, PASSWORD), timeout=10)
    assert ok.status_code == 200


def test_the_password_is_in_no_node_file_and_no_process_line(
    tls_opensearch: tuple[Settings, TestCA],
) -> None:
    settings, _ = tls_opensearch
    state = settings.data_dir / "opensearch"
    config = state / "config"
    assert (config / "node.key").stat().st_mode & 0o777 == 0o600
    users = config / "opensearch-security" / "internal_users.yml"
    assert users.stat().st_mode & 0o777 == 0o600
    assert "$2" in users.read_text()  # a bcrypt hash stands for the password
    secrets = [PASSWORD.encode(), json.dumps(PASSWORD).encode()]
    for path in [*(state / "logs").rglob("*"), state / "opensearch.log", *config.rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            for secret in secrets:
                assert secret not in data, path
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert PASSWORD not in ps.stdout
