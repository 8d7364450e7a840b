"""The table of the latest benchmark figures in docs/benchmarks.md, from bench/results/*.jsonl.

    .venv/bin/python bench/report.py            # print the table
    .venv/bin/python bench/report.py --write    # and put it in docs/benchmarks.md

The table goes between docs/benchmarks.md's `<!-- bench:begin -->` and `<!-- bench:end -->`
lines. A benchmark not run yet is left out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
PAGE = Path(__file__).parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
STORES = ("cache", "search", "warehouse")


def records(name: str) -> list[dict[str, Any]]:
    """Every record of results/<name>.jsonl, oldest first (not those of an experiment
    with settings the code does not have)."""
    path = RESULTS / f"{name}.jsonl"
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in found if "experiment" not in r]


def latest(name: str, wanted: Any = None) -> dict[str, Any] | None:
    """The newest record of results/<name>.jsonl (that `wanted` accepts)."""
    return next((r for r in reversed(records(name)) if wanted is None or wanted(r)), None)


def _n(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def snapshot_rows(r: dict[str, Any]) -> list[list[str]]:
    rows = [
        [
            f"Snapshot of {_n(r['rows'])} rows into Kafka",
            f"{_n(r['snapshot_read_write_s'])} s = {_n(r['snapshot_rows_per_s'])} rows/s "
            f"({_n(r['snapshot_total_s'])} s with Spark's start, slot, connector)",
            f"Debezium `snapshot.mode=initial`: {_n(r['debezium_total_s'])} s = "
            f"{_n(r['debezium_rows_per_s'])} rows/s",
            f"≥ 5× Debezium: {r['speedup_over_debezium']}× "
            f"({r['speedup_over_debezium_total']}× counting our start-up)",
            _met(r["speedup_over_debezium"] >= 5),
        ],
        [
            "… against reading the table",
            f"{_n(r['snapshot_read_write_s'])} s",
            f"`\\copy … TO /dev/null`: {r['copy_to_devnull_s']} s = "
            f"{_n(r['copy_rows_per_s'])} rows/s",
            f"within 10× of `\\copy`: {r['ratio_to_copy']}×",
            _met(r["ratio_to_copy"] <= 10),
        ],
    ]
    if "warehouse_rows_per_s" in r:
        floor = r.get("warehouse_floor")
        rows.append(
            [
                "… and on into Delta (current + history)",
                f"{_n(r['warehouse_apply_s'])} s = {_n(r['warehouse_rows_per_s'])} rows/s",
                (
                    f"its floor, step by step over one batch of {_n(floor['records'])} of "
                    f"the records: Spark's read {floor['kafka_read_s']} s, collect as Arrow "
                    f"{floor['collect_s']} s, decode {floor['decode_s']} s, one delta-rs "
                    f"append {floor['delta_append_s']} s"
                    if floor
                    else ""
                ),
                "≥ 100,000 rows/s",
                _met(r["warehouse_rows_per_s"] >= 100_000),
            ]
        )
    return rows


def direct_snapshot_rows(r: dict[str, Any]) -> list[list[str]]:
    """The snapshot that writes the warehouse itself (`--warehouse direct`)."""
    return [
        [
            f"Snapshot of {_n(r['rows'])} rows into Kafka and Delta at once (it writes the "
            "warehouse itself)",
            f"{_n(r['warehouse_whole_s'])} s = {_n(r['warehouse_rows_per_s'])} rows/s until "
            f"the warehouse held every row (Kafka every record at {r['snapshot_read_write_s']} "
            f"s); the warehouse's apply then past its records in {_n(r['warehouse_apply_s'])} s",
            "",
            "≥ 150,000 rows/s",
            _met(r["warehouse_rows_per_s"] >= 150_000),
        ]
    ]


def _stores_of(r: dict[str, Any]) -> list[str]:
    """The stores a catch-up run applied to, as its figures name them."""
    return [s for s in STORES if f"{s}_changes_per_s" in r]


def _cpu(r: dict[str, Any], stage: str) -> str:
    """ "; 1.9 cores busy (spark (JVM) 1.2, …), 150 µs CPU per change", if measured."""
    if f"{stage}_cores" not in r:
        return ""
    busy = dict(r[f"{stage}_cores"])
    machine = busy.pop("machine (all processes)")
    top = sorted(busy.items(), key=lambda kv: -kv[1])[:3]
    return (
        f"; {machine} cores busy ({', '.join(f'{k} {v}' for k, v in top)}), "
        f"{r[f'{stage}_cpu_us_per_change']} µs of CPU per change"
    )


def catchup_rows(r: dict[str, Any], which: str = "") -> list[list[str]]:
    capture = r["capture_changes_per_s"]
    rows = [
        [
            f"Catch-up{which}, "
            + (f"{_n(r['rows'])}-row table, " if "rows" in r else "")
            + f"{_n(r['changes'])} changes: capture alone",
            f"{_n(capture)} changes/s ({r['capture_s']} s){_cpu(r, 'capture')}",
            "Debezium → Kafka",
            "",
            "",
        ]
    ]
    for store in STORES:
        if f"{store}_changes_per_s" not in r:
            continue
        rate = r[f"{store}_changes_per_s"]
        rows.append(
            [
                f"… apply into {store}",
                f"{_n(rate)} changes/s ({r[f'{store}_s']} s){_cpu(r, store)}",
                "",
                f"≥ 25,000/s and ≥ capture ({_n(capture)}/s)",
                _met(rate >= 25_000 and rate >= capture),
            ]
        )
        if store != "warehouse":
            continue
        if (cpu := r.get(f"{store}_cpu_us_per_change")) is not None:
            label = "… the warehouse's CPU per change in it"
            rows.append([label, f"{cpu} µs", "", "≤ 60 µs", _met(cpu <= 60)])
        if (snapshot := r.get(f"snapshot_{store}_rows_per_s")) is not None:
            rows.append(
                [
                    f"… its snapshot of {_n(r['rows'])} rows first, into the warehouse",
                    f"{_n(snapshot)} rows/s (a process's start included)",
                    "",
                    "≥ 100,000 rows/s",
                    _met(snapshot >= 100_000),
                ]
            )
    return rows


# the latency targets per store at a pgbench rate, with all three stores running
_LIMITS = {
    50: {"cache": 2.0, "search": 2.0, "warehouse": 15.0},
    1000: {"cache": 2.0, "search": 2.0, "warehouse": 5.0},
}
# the targets of fewer stores at 50 TPS (issue 31): p99 per store, and the apply
# processes' cores
_FEWER_LIMITS = {
    ("cache",): {"cache": 1.5, "cores": 0.5},
    ("cache", "search"): {"cache": 2.0, "search": 2.0, "cores": 0.8},
}
# the processes of the apply job (its driver, Spark's JVM and its Python workers; the
# warehouse's own process and its Spark, when it runs apart)
_APPLY = (
    "apply driver (python)",
    "spark (JVM)",
    "spark (Python workers)",
    "warehouse process (python)",
    "warehouse spark (JVM)",
    "warehouse spark (Python workers)",
)


def _apply_cores(cores: dict[str, float]) -> float:
    return round(sum(cores.get(name, 0.0) for name in _APPLY), 2)


def floor_rows(floor: dict[str, Any], every: dict[str, Any] | None) -> list[list[str]]:
    """The floor query per trigger, and the apply job's CPU at 50 TPS against it."""
    rows = []
    for run in floor["runs"]:
        rows.append(
            [
                f"Floor: Kafka → foreachBatch → Redis, {floor['rate']} records/s, "
                f"trigger {run['trigger']}",
                f"p50 {run['p50_s']} s, p99 {run['p99_s']} s; "
                f"{_apply_cores(run['cores'])} cores (driver, Spark)",
                "the simplest query this machine runs",
                "",
                "",
            ]
        )
    one_second = next((r for r in floor["runs"] if r["trigger"] == "1 second"), None)
    run = next((r for r in (every or {}).get("runs", []) if r["target_tps"] == 50), None)
    if one_second and run and "cores_busy_during_load" in run:
        ours, base = _apply_cores(run["cores_busy_during_load"]), _apply_cores(one_second["cores"])
        ratio = round(ours / base, 1) if base else float("inf")
        rows.append(
            [
                "The apply job's CPU at 50 TPS (all stores)",
                f"{ours} cores (driver, Spark's JVM and Python workers)",
                f"the floor at trigger 1 s: {base} cores",
                f"≤ 1.5× the floor: {ratio}×",
                _met(ratio <= 1.5),
            ]
        )
    return rows


