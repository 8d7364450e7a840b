"""One-line mutants of the guards that keep the stores exact, each run against the tests
meant to kill it (`make mutants`).

Each mutant replaces one line's text in one file; the tests named for it must then fail.
The integration tests of every mutant share one stack (started here, stopped at the
end). Prints a line per mutant and appends the result to bench/results/mutants.jsonl.
Exit 1 if a mutant survives.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import stack_env
from tests.helpers import ROOT, run_cdc

EXACT = "tests/integration/test_exactness.py"
HISTORY = "tests/integration/test_warehouse_history.py"
REWOUND = "tests/integration/test_rewound.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(
        "cache guard takes an older change (an older transaction, or an earlier change of it)",
        "cdc/log/position.py",
        "    if h ~= position[f] then return h < position[f] end",
        "    if h ~= position[f] then return true end",
        (f"{EXACT}::test_redelivered_and_older_changes_change_nothing",),
    ),
    Mutant(
        "warehouse MERGE guard takes anything",
        "cdc/log/position.py",
        '    terms = [f"{held[0]} IS NULL"]',
        '    terms = ["true"]',
        (
            f"{EXACT}::test_redelivered_and_older_changes_change_nothing",
            "tests/unit/log/test_write_rule.py",
        ),
    ),
    Mutant(
        "history identifies a version by its offset",
        "cdc/stores/warehouse/store.py",
        'changes = changes.dropDuplicates(["_cdc_key", "_cdc_commit_lsn", "_cdc_lsn"])',
        'changes = changes.dropDuplicates(["_cdc_key", "_cdc_offset"])',
        (f"{HISTORY}::test_a_batch_of_redelivered_and_new_changes_leaves_one_open_version",),
    ),
    Mutant(
        "history takes a change again after a restart",
        "cdc/stores/warehouse/write/_marks.py",
        '            if part["first_offset"] <= offset:',
        "            if False:",
        (f"{HISTORY}::test_a_crash_between_the_history_and_the_current_state_is_made_good",),
    ),
    Mutant(
        "history ends a version only at a TRUNCATE",
        "cdc/stores/warehouse/history.py",
        "  LEAST(LEAD(valid_from) OVER ({by_key}), _cdc_cap) AS valid_to, _cdc_commit_lsn",
        "  _cdc_cap AS valid_to, _cdc_commit_lsn",
        (
            f"{HISTORY}::test_a_batch_is_one_append_to_the_history_and_one_commit_to_the_current_state",
        ),
    ),
    Mutant(
        "a deleted key takes a write older than its delete",
        "cdc/stores/warehouse/store.py",
        "            latest = held.where(~held_since(inclusive=False))",
        "            latest = held",
        (f"{HISTORY}::test_a_write_older_than_a_deleted_keys_delete_is_refused_after_a_restart",),
    ),
    Mutant(
        "apply reads a change topic created again as if nothing happened",
        "cdc/apply/batch.py",
        "        behind = self.ends.check_not_rewound(name, topics, progress)",
        "        behind = 0",
        (f"{REWOUND}::test_a_change_topic_deleted_and_created_again_stops_the_apply",),
    ),
    Mutant(
        "apply writes to a store ahead of the source",
        "cdc/apply/batch.py",
        "        check_source_not_rewound(name, wal, progress)",
        "        pass",
        (f"{REWOUND}::test_a_source_behind_what_a_store_applied_stops_the_apply",),
    ),
    Mutant(
        "search versions by Kafka offset",
        "cdc/stores/search/store.py",
        '"version": search_version(event.position),',
        '"version": event.offset,',
        (f"{EXACT}::test_redelivered_and_older_changes_change_nothing",),
    ),
    Mutant(
        "a chunk keeps the last record, not the newest change",
        "cdc/log/position.py",
        "    return seen is None or position > seen",
        "    return True",
        ("tests/unit/apply/test_row_batches.py", "tests/unit/log/test_write_rule.py"),
    ),
    Mutant(
        "the write rule takes an equal or older position",
        "cdc/log/position.py",
        "return stored is None or position > stored.position",
        "return True",
        ("tests/unit/log/test_write_rule.py",),
    ),
    Mutant(
        "snapshot readers do not read under the exported snapshot",
        "cdc/capture/snapshot/table_copy.py",
        "f\"SET TRANSACTION SNAPSHOT '{point.snapshot_name}'; SET intervalstyle = 'iso_8601'\"",
        "\"SET intervalstyle = 'iso_8601'\"",
        ("tests/integration/test_snapshot.py",),
    ),
    Mutant(
        "the cache writes Debezium's TOAST placeholder",
        "cdc/stores/cache/store.py",
        "if raw == UNAVAILABLE:",
        "if False:",
        (f"{EXACT}::test_a_stored_toasted_value_is_kept_across_batches",),
    ),
    Mutant(
        "search writes Debezium's TOAST placeholder",
        "cdc/stores/search/store.py",
        "if raw == UNAVAILABLE:",
        "if False:",
        (f"{EXACT}::test_a_stored_toasted_value_is_kept_across_batches",),
    ),
    Mutant(
        "the warehouse writes Debezium's TOAST placeholder",
        "cdc/stores/warehouse/write/_merge.py",
        'updated[c] = f"CASE WHEN {flag} THEN t.{quote(c)} ELSE s.{quote(c)} END"',
        'updated[c] = f"CASE WHEN false THEN t.{quote(c)} ELSE s.{quote(c)} END"',
        (f"{EXACT}::test_a_stored_toasted_value_is_kept_across_batches",),
    ),
    Mutant(
        "the cache writes a delete as a row",
        "cdc/stores/cache/store.py",
        "    if op == 'd' then",
        "    if op == 'x' then",
        (f"{EXACT}::test_redelivered_and_older_changes_change_nothing",),
    ),
    Mutant(
        "search writes a delete as a document",
        "cdc/stores/search/store.py",
        'if event.op == "d" or event.after is None:',
        "if False:",
        (f"{EXACT}::test_redelivered_and_older_changes_change_nothing",),
    ),
    Mutant(
        "the warehouse keeps a deleted row live",
        "cdc/stores/warehouse/write/_merge.py",
        '("delete", f"s._cdc_commit_lsn IS NOT NULL AND s._cdc_op = \'d\' AND {_OLDER}", None)',
        '("delete", f"s._cdc_commit_lsn IS NOT NULL AND s._cdc_op = \'x\' AND {_OLDER}", None)',
        (f"{EXACT}::test_redelivered_and_older_changes_change_nothing",),
    ),
    Mutant(
        "verify trusts equal row counts",
        "cdc/check/verify.py",
        "    if mine == theirs:",
        "    if len(mine) == len(theirs):",
        ("tests/integration/test_verify.py",),
    ),
)


def run(mutant: Mutant, env_file: Path) -> tuple[bool, float]:
    """Apply the mutant, run its tests, restore the file. Returns (killed, seconds)."""
    path = ROOT / mutant.path
    original = path.read_text()
    if original.count(mutant.before) != 1:
        raise SystemExit(f"mutant '{mutant.name}': the line is not in {mutant.path} exactly once")
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutant.before, mutant.after))
        result = _pytest(list(mutant.tests), env_file)
    finally:
        path.write_text(original)
    return result.returncode != 0, time.monotonic() - started


def _pytest(tests: list[str], env_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env={**_clean_env(), "CDC_TEST_STACK": str(env_file)},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", action="append", help="run the mutants whose name contains this (repeat)"
    )
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or any(o in m.name for o in args.only)]
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-mutants-"))
    data_dir.chmod(0o755)
    env = stack_env(data_dir)
    env_file = data_dir / "stack.json"
    env_file.write_text(json.dumps(env))
    results = []
    try:
        up = run_cdc("up", env=env)
        if up.returncode != 0:
            raise SystemExit(f"`cdc up` failed: {up.stderr.strip()}")
        # the tests must pass as they are, or a failure says nothing of a mutant
        baseline = sorted({t for m in chosen for t in m.tests})
        clean = _pytest(baseline, env_file)
        if clean.returncode != 0:
            print(clean.stdout[-3000:])
            raise SystemExit("the tests fail without any mutant: fix them first")
        print(f"baseline: {len(baseline)} test selections pass", flush=True)
        for mutant in chosen:
            killed, seconds = run(mutant, env_file)
            results.append({"mutant": mutant.name, "killed": killed, "seconds": round(seconds)})
            print(
                f"{'killed  ' if killed else 'SURVIVED'} {mutant.name} ({seconds:.0f} s)",
                flush=True,
            )
    finally:
        run_cdc("down", "--purge", "--yes", env=env)
        shutil.rmtree(data_dir, ignore_errors=True)
    survived = [r["mutant"] for r in results if not r["killed"]]
    print(f"{len(results) - len(survived)} of {len(results)} mutants killed")
    out = ROOT / "bench" / "results" / "mutants.jsonl"
    line = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}
    with out.open("a") as f:
        f.write(json.dumps(line) + "\n")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
