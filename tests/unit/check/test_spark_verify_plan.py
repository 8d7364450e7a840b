"""The pieces of verify's comparison on Spark's executors that need no Spark: the source's
page ranges, the secrets its tasks get, the setting that chooses it."""

from __future__ import annotations

import itertools

import pytest
from pydantic import SecretStr, ValidationError

from cdc.check.spark_verify import _range_clause, source_ranges
from cdc.core.settings import Settings
from cdc.core.settings.verify import VerifySettings
from cdc.stores.base import row_digest
from cdc.stores.registry import executor_settings


def test_the_source_is_split_into_ranges_covering_every_page() -> None:
    assert source_ranges(0, 4) == [(0, None)]
    assert source_ranges(10, 1) == [(0, None)]
    assert source_ranges(10, 3) == [(0, 4), (4, 8), (8, None)]
    assert source_ranges(3, 8) == [(0, 1), (1, 2), (2, None)]  # no empty ranges
    ranges = source_ranges(1000, 7)
    assert len(ranges) == 7 and ranges[-1][1] is None
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_a_range_is_a_ctid_condition() -> None:
    def text(first: int, end: int | None) -> str:
        return _range_clause(first, end).as_string(None)

    assert text(0, None) == "true"
    assert text(0, 4) == "ctid < '(4,0)'::tid"
    assert text(4, None) == "ctid >= '(4,0)'::tid"
    assert text(4, 8) == "ctid >= '(4,0)'::tid AND ctid < '(8,0)'::tid"


def test_the_source_tasks_get_postgres_secret_and_no_other() -> None:
    settings = Settings(
        postgres={"password": SecretStr("pg-secret")},  # type: ignore[arg-type]
        redis={"password": SecretStr("redis-secret")},  # type: ignore[arg-type]
    )
    shipped = executor_settings(settings, None, keep=("postgres",))
    assert shipped.postgres.password is not None
    assert shipped.postgres.password.get_secret_value() == "pg-secret"
    assert shipped.redis.password is None or not shipped.redis.password.get_secret_value()
    cache = executor_settings(settings, "cache")
    assert cache.redis.password is not None
    assert cache.redis.password.get_secret_value() == "redis-secret"
    assert cache.postgres.password is None or not cache.postgres.password.get_secret_value()


def test_verify_settings() -> None:
    assert Settings().verify == VerifySettings(engine="auto", partitions=0)
    with pytest.raises(ValidationError):
        VerifySettings(engine="gpu")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        VerifySettings(partitions=-1)


def test_the_digest_is_of_the_sorted_form() -> None:
    assert row_digest({"a": 1, "b": "x"}) == row_digest({"b": "x", "a": 1})
    assert row_digest({"a": 1}) != row_digest({"a": "1"})
    assert row_digest({"r": float("nan")}) != row_digest({"r": None})