def idle_row(r: dict[str, Any]) -> list[str]:
    cores = _apply_cores(r["runs"]["idle"]["cores"])
    return [
        f"An idle apply job ({' + '.join(r['stores'])})",
        f"{cores} cores",
        "",
        "≤ 0.1 cores",
        _met(cores <= 0.1),
    ]


def iceberg_row(on: dict[str, Any], off: dict[str, Any]) -> list[str]:
    """What apply.iceberg costs under load: each Iceberg snapshot, and the warehouse's
    batch with it and without (the newest run of each)."""
    loaded = next(name for name in on["runs"] if name != "idle")
    figures = on["runs"][loaded]["iceberg"]

    def batch_s(r: dict[str, Any]) -> float:
        run = r["runs"][next(name for name in r["runs"] if name != "idle")]
        return float(run["stores"]["warehouse"]["mean_s_per_batch"]["whole batch"])

    return [
        f"Iceberg publication (`apply.iceberg`), {loaded}",
        f"{figures['mean_s_per_snapshot']} s wall, {figures['cpu_s_per_snapshot']} s CPU "
        f"per Iceberg snapshot ({figures['snapshots']} in {on['seconds']} s)",
        f"warehouse batch {batch_s(on):.2f} s with it, {batch_s(off):.2f} s without",
        "",
        "",
    ]


