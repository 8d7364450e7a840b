"""The master URL the Spark session is given."""

from __future__ import annotations

from cdc.core.spark import spark_master


def test_local_star_is_twice_the_cores_in_task_slots() -> None:
    assert spark_master("local[*]", cores=2) == "local[4]"
    assert spark_master("local[*]", cores=1) == "local[2]"


def test_any_other_master_is_spark_s_as_given() -> None:
    for master in ("local[2]", "local", "spark://10.0.0.1:7077", "yarn", "local[*, 3]"):
        assert spark_master(master, cores=2) == master
