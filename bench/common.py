"""What every benchmark shares: the machine's description, the results files, a
pipeline of its own, and the memory and CPU of each component sampled while it runs."""

from __future__ import annotations

import json
import os
import platform
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from cdc.core.settings import Settings
from cdc.core.settings.pipeline import PipelineSettings
from cdc.stores.warehouse.settings import warehouse_settings

__all__ = [
    "CpuMark",
    "ResourceSampler",
    "bench_settings",
    "cleanup",
    "machine",
    "record",
    "trigger_durations",
]

RESULTS = Path(__file__).parent / "results"


def machine(settings: Settings | None = None) -> dict[str, object]:
    """Cores, memory and the versions of what runs (the stack's, when it answers)."""
    import pyspark

    memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    described: dict[str, object] = {
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
    }
    if settings is not None:
        from cdc.stack import Stack

        for status in Stack(settings).status():
            if status.version:
                described[status.name] = status.version
    return described


def record(figures: dict[str, object], name: str, settings: Settings | None = None) -> None:
    """Print the figures with the machine and the time; append them to results/<name>.jsonl."""
    figures = figures | {
        "machine": machine(settings),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(figures, indent=2))
    path = RESULTS / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(figures) + "\n")


def trigger_durations(query: Any, since: float = 0.0, skip: int = 0) -> dict[str, float]:
    """Spark's own breakdown of a streaming query's triggers that ran a batch (its
    progress reports' durationMs: latestOffset, getBatch, queryPlanning, addBatch,
    walCommit, commitOffsets, triggerExecution): the mean milliseconds per trigger, of
    the reports from `since` (epoch seconds) on, the first `skip` of them left out."""
    from datetime import datetime

    reports = []
    for report in query.recentProgress:
        report = report if isinstance(report, dict) else json.loads(report.json)
        at = datetime.fromisoformat(report["timestamp"].replace("Z", "+00:00")).timestamp()
        if report["numInputRows"] and at >= since:
            reports.append(report)
    reports = reports[skip:]
    totals: dict[str, float] = {}
    for report in reports:
        for key, ms in report["durationMs"].items():
            totals[key] = totals.get(key, 0.0) + ms
    means = {k: round(v / len(reports), 1) for k, v in sorted(totals.items())}
    return {"triggers": len(reports), **means}


def bench_settings(settings: Settings, tables: list[str], **pipeline: object) -> Settings:
    """The settings with a pipeline of the benchmark's own (random name) over `tables`,
    its warehouse in a directory of its own (no join views or windows)."""
    name = "bench" + uuid.uuid4().hex[:6]
    warehouse = settings.data_dir / "bench" / name / "warehouse"
    return settings.model_copy(
        update={
            "pipeline": PipelineSettings(name=name, topic_prefix=name, tables=tables, **pipeline),  # type: ignore[arg-type]
            "apply": settings.apply.model_copy(update={"joins": [], "windows": []}),
            "stores": {
                **settings.stores,
                "warehouse": warehouse_settings(settings).model_copy(
                    update={"path": str(warehouse)}
                ),
            },
        }
    )


DRIVER = "apply driver (python)"  # this process, less the sampler's and workload's time
# (component, what its command line holds) for the JVMs and Spark's Python workers
_JAVA = [
    ("spark (JVM)", "org.apache.spark.deploy.SparkSubmit"),
    ("spark (executors)", "org.apache.spark.executor.CoarseGrainedExecutorBackend"),
    ("spark (Python workers)", "pyspark.daemon"),
    ("spark (Python workers)", "pyspark.worker"),
    ("kafka", "kafka.Kafka "),
    ("connect", "ConnectDistributed"),
    ("opensearch", "org.opensearch.bootstrap.OpenSearch"),
]
_PROGRAMS = {"postgres": "postgres", "redis-server": "redis", "pgbench": "pgbench"}


WAREHOUSE_PROCESS = "cdc.apply.own_process_main"  # the warehouse's own apply process


