"""A secret in `spark.conf` (object-store keys, tokens) never reaches a command line: the
Spark driver's JVM took every conf as `--conf k=v` arguments, which `ps` shows every
local user. The session still has the value, and Hadoop's configuration too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
import json, os, sys
from cdc.core.settings import load_settings
from cdc.core.spark import spark_session
secret = os.environ["PROBE_SECRET"]
session = spark_session(load_settings(), "secrets-probe")
shown = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if secret.encode() in f.read():
                    shown.append(pid)
        except OSError:
            pass
hadoop = session.sparkContext._jsc.hadoopConfiguration()
print(json.dumps({
    "shown": shown,
    "conf": session.conf.get("spark.hadoop.fs.s3a.secret.key"),
    "hadoop": hadoop.get("fs.s3a.secret.key"),
    "plain": session.conf.get("spark.sql.shuffle.partitions"),
}))
session.stop()
"""


def test_a_secret_spark_conf_is_on_no_command_line(tmp_path: Path) -> None:
    secret = f"S3CRET-{uuid.uuid4().hex}"
    conf = {"spark.hadoop.fs.s3a.secret.key": secret, "spark.sql.shuffle.partitions": "3"}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
        "CDC_DATA_DIR": str(tmp_path),
        "CDC_SPARK__CONF": json.dumps(conf),
        "PROBE_SECRET": secret,  # not an argument: the probe's own command line is read too
    }
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["shown"] == [], found  # no process's command line holds it
    assert found["conf"] == secret and found["hadoop"] == secret, found
    assert found["plain"] == "3", found
    assert not any(secret in p.read_text(errors="ignore") for p in tmp_path.rglob("*.conf"))
