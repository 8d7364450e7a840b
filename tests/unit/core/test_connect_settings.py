"""Connect as a group (issue 69): connect.hosts lists the workers (a list, one string with
commas, or a JSON list from the environment), https with connect.tls and its CA, the
login's password masked; bad combinations refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from cdc.capture.connect_client import connect_client
from cdc.core.errors import ComponentError, ConfigError
from cdc.core.settings import load_settings

pytestmark = pytest.mark.usefixtures("clean_env")


def _connect(**section: Any) -> Any:
    return load_settings(connect=section).connect


def test_one_worker_at_host_port_by_default() -> None:
    section = _connect(port=18083)
    assert section.urls == ("http://127.0.0.1:18083",) and section.url == section.urls[0]
    assert section.remote == ()


def test_the_workers_of_a_group_over_https(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    section = _connect(
        managed=False,
        hosts="c1.internal:8443, [::1]:8443",
        tls=True,
        ca_file=str(ca),
        username="cdc",
        password="rest secret",
    )
    assert section.urls == ("https://c1.internal:8443", "https://[::1]:8443")
    assert section.remote == ("c1.internal",)
    assert "rest secret" not in repr(section) and "rest secret" not in str(section.urls)
    client = connect_client(load_settings(connect=section.model_dump()))
    assert client.urls == list(section.urls)
    assert client.verify == str(ca)
    assert client._session.auth == ("cdc", "rest secret")


def test_the_hosts_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_CONNECT__MANAGED", "false")
    monkeypatch.setenv("CDC_CONNECT__HOSTS", '["a:8083", "b:8083"]')
    assert load_settings().connect.urls == ("http://a:8083", "http://b:8083")


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ({"managed": False, "hosts": "a:8083,a:8083"}, "names an address twice"),
        ({"managed": False, "hosts": ["a"]}, "is not host:port"),
        ({"hosts": ["c1:8083"]}, "set managed = false"),
        ({"managed": False, "username": "cdc"}, "go together"),
        ({"managed": False, "ca_file": "{ca}"}, "set tls = true"),
        ({"tls": True}, "connect.cert_file and key_file"),
        ({"managed": False, "ca_file": "/nowhere/ca.pem", "tls": True}, "is not a file"),
    ],
)
def test_a_bad_combination_is_refused_in_one_line(
    tmp_path: Path, section: dict[str, Any], said: str
) -> None:
    (tmp_path / "ca.pem").write_text("a CA")
    section = {
        k: (v.format(ca=tmp_path / "ca.pem") if isinstance(v, str) else v)
        for k, v in section.items()
    }
    with pytest.raises(ConfigError, match="invalid setting connect") as refused:
        load_settings(connect=section)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_ca_file_wins_over_a_ca_bundle_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests lets REQUESTS_CA_BUNDLE replace a session's own `verify` (psf/requests#3829):
    the client gives connect.ca_file with every request."""
    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    client = connect_client(
        load_settings(connect={"managed": False, "hosts": "c1:8443", "tls": True, "ca_file": ca})
    )
    sent: dict[str, Any] = {}

    def request(method: str, url: str, **kwargs: Any) -> Any:
        sent.update(kwargs, url=url)
        raise requests.ConnectionError("no route")

    monkeypatch.setattr(client._session, "request", request)
    with pytest.raises(ComponentError, match="https://c1:8443: ConnectionError"):
        client.info()
    assert sent["verify"] == str(ca) and sent["url"] == "https://c1:8443/"
