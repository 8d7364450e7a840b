"""One chaos run: a stack of its own, the bank's load, faults one at a time at random
moments (seeded), then every store compared with PostgreSQL by the harness's readers.

    python -m tests.chaos.run --minutes 12 --rounds 3        # the long form (make chaos)
    python -m tests.chaos.run --short                          # what tests/chaos runs

Prints its figures at the end (transactions, faults per kind, dead letters, rows
compared per store, differences) and, with --results, appends them as one JSON line.
Exit status 1 when a store differs from the source or a dead letter was written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cdc.stores.warehouse.tables import current_path, warehouse_root
from tests.chaos.compare import HistoryReport, TableDiff, balance, check_history, diff_rows
from tests.chaos.faults import FaultKind, FaultRecord, inject, plan
from tests.chaos.load import ACCOUNTS, EVENTS, SHELVES, TRANSFERS, Load, create_bank
from tests.chaos.readers import (
    TABLES,
    DeadLetters,
    Rows,
    WarehouseReader,
    cache_rows,
    dead_letters,
    search_rows,
    source_rows,
)
from tests.chaos.stack import ChaosError, ChaosStack
from tests.other_writer import OtherWriter
from tests.stores import opensearch_http

__all__ = ["LONG", "SHORT", "ChaosOptions", "ChaosReport", "main", "run_chaos"]

RESULTS = Path(__file__).resolve().parent.parent.parent / "bench" / "results" / "chaos.jsonl"
STORES = ("cache", "search", "warehouse")
OPENING_BALANCE = 1000


@dataclass(frozen=True)
class ChaosOptions:
    form: str = "long"
    minutes: float = 12.0  # the load runs at least this long (and until the last fault)
    rate: float = 40.0  # transactions per second, all workers together
    seed: int | None = None
    faults: tuple[FaultKind, ...] = tuple(FaultKind)
    rounds: int = 3  # each fault kind this many times
    stop_s: float = 60.0  # how long SIGSTOP freezes a store
    gap_s: tuple[float, float] = (10.0, 40.0)  # quiet time before each fault, drawn at random
    accounts: int = 1000
    workers: int = 2
    catch_up_s: float = 1200.0  # how long the stores get to equal the source after the load
    results: Path | None = None


# What runs in the test suite (<= 8 minutes on a 2-core machine): the faults that fit.
SHORT = ChaosOptions(
    form="short",
    minutes=0.0,
    rate=30.0,
    faults=(
        FaultKind.APPLY_KILL,
        FaultKind.CONNECT_KILL,
        FaultKind.REDIS_KILL,
        FaultKind.OPENSEARCH_STOP,
        FaultKind.POSTGRES_RESTART,
        FaultKind.KAFKA_KILL,
        FaultKind.BACKFILL,
        FaultKind.RENAME,
        FaultKind.SWAP,
        FaultKind.PARTITION,
    ),
    rounds=1,
    gap_s=(3.0, 8.0),
    catch_up_s=600.0,
)
LONG = ChaosOptions()


@dataclass
class ChaosReport:
    options: ChaosOptions
    seed: int
    load: dict[str, int] = field(default_factory=dict)
    faults: list[FaultRecord] = field(default_factory=list)
    unplanned: list[str] = field(default_factory=list)  # recoveries no fault asked for
    dead: DeadLetters = field(default_factory=lambda: DeadLetters(0, {}, []))
    diffs: list[TableDiff] = field(default_factory=list)
    balances: dict[str, int | None] = field(default_factory=dict)
    expected_balance: int = 0
    history: list[HistoryReport] = field(default_factory=list)
    behind: list[str] = field(default_factory=list)  # stores not equal when time was up
    caught_up_s: float | None = None  # from the load's end until every store equalled
    load_s: float = 0.0
    elapsed_s: float = 0.0
    # another engine's writes of the warehouse's tables under the load, per kind
    other_writes: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    logs: str | None = None  # where the logs were kept (a failed run, or unplanned recoveries)

    @property
    def differences(self) -> int:
        wrong_balance = sum(1 for b in self.balances.values() if b != self.expected_balance)
        return (
            sum(d.count for d in self.diffs) + wrong_balance + sum(h.problems for h in self.history)
        )

    @property
    def passed(self) -> bool:
        return self.error is None and self.differences == 0 and self.dead.count == 0

    def figures(self) -> dict[str, Any]:
        per_store: dict[str, int] = Counter()
        differences: dict[str, int] = Counter()
        for d in self.diffs:
            per_store[d.store] += d.source_rows
            differences[d.store] += d.count
        for store, total in self.balances.items():
            differences[store] += int(total != self.expected_balance)
        for h in self.history:
            per_store["warehouse history versions"] += h.versions
            differences["warehouse history"] += h.problems
        return {
            "form": self.options.form,
            "seed": self.seed,
            "passed": self.passed,
            "error": self.error,
            "rate_tps": self.options.rate,
            "load_s": round(self.load_s, 1),
            "elapsed_s": round(self.elapsed_s, 1),
            "caught_up_s": None if self.caught_up_s is None else round(self.caught_up_s, 1),
            "not_caught_up": self.behind,
            **self.load,
            "faults": dict(Counter(str(f.kind) for f in self.faults)),
            "other_writes": self.other_writes,
            "fault_log": [f.as_dict() for f in self.faults],
            "unplanned_recoveries": self.unplanned,
            "logs": self.logs,
            "dead_letters": self.dead.count,
            "dead_letter_kinds": self.dead.kinds,
            "rows_compared": dict(per_store),
            "balance_expected": self.expected_balance,
            "balances": self.balances,
            "differences": dict(differences),
            "differences_total": self.differences,
            "machine": _machine(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def describe_differences(self) -> str:
        lines = [
            f"{store} was still not equal to the source {self.options.catch_up_s:.0f} s after "
            "the load stopped (behind, or diverged: the rows below say how)"
            for store in self.behind
        ]
        lines += [d.describe() for d in self.diffs if d.count]
        lines += [
            f"{store}: sum of balances {total}, expected {self.expected_balance}"
            for store, total in self.balances.items()
            if total != self.expected_balance
        ]
        lines += [h.describe() for h in self.history if h.problems]
        if self.dead.count:
            lines.append(f"dead letters: {self.dead.count} {self.dead.kinds} {self.dead.examples}")
        if self.error:
            lines.append(f"error: {self.error}")
        if lines:
            faults = ", ".join(f"{f.kind}@{f.at_s:.0f}s" for f in self.faults)
            lines.append(f"faults before (load-relative times): {faults}")
        return "\n".join(lines)

    def summary(self) -> str:
        f = self.figures()
        lines = [
            f"chaos ({f['form']}) seed {self.seed}: {'PASSED' if self.passed else 'FAILED'} "
            f"in {f['elapsed_s']} s (load {f['load_s']} s, stores caught up "
            f"{f['caught_up_s']} s after it)",
            f"  transactions {f['transactions']} ({f['transfers']} transfers, "
            f"{f['accounts_opened']} accounts opened, {f['accounts_closed']} closed; "
            f"{f['ambiguous_commits']} ambiguous commits, {f['errors']} failed statements)",
            f"  faults {f['faults']}",
            f"  another engine's writes of the warehouse {f['other_writes']}",
            f"  dead letters {f['dead_letters']} {f['dead_letter_kinds'] or ''}",
            f"  rows compared {f['rows_compared']}",
            f"  balances {f['balances']} (expected {f['balance_expected']})",
            f"  differences {f['differences']} (total {f['differences_total']})",
        ]
        lines += [f"  unplanned: {u}" for u in self.unplanned]
        details = self.describe_differences()
        if details:
            lines.append(details)
        return "\n".join(lines)


def _machine() -> dict[str, Any]:
    memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    return {"cores": os.cpu_count(), "memory_gib": memory, "python": platform.python_version()}


class _Run:
    """One run: its stack, load, readers and report; says what it does as it goes."""

    def __init__(self, options: ChaosOptions) -> None:
        self.options = options
        seed = options.seed if options.seed is not None else random.randrange(1, 2**31)
        self.rng = random.Random(seed)
        self.report = ChaosReport(options, seed)
        self.began = time.monotonic()
        self.load_began = self.began
        # the partitioned log with a FULL identity: a partition added under the load takes
        # it from its root, or the load's UPDATEs of its rows fail (review F3)
        self.stack = ChaosStack([ACCOUNTS, TRANSFERS, *SHELVES, EVENTS], identity={EVENTS: "full"})
        self.load: Load | None = None
        self.other: OtherWriter | None = None
        self.reader: WarehouseReader | None = None

    def say(self, message: str) -> None:
        print(f"[chaos {time.monotonic() - self.began:6.1f}s] {message}", flush=True)

    def __call__(self) -> ChaosReport:
        options, report, stack = self.options, self.report, self.stack
        self.say(f"seed {report.seed} (rerun with --seed {report.seed}); form {options.form}")
        try:
            self.say(f"cdc up in {stack.data_dir}")
            stack.up()
            dsn = stack.settings.postgres.dsn()
            report.expected_balance = create_bank(dsn, options.accounts, OPENING_BALANCE)
            result = stack.cdc("snapshot")
            if result.returncode != 0:
                raise ChaosError(f"`cdc snapshot` failed: {result.stderr.strip()[-800:]}")
            self.say("snapshot taken, connector streaming; starting cdc apply")
            stack.start_apply()
            self.wait_first_batches()
            # the readers' Spark session starts now, not on the way to the verdict
            self.reader = WarehouseReader(stack.settings)
            self.say(f"starting the load: {options.rate:g} transactions/s")
            self.load = Load(dsn, options.accounts, options.rate, report.seed, options.workers)
            self.load.start()
            # another engine on the warehouse's tables meanwhile (docs/stores.md)
            root = warehouse_root(stack.settings)
            self.other = OtherWriter(
                [(current_path(root, ACCOUNTS), "aid"), (current_path(root, TRANSFERS), "tid")],
                pause=1.0,
            )
            self.other.start()
            self.load_began = time.monotonic()
            self.faults()
            self.load.stop()
            self.stop_other()
            report.load_s = time.monotonic() - self.load_began
            report.load = self.load.stats.figures()
            self.say(f"load stopped: {report.load}")
            self.catch_up_and_compare(self.reader)
            report.dead = dead_letters(stack.settings.kafka, f"{stack.prefix}.dlq")
        except ChaosError as exc:
            report.error = str(exc)
            self.say(f"harness stopped: {exc}")
        finally:
            self.finish()
        print(report.summary(), flush=True)
        if options.results is not None:
            options.results.parent.mkdir(parents=True, exist_ok=True)
            with options.results.open("a") as out:
                out.write(json.dumps(report.figures()) + "\n")
        return report

    def stop_other(self) -> None:
        """Stop the other writer; what ended it early is the run's error."""
        if self.other is None:
            return
        self.other.stop()
        self.report.other_writes = dict(self.other.done)
        if self.other.error is not None:
            raise ChaosError(f"the other writer of the warehouse failed: {self.other.error!r}")

    def finish(self) -> None:
        report = self.report
        if self.other is not None and self.other.is_alive():
            self.other.stop()
        if self.load is not None:
            self.load.stop()
            report.load = report.load or self.load.stats.figures()
        if self.reader is not None:
            self.reader.close()
        if not report.passed or report.unplanned:
            kept = self.stack.keep_logs(
                Path(tempfile.gettempdir()) / f"cdc-chaos-logs-{report.seed}"
            )
            report.logs = str(kept)
            self.say(f"logs kept in {kept}")
        self.say("cdc down --purge --yes")
        self.stack.down()
        report.elapsed_s = time.monotonic() - self.began

    def wait_first_batches(self) -> None:
        """Until `cdc status` shows a finished batch of every store (the snapshot's rows; on
        a 2-core machine the warehouse's first MERGEs take minutes); the load starts after."""
        deadline = time.monotonic() + 900
        while True:
            self.watch_apply()
            stores = (self.stack.status().get("pipeline") or {}).get("stores") or {}
            done = [s for s in STORES if (stores.get(s) or {}).get("applied_at_ms")]
            if len(done) == len(STORES):
                self.say(f"every store has applied a batch: {stores}")
                return
            if time.monotonic() > deadline:
                raise ChaosError(f"not every store applied a batch in 900 s: {stores}")
            time.sleep(10)  # each `cdc status` costs a Python start on a busy machine

    def faults(self) -> None:
        options = self.options
        assert self.load is not None
        for kind in plan(list(options.faults), options.rounds, self.rng):
            self.quiet(self.rng.uniform(*options.gap_s))
            self.say(f"fault {kind}")
            at_s = time.monotonic() - self.load_began
            record = inject(self.stack, kind, at_s, options.stop_s, self.load)
            self.report.faults.append(record)
            notes = f" ({'; '.join(record.notes)})" if record.notes else ""
            self.say(f"  recovered in {record.recovery_s:.1f} s{notes}")
            if self.load.failure is not None:
                raise ChaosError(f"the load failed: {self.load.failure!r}")
        self.quiet(max(options.minutes * 60 - (time.monotonic() - self.load_began), 10.0))

    def watch_apply(self) -> None:
        ended = self.stack.restart_apply_if_ended()
        if ended:
            faults = self.report.faults
            after = f"{faults[-1].kind} at {faults[-1].at_s:.0f} s" if faults else "no fault"
            now = time.monotonic() - self.load_began
            self.report.unplanned.append(f"at {now:.0f} s (last fault: {after}): {ended}")
            self.say(ended)

    def quiet(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.watch_apply()
            time.sleep(min(2.0, max(deadline - time.monotonic(), 0)))

    def read_store(self, store: str, reader: WarehouseReader) -> dict[str, Rows]:
        settings, prefix = self.stack.settings, self.stack.prefix
        out = {}
        for spec in TABLES:
            if store == "cache":
                out[spec.qualified] = cache_rows(settings.redis.url, prefix, spec)
            elif store == "search":
                out[spec.qualified] = search_rows(
                    settings.opensearch.url, prefix, spec, **opensearch_http(settings)
                )
            else:
                out[spec.qualified] = reader.rows(spec)
        return out

    def catch_up_and_compare(self, reader: WarehouseReader) -> None:
        """Poll every store until it equals the source (or the time is up); report the last
        reading, then check the warehouse's history against its current state."""
        report = self.report
        source = {
            spec.qualified: source_rows(self.stack.settings.postgres.dsn(), spec) for spec in TABLES
        }
        self.say(
            "source: "
            + ", ".join(f"{t} {len(rows)} rows" for t, rows in source.items())
            + f"; sum of balances {balance(source[ACCOUNTS])}"
        )
        report.balances["postgres"] = balance(source[ACCOUNTS])
        began = time.monotonic()
        deadline = began + self.options.catch_up_s
        pending = list(STORES)
        last: dict[str, list[TableDiff]] = {}
        read_error: dict[str, str] = {}
        stamp: tuple[str, ...] | None = None
        while True:
            self.watch_apply()
            for store in list(pending):
                if store == "warehouse":
                    if reader.stamp() == stamp:
                        continue  # no commit since the last reading
                    stamp = reader.stamp()
                try:
                    rows = self.read_store(store, reader)
                except Exception as exc:  # not there yet, or not answering yet
                    read_error[store] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    stamp = None if store == "warehouse" else stamp
                    continue
                read_error.pop(store, None)
                last[store] = [
                    diff_rows(store, s, source[s.qualified], rows[s.qualified]) for s in TABLES
                ]
                report.balances[store] = balance(rows[ACCOUNTS])
                if not any(d.count for d in last[store]):
                    pending.remove(store)
                    self.say(f"{store} equals the source")
            if not pending:
                report.caught_up_s = time.monotonic() - began
                break
            if time.monotonic() > deadline:
                report.behind = pending
                self.say(
                    f"not equal to the source {self.options.catch_up_s:.0f} s after: {pending}"
                )
                break
            behind = {s: sum(d.count for d in last.get(s, [])) for s in pending}
            self.say(f"waiting for {behind} {read_error or ''}")
            time.sleep(5)
        for store in STORES:
            if store in last:
                report.diffs += last[store]
            else:
                report.error = report.error or f"{store} could not be read: {read_error.get(store)}"
                report.balances[store] = None
        for spec in TABLES:
            position, versions = reader.history(spec)
            checked = check_history(spec.qualified, position, versions, reader.current(spec))
            report.history.append(checked)
            self.say(
                f"history {spec.qualified}: {checked.versions} versions, "
                f"{checked.problems} problems"
            )


def run_chaos(options: ChaosOptions) -> ChaosReport:
    return _Run(options)()


def _options(argv: list[str] | None) -> ChaosOptions:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--short", action="store_true", help="the test suite's short form")
    parser.add_argument("--minutes", type=float, help="run the load at least this long")
    parser.add_argument("--rate", type=float, help="transactions per second")
    parser.add_argument("--seed", type=int, help="replay a run: its fault order and gaps")
    parser.add_argument(
        "--faults",
        help="comma-separated kinds (default: all): " + ", ".join(k.value for k in FaultKind),
    )
    parser.add_argument("--rounds", type=int, help="each fault kind this many times")
    parser.add_argument("--stop-seconds", type=float, help="how long SIGSTOP freezes a store")
    parser.add_argument("--gap", type=float, nargs=2, metavar=("MIN", "MAX"), help="seconds")
    parser.add_argument("--accounts", type=int, help="accounts opened before the snapshot")
    parser.add_argument("--catch-up", type=float, help="seconds the stores get after the load")
    parser.add_argument("--results", type=Path, help=f"append the figures here (e.g. {RESULTS})")
    args = parser.parse_args(argv)
    base = SHORT if args.short else LONG
    given: dict[str, Any] = {
        "minutes": args.minutes,
        "rate": args.rate,
        "seed": args.seed,
        "rounds": args.rounds,
        "stop_s": args.stop_seconds,
        "gap_s": tuple(args.gap) if args.gap else None,
        "accounts": args.accounts,
        "catch_up_s": args.catch_up,
        "results": args.results,
    }
    if args.faults:
        given["faults"] = tuple(FaultKind(k.strip()) for k in args.faults.split(","))
    return replace(base, **{k: v for k, v in given.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    report = run_chaos(_options(argv))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
