"""Search's floor: what indexing the catch-up's changes costs OpenSearch on this machine,
and what our writer's Python side costs per change (issue 31, deliverable 7).

    .venv/bin/python bench/search_floor.py [--rows 200000] [--changes 500000] [--profile]

Needs the local stack's OpenSearch (`cdc up`); no PostgreSQL, Kafka or Spark. Makes
the change events bench/catchup.py makes (updates of a table of --rows rows, in rounds,
--changes in all) as Debezium's JSON, in memory, and indexes them two ways into an
index of the benchmark's own, one stream of bulk requests of 5,000 each:

- **raw**: the documents our writer sends, as ready-made bulk bodies (an external
  version each): OpenSearch's own work per change;
- **writer**: cdc/apply/row_batches.py's `partition_writer` over the records as Arrow
  batches, as a Spark Python worker runs it (parsing, each key's newest per chunk, the
  documents, the store's bulk): the Python side's work per change, and OpenSearch's.

Prints, for each, changes/s of the one stream and the CPU µs per change of OpenSearch
and of this process (the writer's Python side), and what these bound a catch-up on
this machine's cores to (cores / the µs per change of Python and OpenSearch together,
Spark's JVM left out); `--profile` prints where the writer's Python time goes.
Appends the figures to bench/results/search_floor.jsonl.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ResourceSampler, record
from cdc.apply.row_batches import partition_writer
from cdc.core.catalog import Column, Table
from cdc.core.clients import opensearch_client
from cdc.core.settings import load_settings
from cdc.stores.search.store import SearchStore, index_name

OPENSEARCH = "opensearch"
PYTHON = "apply driver (python)"  # this process (bench/common.py's name for it)


def table(name: str) -> Table:
    """bench/catchup.py's table: id int PRIMARY KEY, version int, amount numeric(12, 2),
    note text, updated_at timestamptz."""

    def column(name: str, type_: str, base: str, category: str, not_null: bool) -> Column:
        return Column(name, type_, base, category, False, None, not_null)

    columns = (
        column("id", "integer", "int4", "N", True),
        column("version", "integer", "int4", "N", True),
        column("amount", "numeric(12,2)", "numeric", "N", True),
        column("note", "text", "text", "S", False),
        column("updated_at", "timestamp with time zone", "timestamptz", "D", False),
    )
    return Table("public", name, columns, ("id",), "d", 0, 0)


def records(prefix: str, name: str, rows: int, changes: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of `changes` updates as Debezium sends them, each row in turn."""
    out = []
    lsn = 100_000_000
    now_ms = int(time.time() * 1000)
    for n in range(changes):
        row = n % rows + 1
        version = n // rows + 1
        lsn += 120
        after = {
            "id": row,
            "version": version,
            "amount": f"{row * 0.01 + version:.2f}",
            "note": uuid.UUID(int=row).hex,
            "updated_at": "2026-11-26T10:00:00.123456Z",
        }
        source = {
            "version": "3.6.3.Final",
            "connector": "postgresql",
            "name": prefix,
            "ts_ms": now_ms,
            "snapshot": "false",
            "db": "cdc",
            "sequence": f'["{lsn - 120}","{lsn}"]',
            "schema": "public",
            "table": name,
            "txId": 1000 + n // 10_000,
            "lsn": lsn,
        }
        value = {"before": None, "after": after, "source": source, "op": "u", "ts_ms": now_ms}
        out.append((orjson.dumps({"id": row}), orjson.dumps(value)))
    return out


def arrow_batches(qualified: str, topic: str, found: list[tuple[bytes, bytes]]) -> list[Any]:
    """The records as the Spark Kafka source hands them to a Python worker."""
    import pyarrow as pa

    batches = []
    for at in range(0, len(found), 10_000):
        part = found[at : at + 10_000]
        batches.append(
            pa.RecordBatch.from_pydict(
                {
                    "table": [qualified] * len(part),
                    "topic": [topic] * len(part),
                    "partition": pa.array([0] * len(part), pa.int32()),
                    "offset": list(range(at, at + len(part))),
                    "key": [k.decode() for k, _ in part],
                    "value": [v.decode() for _, v in part],
                }
            )
        )
    return batches


