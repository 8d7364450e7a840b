"""A Spark standalone cluster for the tests: a master and one-core workers started from
pyspark's own `spark-class` on free loopback ports, in a temporary folder (each worker's
work folder `worker-<n>`, the daemons' logs `daemon-<n>.log`); a worker can be SIGKILLed
with its executors, as a machine lost, and started again. Stopped at the end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark
import requests

from tests.helpers import free_ports

WORKERS = 2


@dataclass
class SparkCluster:
    """A running master and its workers: `url` (spark://…), `ui` (the master's web UI),
    `work` (the folder of their work and logs)."""

    url: str
    ui: str
    work: Path
    env: dict[str, str]
    worker_commands: list[list[str]]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's JSON state (workers, applications)."""
        found: dict[str, Any] = requests.get(f"{self.ui}/json/", timeout=10).json()
        return found

    def conf(self, **more: str) -> dict[str, str]:
        """CDC_SPARK__MASTER and CDC_SPARK__CONF for `cdc` on this cluster: one one-core
        executor per worker, so a batch's tasks spread over both."""
        conf = {
            "spark.executor.memory": "640m",
            "spark.executor.cores": "1",
            "spark.cores.max": str(WORKERS),
            **more,
        }
        return {"CDC_SPARK__MASTER": self.url, "CDC_SPARK__CONF": json.dumps(conf)}

    def start_worker(self, n: int) -> None:
        log = (self.work / f"daemon-worker-{n}.log").open("a")
        process = subprocess.Popen(self.worker_commands[n], env=self.env, stdout=log, stderr=log)
        if n < len(self.workers):
            self.workers[n] = process
        else:
            self.workers.append(process)

    def kill_worker(self, n: int) -> list[int]:
        """SIGKILL worker `n` and the executors it started, as a machine lost: the pids."""
        worker = self.workers[n]
        children = _children(worker.pid)
        for pid in [worker.pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.wait(timeout=30)
        return [worker.pid, *children]

    def wait_alive(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.state().get("aliveworkers") == count:
                    return
            except (requests.RequestException, ValueError):
                pass
            assert time.monotonic() < deadline, f"{count} workers did not register; see {self.work}"
            time.sleep(1)

    def finished_tasks(self, app: str) -> dict[str, int]:
        """Per worker folder, how many tasks of `app` its executors finished (their logs)."""
        return {
            worker.name: sum(
                log.read_text(errors="replace").count("Finished task")
                for log in (worker / app).glob("*/stderr")
            )
            for worker in sorted(self.work.glob("worker-*"))
        }


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


@contextlib.contextmanager
def spark_cluster(java_home: Path, workers: int = WORKERS) -> Iterator[SparkCluster]:
    """A master and `workers` one-core, 1 GiB workers, up until the end."""
    home = Path(pyspark.__file__).parent
    work = Path(tempfile.mkdtemp(prefix="cdc-spark-cluster-"))
    master_port, master_ui, *worker_ui = free_ports(2 + workers)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "JAVA_HOME": str(java_home),
        "SPARK_LOG_DIR": str(work),
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    url = f"spark://127.0.0.1:{master_port}"
    daemon = [str(home / "bin" / "spark-class")]
    master_command = [
        *daemon,
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(master_port), "--webui-port", str(master_ui)),
    ]
    cluster = SparkCluster(
        url=url,
        ui=f"http://127.0.0.1:{master_ui}",
        work=work,
        env=env,
        worker_commands=[
            [
                *daemon,
                "org.apache.spark.deploy.worker.Worker",
                *("--cores", "1", "--memory", "1g", "--webui-port", str(port)),
                *("--work-dir", str(work / f"worker-{n}"), url),
            ]
            for n, port in enumerate(worker_ui)
        ],
    )
    log = (work / "daemon-master.log").open("w")
    master = subprocess.Popen(master_command, env=env, stdout=log, stderr=log)
    try:
        for n in range(workers):
            cluster.start_worker(n)
        cluster.wait_alive(workers)
        yield cluster
    finally:
        for process in [*cluster.workers, master]:
            if process.poll() is None:
                process.terminate()
        for process in [*cluster.workers, master]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
