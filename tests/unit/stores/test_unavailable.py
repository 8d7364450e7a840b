"""A store that does not answer while verify, repair, rebuild or `cdc get` reads or mends
it raises StoreUnavailableError in its own words (one line, the CLI's exit 8), not its
client's exception (a traceback), whenever it stops answering: before the first read,
or while rows are being read."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cdc.core.catalog import Table
from cdc.core.errors import StoreUnavailableError
from cdc.core.settings import Settings
from cdc.stores.base import unavailable_on
from cdc.stores.cache.store import make as make_cache
from cdc.stores.search.store import make as make_search

TABLE = Table("public", "t", (), ("id",), "d", 1, 1)


class _Probe:
    name = "probe"

    def unavailable(self, exc: BaseException) -> str:
        return f"probe does not answer ({type(exc).__name__})"

    @unavailable_on(ConnectionError, TimeoutError)
    def read(self, error: BaseException | None) -> int:
        if error is not None:
            raise error
        return 1

    @unavailable_on(ConnectionError, TimeoutError)
    def rows(self, error: BaseException) -> Iterator[int]:
        yield 1
        yield 2
        raise error


def test_a_call_that_cannot_reach_the_store_says_so_in_the_stores_words() -> None:
    probe = _Probe()
    assert probe.read(None) == 1
    with pytest.raises(StoreUnavailableError, match=r"^probe does not answer \(TimeoutError\)$"):
        probe.read(TimeoutError("timed out"))


def test_rows_read_until_the_store_stops_answering_then_it_says_so() -> None:
    rows = _Probe().rows(ConnectionError("reset by peer"))
    assert [next(rows), next(rows)] == [1, 2]
    with pytest.raises(StoreUnavailableError, match="probe does not answer"):
        next(rows)


def test_an_error_that_is_not_the_store_being_down_is_left_as_it_is() -> None:
    with pytest.raises(ValueError, match="a bug"):
        _Probe().read(ValueError("a bug"))


@pytest.fixture(scope="module")
def nobody_listens(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings whose Redis and OpenSearch are at a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"),
        redis={"port": port},  # type: ignore[arg-type]
        opensearch={"port": port},  # type: ignore[arg-type]
    )


def _reads(store: Any) -> dict[str, Callable[[], Any]]:
    return {
        "held": lambda: list(store.held(TABLE)),
        "get": lambda: store.get(TABLE, '{"id":1}'),
        "reset": lambda: store.reset(TABLE),
        "remove": lambda: store.remove(TABLE, ["1"]),
    }


@pytest.mark.parametrize("read", ["held", "get", "reset", "remove"])
def test_the_search_index_down_is_said_by_every_read(nobody_listens: Settings, read: str) -> None:
    store = make_search(nobody_listens)
    try:
        with pytest.raises(StoreUnavailableError, match=r"^OpenSearch at \S+ does not answer"):
            _reads(store)[read]()
    finally:
        store.close()


def test_the_cache_down_is_said_by_its_rows(nobody_listens: Settings) -> None:
    """(One read: redis-py retries a refused connection for about 4 s.)"""
    store = make_cache(nobody_listens)
    try:
        with pytest.raises(StoreUnavailableError, match=r"^Redis at redis://\S+ does not answer"):
            list(store.held(TABLE))
    finally:
        store.close()


def test_a_refused_login_says_what_to_fix_not_that_the_store_is_down(
    nobody_listens: Settings,
) -> None:
    import opensearchpy
    import redis

    cache = make_cache(nobody_listens)
    said = cache.unavailable(redis.AuthenticationError("invalid username-password pair"))
    assert "refused the login (invalid username-password pair)" in said, said
    assert "redis.password" in said and "does not answer" not in said, said
    search = make_search(nobody_listens)
    said = search.unavailable(opensearchpy.AuthenticationException(401, "security_exception"))
    assert "refused the login (401)" in said and "opensearch.password" in said, said
    cache.close()
    search.close()
