"""The master URL the Spark session is given."""

from __future__ import annotations

from pathlib import Path

from cdc.core.spark import driver_address, jars_conf, spark_master


def test_local_star_is_twice_the_cores_in_task_slots() -> None:
    assert spark_master("local[*]", cores=2) == "local[4]"
    assert spark_master("local[*]", cores=1) == "local[2]"


def test_any_other_master_is_spark_s_as_given() -> None:
    for master in ("local[2]", "local", "spark://10.0.0.1:7077", "yarn", "local[*, 3]"):
        assert spark_master(master, cores=2) == master


def test_the_driver_binds_to_loopback_only_for_a_local_master() -> None:
    """A cluster's executors connect back to the driver: it is not bound to 127.0.0.1
    there (issue 68), and a driver address in spark.conf is the user's."""
    assert driver_address("local[*]", {}) == "127.0.0.1"
    assert driver_address("spark://10.0.0.1:7077", {}) is None
    assert driver_address("yarn", {}) is None
    assert driver_address("local[2]", {"spark.driver.bindAddress": "0.0.0.0"}) is None


def test_a_users_spark_jars_add_to_the_projects() -> None:
    """spark.conf's `spark.jars` (an object store's connector) joins the project's jars;
    it replaced them, and the Kafka source and Delta went with them (issue 68)."""
    project = [Path("/j/delta.jar"), Path("/j/kafka.jar")]
    assert jars_conf(project, {}) == "/j/delta.jar,/j/kafka.jar"
    own = {"spark.jars": "/opt/hadoop-aws.jar, /opt/aws-sdk.jar"}
    assert (
        jars_conf(project, own) == "/j/delta.jar,/j/kafka.jar,/opt/hadoop-aws.jar,/opt/aws-sdk.jar"
    )
