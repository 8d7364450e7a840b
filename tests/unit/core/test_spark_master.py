"""The master URL the Spark session is given."""

from __future__ import annotations

from pathlib import Path

from cdc.core.settings.connections import SparkSettings
from cdc.core.spark import (
    driver_address,
    execution_profile,
    jars_conf,
    snapshot_partitions,
    spark_master,
)


def test_local_star_is_twice_the_cores_in_task_slots() -> None:
    assert spark_master("local[*]", cores=2) == "local[4]"
    assert spark_master("local[*]", cores=1) == "local[2]"


def test_any_other_master_is_spark_s_as_given() -> None:
    for master in ("local[2]", "local", "spark://10.0.0.1:7077", "yarn", "local[*, 3]"):
        assert spark_master(master, cores=2) == master


def test_the_driver_binds_where_its_executors_reach_it() -> None:
    """A cluster's executors connect back to the driver: for a standalone master it
    binds to this machine's address on the route to the master (issue 68; the route to
    an address of this machine is loopback's), never to 127.0.0.1 for a master
    elsewhere; YARN and Kubernetes choose their own; a driver address in spark.conf is
    the user's."""
    assert driver_address("local[*]", {}) == "127.0.0.1"
    assert driver_address("spark://127.0.0.1:7077", {}) == "127.0.0.1"
    assert driver_address("spark://127.0.0.1:7077,10.0.0.9:7077", {}) == "127.0.0.1"
    assert driver_address("yarn", {}) is None
    assert driver_address("k8s://https://10.0.0.1:6443", {}) is None
    assert driver_address("local[2]", {"spark.driver.bindAddress": "0.0.0.0"}) is None
    assert driver_address("spark://127.0.0.1:7077", {"spark.driver.host": "10.0.0.2"}) is None


def test_a_users_spark_jars_add_to_the_projects() -> None:
    """spark.conf's `spark.jars` (an object store's connector) joins the project's jars;
    it replaced them, and the Kafka source and Delta went with them (issue 68)."""
    project = [Path("/j/delta.jar"), Path("/j/kafka.jar")]
    assert jars_conf(project, {}) == "/j/delta.jar,/j/kafka.jar"
    own = {"spark.jars": "/opt/hadoop-aws.jar, /opt/aws-sdk.jar"}
    assert (
        jars_conf(project, own) == "/j/delta.jar,/j/kafka.jar,/opt/hadoop-aws.jar,/opt/aws-sdk.jar"
    )


def test_the_profile_is_cluster_on_a_cluster_or_a_remote_warehouse(tmp_path: Path) -> None:
    """apply.profile = auto picks cluster when spark.master is not local or the warehouse
    is remote, and says why; a profile set is the one used (issue 68)."""
    from cdc.core.settings import Settings
    from cdc.stores.warehouse.settings import with_warehouse

    local = Settings(data_dir=tmp_path)  # type: ignore[call-arg]
    assert execution_profile(local)[0] == "local"
    cluster = local.model_copy(
        update={"spark": local.spark.model_copy(update={"master": "spark://h:7077"})}
    )
    assert execution_profile(cluster) == ("cluster", "spark.master is spark://h:7077")
    remote = with_warehouse(local, path="s3a://lake/cdc")
    assert execution_profile(remote) == ("cluster", "the warehouse is on a remote path")
    chosen = local.model_copy(
        update={"apply": local.apply.model_copy(update={"profile": "cluster"})}
    )
    assert execution_profile(chosen) == ("cluster", "apply.profile = cluster")


def test_the_cluster_profile_writes_the_warehouse_and_its_views_with_spark(
    tmp_path: Path,
) -> None:
    """Under the cluster profile neither the warehouse's tables nor its views' are
    written by delta-rs in the driver, whatever `[stores.warehouse] writer` says."""
    from cdc.core.settings import Settings
    from cdc.stores.warehouse.settings import with_warehouse, writer_in_use

    local = Settings(data_dir=tmp_path)  # type: ignore[call-arg]
    assert writer_in_use(local) == "delta-rs"
    assert writer_in_use(with_warehouse(local, path="s3a://lake/cdc")) == "spark"
    chosen = local.model_copy(
        update={"apply": local.apply.model_copy(update={"profile": "cluster"})}
    )
    assert writer_in_use(chosen) == "spark"


def test_delta_rebuilds_a_table_s_state_in_few_tasks_on_a_cluster_too() -> None:
    """Delta's default of 50 tasks per state rebuild (one per table and batch, each task
    sending the driver its metrics) was most of the task results of a cluster's batch
    (test_scale's catch-up): a cluster uses the session's shuffle partitions."""
    import os

    assert snapshot_partitions(SparkSettings(master="local[*]")) == str(max(os.cpu_count() or 1, 2))
    assert snapshot_partitions(SparkSettings(master="spark://10.0.0.1:7077")) == "4"
    assert (
        snapshot_partitions(SparkSettings(master="spark://10.0.0.1:7077", shuffle_partitions=16))
        == "16"
    )
