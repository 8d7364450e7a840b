"""TLS and authentication settings of PostgreSQL and Redis: what every client gets, and the
combinations refused at settings time (one line, no secret)."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc.capture.connector_config import connector_config
from cdc.core.errors import ConfigError
from cdc.core.settings import load_settings

pytestmark = pytest.mark.usefixtures("clean_env")


def test_every_postgres_connection_carries_sslmode_and_the_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    s = load_settings(postgres={"sslmode": "verify-full", "ca_file": str(ca)})
    for dsn in (s.postgres.dsn(), s.postgres.conninfo("cdc_replication", None)):
        params = conninfo_to_dict(dsn)
        assert params["sslmode"] == "verify-full"
        assert params["sslrootcert"] == str(ca)
    url = s.postgres.sqlalchemy_url()
    assert url.query == {"sslmode": "verify-full", "sslrootcert": str(ca)}
    config = connector_config(
        s, topic_prefix="p", tables=["public.t"], slot="s", publication="p", password="x"
    )
    assert config["database.sslmode"] == "verify-full"
    assert config["database.sslrootcert"] == str(ca)
    assert s.postgres.jdbc_ssl_params() == {"sslmode": "verify-full", "sslrootcert": str(ca)}


def test_verify_full_without_a_ca_file_uses_the_system_trust_store() -> None:
    pg = load_settings(postgres={"sslmode": "verify-full"}).postgres
    assert conninfo_to_dict(pg.dsn())["sslrootcert"] == "system"
    assert pg.jdbc_ssl_params()["sslfactory"] == "org.postgresql.ssl.DefaultJavaSSLFactory"


def test_default_is_libpq_prefer_without_a_root_cert() -> None:
    params = conninfo_to_dict(load_settings().postgres.dsn())
    assert params["sslmode"] == "prefer"
    assert "sslrootcert" not in params


def test_relative_ca_path_is_made_absolute(tmp_path: Path) -> None:
    pg = load_settings(postgres={"sslmode": "verify-ca", "ca_file": "ca.crt"}).postgres
    assert pg.ca_file == tmp_path / "ca.crt"  # Connect's JVM runs elsewhere: absolute


@pytest.mark.parametrize(
    ("postgres", "says"),
    [
        ({"sslmode": "tls"}, "sslmode"),
        ({"sslmode": "prefer", "ca_file": "/ca.crt"}, "set sslmode to verify-full"),
        ({"sslmode": "require", "ca_file": "/ca.crt"}, "does not check the server's certificate"),
        ({"sslmode": "verify-ca"}, "verify-ca needs ca_file"),
        ({"cert_file": "/server.crt"}, "set both cert_file and key_file"),
        ({"key_file": "/server.key"}, "set both cert_file and key_file"),
        (
            {"cert_file": "/s.crt", "key_file": "/s.key", "sslmode": "disable"},
            "TLS connections only",
        ),
    ],
)
def test_bad_postgres_tls_combinations_fail_in_one_line(
    postgres: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(postgres=postgres)
    assert says in str(err.value)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("invalid setting postgres")


@pytest.mark.parametrize(
    ("redis", "says"),
    [
        ({"cert_file": "/s.crt", "key_file": "/s.key"}, "set tls = true"),
        ({"tls": True, "cert_file": "/s.crt"}, "set both cert_file and key_file"),
        ({"ca_file": "/ca.crt"}, "tls is false"),
        ({"username": "cdc"}, "needs a password"),
        ({"username": "bad user", "password": "p"}, "username"),
    ],
)
def test_bad_redis_tls_combinations_fail_in_one_line(redis: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(redis=redis)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_redis_url_names_tls_and_the_user_but_never_the_password() -> None:
    r = load_settings(
        redis={"tls": True, "ca_file": "/ca.crt", "username": "cdc", "password": "s3cret pw"}
    ).redis
    assert r.url == f"rediss://cdc@{r.host}:{r.port}/0"
    assert "s3cret" not in repr(r) and "s3cret" not in r.url
    assert load_settings().redis.url.startswith("redis://")


def test_redis_client_uses_tls_the_ca_and_the_acl_user(tmp_path: Path) -> None:
    from cdc.core.clients import redis_client

    ca = tmp_path / "ca.crt"
    r = load_settings(
        redis={"tls": True, "ca_file": str(ca), "username": "cdc", "password": "pw"}
    ).redis
    kwargs = redis_client(r).connection_pool.connection_kwargs
    assert kwargs["username"] == "cdc" and kwargs["password"] == "pw"
    assert kwargs["ssl_ca_certs"] == str(ca)
    assert kwargs["ssl_cert_reqs"] == "required" and kwargs["ssl_check_hostname"] is True
    assert "SSL" in redis_client(r).connection_pool.connection_class.__name__


def test_local_redis_config_holds_a_hash_of_the_password_not_the_password(
    tmp_path: Path,
) -> None:
    from cdc.stack.components.redis import Redis

    settings = load_settings(
        data_dir=str(tmp_path),
        redis={
            "tls": True,
            "cert_file": str(tmp_path / "s.crt"),
            "key_file": str(tmp_path / "s.key"),
            "username": "cdc",
            "password": "s3cret pw",
        },
    )
    (tmp_path / "s.crt").write_text("x")
    (tmp_path / "s.key").write_text("x")
    component = Redis(settings)
    component.state_dir.mkdir(parents=True)
    component.prepare()
    conf = component.state_dir / "redis.conf"
    text = conf.read_text()
    assert conf.stat().st_mode & 0o777 == 0o600
    assert "s3cret" not in text
    assert "port 0\n" in text and f"tls-port {settings.redis.port}\n" in text
    assert "user default reset off\n" in text
    assert "user cdc reset on #" in text
