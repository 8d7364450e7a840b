"""A Spark write that loses a Delta commit conflict is run again; any other failure is not
(cdc/stores/warehouse/conflicts.py)."""

from __future__ import annotations

import pytest

from cdc.stores.warehouse import conflicts

LOST = (
    "[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Transaction conflict detected. a concurrent "
    "WRITE added data to table delta.`file:/w/current` committed at version 337."
)


def test_a_write_that_lost_a_conflict_is_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conflicts.time, "sleep", lambda s: None)
    tries: list[int] = []

    def write() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError(LOST)  # as PySpark carries it: the error class in the text
        return "written"

    assert conflicts.retried("a MERGE", write) == "written"
    assert len(tries) == 3


def test_a_write_that_keeps_losing_raises_and_other_failures_are_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(conflicts.time, "sleep", lambda s: None)
    tries: list[int] = []

    def losing() -> None:
        tries.append(1)
        raise RuntimeError(LOST)

    with pytest.raises(RuntimeError, match="DELTA_CONCURRENT_APPEND"):
        conflicts.retried("a MERGE", losing)
    assert len(tries) == conflicts.SPARK_RETRIES + 1

    tries.clear()

    def broken() -> None:
        tries.append(1)
        raise RuntimeError("[DELTA_MERGE_INCOMPATIBLE_DATATYPE] Failed to merge")

    with pytest.raises(RuntimeError, match="INCOMPATIBLE"):
        conflicts.retried("a MERGE", broken)
    assert len(tries) == 1
