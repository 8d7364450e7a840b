"""The Spark driver's class archive (the JDK's class data sharing): the classes a `cdc`
command's Spark driver loads as it starts, mapped from one file instead of read from the
jars and verified again by every command. On 2 cores a driver's start, first SQL and
first Delta read took 20.6 s with it and 29.7 s without (medians of 3 alternating runs,
`make bench-class-archive`, bench/results/class_archive.jsonl).

install.sh builds it (`python -m cdc.core.class_archive`): a driver started as every
command starts one (cdc.core.spark.spark_session) writes, merges and reads a Delta table
and stops with -XX:ArchiveClassesAtExit. A driver maps it when it was built for the same
JDK and pyspark (cdc.core.spark `class_archive_options`); a JVM that cannot map it
(another class path: a user's spark.driver.extraClassPath) runs without it, silently.
Nothing depends on it: a failed build is a line in the install's output, and every
command runs as before.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cdc.core.settings import Settings
from cdc.core.spark import (
    ARCHIVE_OUT,
    archive_path,
    archive_stamp,
    class_archive_options,
    spark_session,
)

__all__ = ["build"]


def build(settings: Settings) -> Path:
    """Start a driver that writes the archive when its JVM exits, give it the work a
    command's driver does first, stop it and wait for the archive."""
    path = archive_path(settings)
    written = path.with_name(f".{path.name}.{os.getpid()}")
    written.unlink(missing_ok=True)
    os.environ[ARCHIVE_OUT] = str(written)
    with tempfile.TemporaryDirectory(prefix="cdc-class-archive-") as scratch:
        spark = spark_session(
            settings.model_copy(update={"data_dir": Path(scratch) / "data"}), "cdc-class-archive"
        )
        _warm(spark, Path(scratch) / "table")
        gateway: Any = spark.sparkContext._gateway
        process = gateway.proc
        spark.stop()
        gateway.shutdown()
        process.stdin.close()  # the gateway's JVM exits, and writes the archive
        process.wait(timeout=600)
    if not written.is_file():
        raise OSError(f"the JVM wrote no class archive at {written}")
    written.replace(path)
    path.with_suffix(".stamp").write_text(archive_stamp(settings) + "\n")
    return path


def _warm(spark: object, table: Path) -> None:
    """What a command's driver does first: SQL, a Delta table written, merged and read."""
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    spark.sql("SELECT 1").collect()
    frame = spark.range(100).selectExpr("id", "cast(id AS string) AS v", "current_timestamp() AS t")
    frame.write.format("delta").save(str(table))
    target = DeltaTable.forPath(spark, str(table))
    target.alias("t").merge(frame.alias("s"), "t.id = s.id").whenMatchedUpdateAll().execute()
    spark.read.format("delta").load(str(table)).where("id > 3").toArrow()
    spark.read.format("delta").option("versionAsOf", 0).load(str(table)).count()


def main() -> int:
    started = time.monotonic()
    settings = Settings()
    if class_archive_options(settings):  # one built for this JDK and pyspark
        print("up to date")
        return 0
    try:
        path = build(settings)
    except Exception as exc:  # an optimisation: the install goes on without it
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        print(f"no class archive ({first}): each Spark start takes a few seconds longer")
        return 0
    size = path.stat().st_size / 2**20
    print(f"built {path.name} ({size:.0f} MiB) in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