def streaming_rows(r: dict[str, Any]) -> list[list[str]]:
    rows = []
    stores = r.get("stores", list(STORES))
    alone = "" if len(stores) == len(STORES) else f" ({' + '.join(stores)} only)"
    for run in r["runs"]:
        tps = f"{run['target_tps']:,} TPS ({run['achieved_tps']} achieved){alone}"
        capture = run["capture"]
        rows.append(
            [
                f"Streaming {tps}: capture",
                f"p50 {capture['p50_s']} s, p99 {capture['p99_s']} s",
                "commit → Kafka",
                "",
                "",
            ]
        )
        if not alone:
            limits = _LIMITS.get(run["target_tps"], {})
        else:
            limits = _FEWER_LIMITS.get(tuple(stores), {}) if run["target_tps"] == 50 else {}
        for store in stores:
            f = run[store]
            limit = limits.get(store)
            target = f"p99 ≤ {limit:g} s at {run['target_tps']:,} TPS" if limit else ""
            rows.append(
                [
                    f"… {store}: commit → visible",
                    f"p50 {f['p50_s']} s, p95 {f['p95_s']} s, p99 {f['p99_s']} s; "
                    f"lag {'bounded' if f['lag_bounded'] else '**growing**'}",
                    "",
                    target,
                    _met(f["p99_s"] <= limit) if target else "",
                ]
            )
        if "cores_busy_during_load" in run and limits.get("cores"):
            apply = _apply_cores(run["cores_busy_during_load"])
            rows.append(
                [
                    "… cores of the apply process(es)",
                    f"{apply}",
                    "",
                    f"≤ {limits['cores']:g} cores at 50 TPS",
                    _met(apply <= limits["cores"]),
                ]
            )
        if "cores_busy_during_load" in run:
            busy = dict(run["cores_busy_during_load"])
            machine = busy.pop("machine (all processes)", None)
            top = sorted(busy.items(), key=lambda kv: -kv[1])[:4]
            rows.append(
                [
                    "… cores busy during the load",
                    f"{machine} of {r['machine']['cores']}: "
                    + ", ".join(f"{k} {v}" for k, v in top),
                    "",
                    "",
                    "",
                ]
            )
    return rows


def memory_row(r: dict[str, Any]) -> list[str]:
    peaks = sorted(r["peak_memory_mib"].items(), key=lambda kv: -kv[1])
    return [
        "Peak memory (PSS) while streaming",
        ", ".join(f"{k} {v:,} MiB" for k, v in peaks),
        "",
        "",
        "",
    ]


# `cdc verify` of each bench/verify.py dataset: what it holds, and its target (seconds)
VERIFY_TARGETS = {
    "demo": ("the demo's shop with its seven views", 30.0),
    "pgbench": ("pgbench's 4 tables", 45.0),
    "small": ("14 small tables", 20.0),
}


def verify_row(r: dict[str, Any]) -> list[str]:
    """One dataset's verify: the spread of its runs' totals and the slowest phases."""
    what, target = VERIFY_TARGETS[r["dataset"]]
    totals = [run["total_s"] for run in r["runs"]]
    worst = max(r["runs"], key=lambda run: run["total_s"])
    phases = ", ".join(
        f"{name} {seconds}"
        for name, seconds in sorted(worst["phases_s"].items(), key=lambda kv: -kv[1])
    )
    spread = f"{min(totals)}–{max(totals)} s" if len(totals) > 1 else f"{totals[0]} s"
    return [
        f"`cdc verify`, {what} ({_n(r['tables'])} tables, {_n(r['rows'])} rows)",
        f"{spread} over {len(totals)} runs (slowest: {phases})",
        "",
        f"≤ {target:g} s",
        _met(max(totals) <= target),
    ]


