"""What every benchmark shares: the machine's description, the results files, a
pipeline of its own, and the memory of each component sampled while it runs."""

from __future__ import annotations

import json
import os
import platform
import threading
import time
import uuid
from pathlib import Path

from cdc.settings import PipelineSettings, Settings

__all__ = ["MemorySampler", "bench_settings", "cleanup", "machine", "record"]

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


def bench_settings(settings: Settings, tables: list[str], **pipeline: object) -> Settings:
    """The settings with a pipeline of the benchmark's own (random name) over `tables`,
    its warehouse in a directory of its own (no join views or windows)."""
    name = "bench" + uuid.uuid4().hex[:6]
    warehouse = settings.data_dir / "bench" / name / "warehouse"
    return settings.model_copy(
        update={
            "pipeline": PipelineSettings(name=name, topic_prefix=name, tables=tables, **pipeline),  # type: ignore[arg-type]
            "apply": settings.apply.model_copy(
                update={"warehouse_path": str(warehouse), "joins": [], "windows": []}
            ),
        }
    )


# (component, what its command line holds) for the JVMs and Spark's Python workers
_JAVA = [
    ("spark", "org.apache.spark.deploy.SparkSubmit"),
    ("spark", "pyspark.daemon"),
    ("spark", "pyspark.worker"),
    ("kafka", "kafka.Kafka "),
    ("connect", "ConnectDistributed"),
    ("opensearch", "org.opensearch.bootstrap.OpenSearch"),
]
_PROGRAMS = {"postgres": "postgres", "redis-server": "redis"}


def _component(pid: str) -> str | None:
    if int(pid) == os.getpid():
        return "apply driver (python)"
    try:
        program = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if program in _PROGRAMS:
        return _PROGRAMS[program]
    return next((name for name, marker in _JAVA if marker in cmdline), None)


def _pss_kib(pid: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemorySampler:
    """Samples, every `interval` seconds, the proportional set size (PSS: shared pages
    counted once across processes) of each component's processes, and keeps the peak
    of their sum per component. The Spark driver JVM and its Python workers count as
    `spark`; this process (which runs the apply job's driver) as `apply driver`."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.peak_mib: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (component := _component(entry.name)):
                totals[component] = totals.get(component, 0) + _pss_kib(entry.name)
        return {name: kib // 1024 for name, kib in totals.items()}

    def _run(self) -> None:
        while True:
            for name, mib in self.sample().items():
                self.peak_mib[name] = max(mib, self.peak_mib.get(name, 0))
            if self._stop.wait(self.interval):
                return


def cleanup(settings: Settings) -> None:
    """Drop the benchmark's pipeline (connector, slot, publication) and delete its topics
    and its apply checkpoints."""
    import shutil

    from kafka.admin import KafkaAdminClient

    from cdc.pipeline import drop_pipeline

    drop_pipeline(settings)
    prefix = settings.pipeline.topic_prefix
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(f"{prefix}.") or t.endswith(prefix)]
        if mine:
            admin.delete_topics(mine)
    finally:
        admin.close()
    shutil.rmtree(settings.data_dir / "checkpoints" / settings.pipeline.name, ignore_errors=True)
    shutil.rmtree(settings.data_dir / "bench" / settings.pipeline.name, ignore_errors=True)