def _component(pid: str) -> str | None:
    if int(pid) == os.getpid():
        return DRIVER
    try:
        program = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if program in _PROGRAMS:
        return _PROGRAMS[program]
    if WAREHOUSE_PROCESS in cmdline:
        return "warehouse process (python)"
    name = next((name for name, marker in _JAVA if marker in cmdline), None)
    if name and name.startswith("spark") and _parent_runs(pid, WAREHOUSE_PROCESS):
        return f"warehouse {name}"  # the Spark of the warehouse's own process
    return name


def _parent_runs(pid: str, marker: str) -> bool:
    """Whether a process's parent (or its parent's parent) has `marker` in its command."""
    for _ in range(2):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = stat[stat.rindex(")") + 2 :].split()[1]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            return False
        if marker in cmdline:
            return True
    return False


def _pss_kib(pid: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class ResourceSampler:
    """Samples, every `interval` seconds, each component's processes: the proportional
    set size (PSS: shared pages counted once across processes), keeping the peak of
    their sum per component, and the CPU time they have used. Spark's JVM and its
    Python workers (which write cache and search) count apart; this process (which
    runs the apply job's driver) is `apply driver`, less the CPU time of its sampling
    thread and of any workload the benchmark runs in it (`exclude`)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.peak_mib: dict[str, int] = {}
        self._ticks: dict[str, tuple[str, int]] = {}  # pid -> (component, CPU ticks)
        self._foreign_s = 0.0  # this process's CPU seconds that are not the driver's
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ResourceSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def exclude(self, cpu_s: float) -> None:
        """CPU seconds this process spent on the benchmark's own work (a workload it ran
        in a thread of its own): not the apply driver's."""
        with self._lock:
            self._foreign_s += cpu_s

    def sample(self) -> dict[str, int]:
        started = time.thread_time()
        try:
            return self._sample()
        finally:  # reading every process's smaps is the driver's busiest thread at rest
            self.exclude(time.thread_time() - started)

    def _sample(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (component := _component(entry.name)):
                totals[component] = totals.get(component, 0) + _pss_kib(entry.name)
                ticks = _cpu_ticks(entry.name)
                if ticks is not None:
                    with self._lock:
                        self._ticks[entry.name] = (component, ticks)
        return {name: kib // 1024 for name, kib in totals.items()}

    def cpu(self) -> CpuMark:
        """CPU seconds used so far per component (a process that ended counts what it
        had used when last sampled), and the whole machine's busy seconds."""
        self.sample()
        per: dict[str, float] = {}
        with self._lock:
            for component, ticks in self._ticks.values():
                per[component] = per.get(component, 0.0) + ticks / _HZ
            if DRIVER in per:
                per[DRIVER] -= self._foreign_s
        return CpuMark(time.monotonic(), per, _machine_busy_s())

    def _run(self) -> None:
        while True:
            for name, mib in self.sample().items():
                self.peak_mib[name] = max(mib, self.peak_mib.get(name, 0))
            if self._stop.wait(self.interval):
                return


_HZ = os.sysconf("SC_CLK_TCK")


class CpuMark:
    """CPU used up to a moment; `cores_since(earlier)` is the cores each component kept
    busy in between (1.0 = one core all the time)."""

    def __init__(self, at: float, per: dict[str, float], busy_s: float) -> None:
        self.at, self.per, self.busy_s = at, per, busy_s

    def cores_since(self, earlier: CpuMark) -> dict[str, float]:
        wall = max(self.at - earlier.at, 1e-9)
        cores = {
            name: round((seconds - earlier.per.get(name, 0.0)) / wall, 2)
            for name, seconds in sorted(self.per.items())
        }
        cores["machine (all processes)"] = round((self.busy_s - earlier.busy_s) / wall, 2)
        return cores


def _cpu_ticks(pid: str) -> int | None:
    """utime + stime of a process, in clock ticks (fields 14 and 15 of its stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def _machine_busy_s() -> float:
    """Seconds all cores spent on anything but idle and I/O wait since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / _HZ


def cleanup(settings: Settings) -> None:
    """Drop the benchmark's pipeline (connector, slot, publication), delete its topics,
    its cache keys and search indices, and its apply checkpoints."""
    import shutil

    from cdc.capture.pipeline import drop_pipeline
    from cdc.core.clients import kafka_admin, opensearch_client, redis_client

    drop_pipeline(settings)
    prefix = settings.pipeline.topic_prefix
    admin = kafka_admin(settings.kafka)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(f"{prefix}.") or t.endswith(prefix)]
        if mine:
            admin.delete_topics(mine)
    finally:
        admin.close()
    # (a benchmark's name is `bench` and hex digits: nothing to escape in these patterns)
    redis = redis_client(settings.redis, socket_timeout=30)
    try:
        keys = list(redis.scan_iter(match=f"{prefix}:*", count=10_000))
        for at in range(0, len(keys), 10_000):
            redis.delete(*keys[at : at + 10_000])
    finally:
        redis.close()
    search = opensearch_client(settings.opensearch)
    search.indices.delete(index=f"{prefix.lower()}.*", ignore_unavailable=True)
    shutil.rmtree(settings.data_dir / "checkpoints" / settings.pipeline.name, ignore_errors=True)
    shutil.rmtree(settings.data_dir / "bench" / settings.pipeline.name, ignore_errors=True)


class WarehousePhases:
    """Seconds per warehouse batch spent in each step of its table writes (summed over
    the tables, which are written side by side: a sum of thread times, not of wall
    time), and in the steps after it (the join views): what bounds a batch. Wraps the
    store's functions while in use (`with WarehousePhases() as phases`)."""

    STEPS = (
        "_decode",
        "summarize",
        "newest_held",
        "stored_values",
        "holds_any",
        "version_rows",
        "_append",
        "_write_current",
        # a batch shaped on the driver (_arrow_batch.py)
        "_decode_batch",  # Spark's decoding, collected
        "_append_arrow",
        "_merge_arrow",
    )

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.batches = 0
        self.lock = threading.Lock()
        self._undo: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds[label] = self.seconds.get(label, 0.0) + (
                        time.perf_counter() - started
                    )
                    self.batches += label == "whole batch"

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def __enter__(self) -> WarehousePhases:
        from cdc.stores.warehouse import native, store
        from cdc.stores.warehouse.views import enrichment, table_join

        for name in self.STEPS:
            owner = store.WarehouseStore if name.startswith("_") else store
            self._wrap(owner, name, name.lstrip("_"))
        self._wrap(store.WarehouseStore, "write_frame", "whole batch")
        # before it, a batch decoded in Arrow: its records collected, then decoded
        from cdc.stores.warehouse.write import routes

        self._wrap(routes.WarehouseBatches, "collect_records", "collect records")
        self._wrap(routes, "decode_records", "decode in Arrow")
        # what of a delta-rs write is its own (the rest: Spark computing the rows)
        self._wrap(native.NativeWriter, "_commit", "delta-rs commit")
        for module in (table_join, enrichment):
            for step in vars(module).values():
                if (
                    isinstance(step, type)
                    and hasattr(step, "refresh")
                    and step.__module__ == (module.__name__)
                ):
                    self._wrap(step, "refresh", f"view {step.__name__}")
        return self

    def __exit__(self, *_: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)

    def reset(self) -> None:
        with self.lock:
            self.seconds.clear()
            self.batches = 0

    def figures(self) -> dict[str, object]:
        """The batches, and the mean seconds per batch of each step."""
        with self.lock:
            each = max(self.batches, 1)
            steps = {k: round(v / each, 3) for k, v in sorted(self.seconds.items())}
            return {"batches": self.batches, "mean_s_per_batch": steps}