def measure(resources: ResourceSampler, changes: int, work: Any) -> dict[str, Any]:
    mark = resources.cpu()
    work()
    done = resources.cpu()
    seconds = done.at - mark.at
    cores = done.cores_since(mark)
    us = {
        who: round(cores.get(who, 0.0) * seconds / changes * 1e6, 1) for who in (OPENSEARCH, PYTHON)
    }
    together = us[OPENSEARCH] + us[PYTHON]
    return {
        "s": round(seconds, 1),
        "changes_per_s": round(changes / seconds),
        "cpu_us_per_change": us,
        "bound_changes_per_s": round((os.cpu_count() or 1) / (together / 1e6))
        if together
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=500_000)
    parser.add_argument("--profile", action="store_true", help="where the writer's time goes")
    parser.add_argument("--writer-only", action="store_true", help="measure the writer alone")
    parser.add_argument("--change", help="what this run measures (recorded with it)")
    args = parser.parse_args()
    settings = load_settings()
    prefix = "bench" + uuid.uuid4().hex[:6]
    info = table(prefix)
    store = SearchStore(settings.opensearch, prefix, settings.apply.store_retry_s)
    client = opensearch_client(settings.opensearch, 120)
    index = index_name(prefix, info.qualified)
    topic = f"{prefix}.{info.qualified}"
    print(f"making {args.changes:,} change events of {args.rows:,} rows ...", flush=True)
    found = records(prefix, info.name, args.rows, args.changes)
    figures: dict[str, Any] = {
        **({"change": args.change} if args.change else {}),
        "benchmark": "search_floor",
        "rows": args.rows,
        "changes": args.changes,
    }
    try:
        with ResourceSampler() as resources:
            # raw: the writer's own documents, as bulk bodies made before the clock starts
            store.ensure_index(info)
            if not args.writer_only:
                bodies = raw_bodies(store, info, found)
                print("raw: ready-made bulk bodies ...", flush=True)

                def send() -> None:
                    for body in bodies:
                        answer = client.bulk(body=body)
                        if answer.get("errors"):
                            item = answer["items"][0]
                            raise SystemExit(f"OpenSearch refused a document: {item}")

                figures["raw"] = measure(resources, args.changes, send)
                print(f"raw: {figures['raw']}", flush=True)
                store.reset(info)
            batches = arrow_batches(info.qualified, topic, found)
            print("writer: partition_writer over Arrow batches ...", flush=True)
            tables = {info.qualified: info}
            run = partition_writer(
                lambda: store, tables, lambda t: topic, "cdc.truncations", {}, close=False
            )
            profiler = cProfile.Profile() if args.profile else None

            def write() -> None:
                if profiler is not None:
                    profiler.enable()
                list(run(iter(batches)))
                if profiler is not None:
                    profiler.disable()

            figures["writer"] = measure(resources, args.changes, write)
            print(f"writer: {figures['writer']}", flush=True)
            if profiler is not None:
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
                print(text.getvalue())
    finally:
        client.indices.delete(index=index, ignore_unavailable=True)
        store.close()
    record(figures, "search_floor", settings)


def raw_bodies(store: SearchStore, info: Table, found: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The bulk bodies of the writer's own documents, as its `_send` makes them:
    captured instead of posted."""
    bodies: list[bytes] = []

    def capture(lines: list[bytes], sent: list[dict[str, Any]]) -> Any:
        bodies.append(b"\n".join(lines) + b"\n")
        return iter(())

    store._post = capture  # type: ignore[method-assign]
    try:
        run = partition_writer(
            lambda: store, {info.qualified: info}, lambda t: "", "cdc.truncations", {}, close=False
        )
        list(run(iter(arrow_batches(info.qualified, "", found))))
    finally:
        del store._post
    return bodies


if __name__ == "__main__":
    main()
