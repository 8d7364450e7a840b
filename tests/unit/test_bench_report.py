"""The README's benchmark table: each figure against its target."""

from __future__ import annotations

from bench.report import catchup_rows, snapshot_rows, streaming_rows


def test_snapshot_is_judged_against_debezium_and_copy() -> None:
    record = {
        "rows": 2_000_000,
        "snapshot_read_write_s": 16.6,
        "snapshot_rows_per_s": 120_481,
        "snapshot_total_s": 25.5,
        "debezium_total_s": 100.0,
        "debezium_rows_per_s": 20_000,
        "speedup_over_debezium": 6.0,
        "speedup_over_debezium_total": 3.9,
        "copy_to_devnull_s": 1.32,
        "copy_rows_per_s": 1_515_152,
        "ratio_to_copy": 12.6,
    }
    debezium, copy = snapshot_rows(record)
    assert debezium[-1] == "yes" and "6.0×" in debezium[3]
    assert copy[-1] == "**no**" and "12.6×" in copy[3]


def test_catch_up_needs_25000_per_second_and_the_capture_rate() -> None:
    record = {"changes": 1_000_000, "capture_changes_per_s": 30_000, "capture_s": 33.3}
    record |= {"cache_changes_per_s": 27_000, "cache_s": 37.0}
    record |= {"search_changes_per_s": 31_000, "search_s": 32.3}
    record |= {
        "cache_cores": {"spark (JVM)": 1.1, "redis": 0.2, "machine (all processes)": 1.9},
        "cache_cpu_us_per_change": 70,
    }
    rows = {row[0]: row for row in catchup_rows(record)}
    assert rows["… apply into cache"][-1] == "**no**"  # above 25,000/s, slower than capture
    assert rows["… apply into search"][-1] == "yes"
    assert "… apply into warehouse" not in rows  # not measured: not reported
    assert rows["… apply into cache"][1] == (
        "27,000 changes/s (37.0 s); 1.9 cores busy (spark (JVM) 1.1, redis 0.2), "
        "70 µs of CPU per change"
    )
    assert "cores busy" not in rows["… apply into search"][1]


def test_streaming_targets_apply_at_1000_tps_only() -> None:
    def store(p99: float) -> dict[str, object]:
        return {"p50_s": 1.0, "p95_s": p99, "p99_s": p99, "lag_bounded": True}

    run = {"achieved_tps": 0.0, "capture": {"p50_s": 0.1, "p99_s": 0.2}}
    record = {
        "machine": {"cores": 2},
        "runs": [
            run
            | {
                "target_tps": 500,
                "cache": store(9.0),
                "search": store(9.0),
                "warehouse": store(9.0),
            },
            run
            | {
                "target_tps": 1000,
                "cache": store(1.5),
                "search": store(2.5),
                "warehouse": store(4.0),
            },
        ],
    }
    judged = [(row[0], row[-1]) for row in streaming_rows(record) if row[-1]]
    assert judged == [
        ("… cache: commit → visible", "yes"),
        ("… search: commit → visible", "**no**"),
        ("… warehouse: commit → visible", "yes"),
    ]
