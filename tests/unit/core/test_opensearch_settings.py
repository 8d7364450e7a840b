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


@pytest.mark.parametrize("hosts", [["a:9200", "b:9201"], "a:9200,b:9201", '["a:9200","b:9201"]'])
def test_a_list_of_hosts_reaches_every_node(hosts: object) -> None:
    section = _opensearch(managed=False, hosts=hosts)
    assert section.urls == ("http://a:9200", "http://b:9201")
    assert section.url == "http://a:9200"
    client = opensearch_client(section)
    assert sorted(c.host for c in client.transport.connection_pool.connections) == [
        "http://a:9200",
        "http://b:9201",
    ]
    assert _opensearch(host="n", port=1).urls == ("http://n:1",)


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"hosts": "a:9200"}, "set managed = false"),
        ({"number_of_replicas": 1}, "the local stack runs one"),
        ({"managed": False, "number_of_shards": 0}, "number_of_shards"),
        ({"managed": False, "number_of_replicas": -1}, "number_of_replicas"),
        ({"managed": False, "hosts": "a"}, "'a' is not host:port"),
    ],
)
def test_bad_cluster_settings_are_one_line(section: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _opensearch(**section)
    assert "\n" not in str(info.value) and says in str(info.value), str(info.value)


def _found(**indexes: tuple[int, int]) -> dict[str, Any]:
    return {
        name: {"settings": {"index": {"number_of_shards": str(s), "number_of_replicas": str(r)}}}
        for name, (s, r) in indexes.items()
    }


def test_setup_says_the_replicas_it_sets_and_the_shards_it_cannot_change() -> None:
    from cdc.stores.search.store import index_settings_lines

    assert index_settings_lines(_found(a=(2, 1)), 2, 1) == []
    lines = index_settings_lines(_found(a=(1, 0), b=(2, 1)), 2, 1)
    assert lines == [
        "search: index a replicas 0 -> 1 (opensearch.number_of_replicas)",
        "search: index a has 1 shard(s), not opensearch.number_of_shards 2: an index keeps "
        "the shards it was made with; `cdc rebuild --store search` makes it again with them",
    ]