def derived_rows(r: dict[str, Any]) -> list[list[str]]:
    """The warehouse with and without the demo's seven views, and each view's latency."""
    seconds = r["seconds"]

    def latency(q: dict[str, Any]) -> str:
        return f"p50 {q['p50_s']} s, p95 {q['p95_s']} s, p99 {q['p99_s']} s"

    plain, views = r["plain"]["warehouse"], r["with_views"]["warehouse"]
    rows = [
        [
            f"Derived, {r['rate']:g} TPS: warehouse without views ({r.get('plain_s', seconds)} s)",
            latency(plain),
            "",
            "p99 ≤ 10 s",
            _met(plain["p99_s"] <= 10.0),
        ],
        [
            f"… warehouse with the demo's seven views ({seconds} s; their queries every "
            f"{r.get('views_trigger_interval_s', 5):g} s)",
            latency(views),
            "",
            "p99 ≤ 20 s",
            _met(views["p99_s"] <= 20.0),
        ],
    ]
    for name, view in r["with_views"].items():
        if not isinstance(view, dict) or not isinstance(view.get("latency"), dict):
            continue
        p99 = view["latency"]["p99_s"]
        rows.append(
            [f"… view `{name}`", latency(view["latency"]), "", "p99 ≤ 30 s", _met(p99 <= 30)]
        )
    return rows


def table() -> str:
    rows: list[list[str]] = []
    machine: dict[str, Any] = {}
    if snapshot := latest("snapshot", lambda r: "debezium_total_s" in r):
        rows += snapshot_rows(snapshot)
    if direct := latest("snapshot", lambda r: "warehouse_whole_s" in r):
        rows += direct_snapshot_rows(direct)
        machine = snapshot["machine"]
    if catchup := latest("catchup", lambda r: all(f"{s}_changes_per_s" in r for s in STORES)):
        rows += catchup_rows(catchup)
        machine = catchup["machine"]
    # a later run of the warehouse alone (`--stores warehouse`): its own rows
    alone = latest("catchup", lambda r: list(r.get("stores") or _stores_of(r)) == ["warehouse"])
    if alone and (catchup is None or alone["at"] > catchup["at"]):
        rows += catchup_rows(alone, " (the warehouse alone)")
    every = latest("streaming", lambda r: tuple(r.get("stores", STORES)) == STORES)
    if every:
        rows += streaming_rows(every)
    # the latest run of each smaller set of stores: what the others cost the ones left
    subsets = {tuple(r.get("stores", STORES)) for r in records("streaming")} - {STORES}
    for subset in sorted(subsets, key=len, reverse=True):
        if fewer := latest("streaming", lambda r, s=subset: tuple(r.get("stores", ())) == s):
            rows += streaming_rows(fewer)
    if floor := latest("floor"):
        rows += floor_rows(floor, every)
    # (a run with its idle phase: a record kept without it has only its loaded figures)
    if batch := latest(
        "batch_cost", lambda r: r.get("stores") == ["cache", "search"] and "idle" in r["runs"]
    ):
        rows.append(idle_row(batch))
    published = latest("batch_cost", lambda r: bool(r.get("iceberg")))
    alone = latest(
        "batch_cost", lambda r: r.get("stores") == ["warehouse"] and not r.get("iceberg")
    )
    if published and alone:
        rows.append(iceberg_row(published, alone))
    # the newest run of each (`bench/derived.py --only` runs one of the two)
    plain = latest("derived", lambda r: "plain" in r)
    if plain and (views := latest("derived", lambda r: "with_views" in r)):
        # each from its own run: the label says how long each ran
        rows += derived_rows({**views, "plain": plain["plain"], "plain_s": plain["seconds"]})
    for dataset in VERIFY_TARGETS:
        if checked := latest("verify", lambda r, d=dataset: r.get("dataset") == d):
            rows.append(verify_row(checked))
    if every:
        rows.append(memory_row(every))
        machine = every["machine"]
    header = ["Benchmark", "Ours", "Side by side", "Target", "Met"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    if machine:
        described = ", ".join(f"{k} {v}" for k, v in machine.items())
        lines.append("")
        lines.append(f"Measured on: {described}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", "--readme", action="store_true", help="write the table into docs/benchmarks.md"
    )
    args = parser.parse_args()
    text = table()
    print(text)
    if args.write:
        readme = PAGE.read_text()
        if BEGIN not in readme or END not in readme:
            raise SystemExit(f"{PAGE} has no {BEGIN} … {END} lines to put the table between")
        head, rest = readme.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        PAGE.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
