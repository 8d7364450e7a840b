"""A Spark worker at another address than the driver's machine (issue 68 item 6): a
standalone master on this machine's side of a veth pair, its one worker in a network
namespace the test makes (tests/netns.py), which reaches this machine only over that
pair. A job of `cdc`'s own Spark session (cdc/core/spark.py: its jars, served by the
driver) runs on it: the driver bound to the address on its route to the master, which
the executor reaches; Spark's own choice here is eth0's, which the namespace cannot
reach."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark
import pytest
import requests

from cdc.core.settings import load_settings
from tests.helpers import free_ports
from tests.netns import namespace

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

JOB = """
import json, sys
from cdc.core.settings import load_settings
from cdc.core.spark import spark_session
settings = load_settings(data_dir=sys.argv[1], spark={"master": sys.argv[2], "conf": {
    "spark.executor.memory": "512m", "spark.cores.max": "1"}})
spark = spark_session(settings, "cdc-driver-address-test")
total = spark.range(0, 100000, numPartitions=4).selectExpr("sum(id) AS n").collect()[0]["n"]
print(json.dumps({"sum": total, "driver": spark.conf.get("spark.driver.host")}))
spark.stop()
"""


def test_an_executor_in_another_network_reaches_the_driver(tmp_path: Path) -> None:
    home = Path(pyspark.__file__).parent
    java_home = str(load_settings().java_home)
    work = Path(tempfile.mkdtemp(prefix="cdc-spark-netns-"))
    work.chmod(0o755)
    with namespace() as ns:
        port, ui = free_ports(2)
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "JAVA_HOME": java_home,
            "SPARK_LOG_DIR": str(work),
            "SPARK_DAEMON_MEMORY": "384m",
        }
        spark_class = str(home / "bin" / "spark-class")
        master = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                *("--host", ns.host_address, "--port", str(port), "--webui-port", str(ui)),
            ],
            env={**env, "SPARK_LOCAL_IP": ns.host_address},
            stdout=(work / "master.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        url = f"spark://{ns.host_address}:{port}"
        worker = subprocess.Popen(
            ns.command(
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                *("--host", ns.address, "--cores", "1", "--memory", "768m"),
                *("--work-dir", str(work / "worker"), url),
            ),
            env={**env, "SPARK_LOCAL_IP": ns.address},
            stdout=(work / "worker.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    state = requests.get(f"http://{ns.host_address}:{ui}/json/", timeout=5).json()
                    if state.get("aliveworkers") == 1:
                        break
                except (requests.RequestException, ValueError):
                    pass
                assert time.monotonic() < deadline, f"the worker did not register; see {work}"
                time.sleep(1)
            job = subprocess.run(
                [sys.executable, "-c", JOB, str(tmp_path / "data"), url],
                env={k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-3000:]
            said = json.loads(job.stdout.strip().splitlines()[-1])
            assert said == {"sum": sum(range(100000)), "driver": ns.host_address}
            # the job ran on the worker in the namespace (the only one)
            apps = requests.get(f"http://{ns.host_address}:{ui}/json/", timeout=5).json()
            assert [a["name"] for a in apps["completedapps"]] == ["cdc-driver-address-test"]
        finally:
            for process in (worker, master):
                process.terminate()
            for process in (worker, master):
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
