"""OpenSearch's TLS and auth settings: https when tls, bad combinations refused at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc.core.clients import opensearch_client
from cdc.core.errors import ConfigError
from cdc.core.settings import load_settings


def _opensearch(**section: Any) -> Any:
    return load_settings(opensearch=section).opensearch


def test_plain_by_default_and_https_with_tls() -> None:
    assert _opensearch().url.startswith("http://")
    secured = _opensearch(
        tls=True,
        ca_file="/x/ca.crt",
        cert_file="/x/n.crt",
        key_file="/x/n.key",
        username="u",
        password="p w",
    )
    assert secured.url.startswith("https://") and secured.secured
    assert "p w" not in repr(secured)


def test_the_client_checks_the_certificate_and_sends_the_user(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    section = _opensearch(tls=True, managed=False, ca_file=str(ca), username="u", password="pw")
    client = opensearch_client(section)
    connection = client.transport.get_connection()
    assert connection.host.startswith("https://")
    assert connection.pool.cert_reqs == "CERT_REQUIRED" and connection.pool.ca_certs == str(ca)
    assert connection.headers["authorization"].startswith("Basic ")


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"cert_file": "/x/n.crt"}, "set both cert_file and key_file"),
        ({"username": "u"}, "set both username and password"),
        ({"username": "u", "password": "p"}, "travel in clear text"),
        ({"cert_file": "/x/n.crt", "key_file": "/x/n.key"}, "set tls = true"),
        ({"tls": True, "cert_file": "/x/n.crt", "key_file": "/x/n.key"}, "set ca_file"),
        (
            {"tls": True, "ca_file": "/x/ca", "cert_file": "/x/n.crt", "key_file": "/x/n.key"},
            "set username",
        ),
        ({"tls": True}, "needs its cert_file and key_file"),
    ],
)
def test_bad_combinations_fail_at_settings_time(section: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _opensearch(**section)
