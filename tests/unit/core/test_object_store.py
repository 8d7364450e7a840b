"""The warehouse on object storage: its settings (from cdc.toml's keys or the AWS
environment, the secret masked), and each engine's words for them: Spark's S3A and
Delta's S3 log store, delta-rs's storage options (cdc/core/object_store.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cdc.core.errors import ConfigError, NotInstalledError
from cdc.core.object_store import delta_rs_options, s3a_jars, spark_s3_conf
from cdc.core.settings import Settings
from cdc.core.settings.connections import SECRET_KEY
from cdc.core.state_folders import local_warehouse, warehouse_store

ROOT = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t-value/with+signs"


def _settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> Settings:
    for key in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings(data_dir=tmp_path)  # type: ignore[call-arg]


def test_the_keys_of_stores_warehouse_s3_reach_the_store_and_the_secret_is_masked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = _settings(
        monkeypatch,
        tmp_path,
        CDC_STORES__WAREHOUSE__PATH="s3://lake/cdc/",
        CDC_STORES__WAREHOUSE__S3__ENDPOINT="http://127.0.0.1:9000",
        CDC_STORES__WAREHOUSE__S3__REGION="eu-west-3",
        CDC_STORES__WAREHOUSE__S3__PATH_STYLE="true",
        CDC_STORES__WAREHOUSE__S3__ACCESS_KEY_ID="AKIDEXAMPLE",
        CDC_STORES__WAREHOUSE__S3__SECRET_ACCESS_KEY=SECRET,
    )
    store = warehouse_store(settings)
    assert store is not None
    assert (store.bucket, store.prefix, store.region) == ("lake", "cdc", "eu-west-3")
    assert (store.endpoint, store.path_style, store.insecure) == (
        "http://127.0.0.1:9000",
        True,
        True,
    )
    assert (store.access_key_id, store.secret_access_key) == ("AKIDEXAMPLE", SECRET)
    assert local_warehouse(settings) is None
    shown = json.dumps(settings.masked())
    assert SECRET not in shown and "AKIDEXAMPLE" in shown
    assert SECRET not in store.where and SECRET not in repr(settings)


def test_the_aws_environment_fills_what_the_settings_leave_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = _settings(
        monkeypatch,
        tmp_path,
        CDC_STORES__WAREHOUSE__PATH="s3a://lake",
        AWS_ENDPOINT_URL="https://s3.example.net",
        AWS_REGION="ap-south-1",
        AWS_ACCESS_KEY_ID="AKIDENV",
        AWS_SECRET_ACCESS_KEY=SECRET,
    )
    store = warehouse_store(settings)
    assert store is not None
    assert (store.bucket, store.prefix, store.endpoint, store.region) == (
        "lake",
        "",
        "https://s3.example.net",
        "ap-south-1",
    )
    assert (store.access_key_id, store.secret_access_key, store.insecure) == (
        "AKIDENV",
        SECRET,
        False,
    )


def test_a_local_or_other_filesystem_warehouse_has_no_object_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert warehouse_store(_settings(monkeypatch, tmp_path)) is None
    hdfs = _settings(monkeypatch, tmp_path, CDC_STORES__WAREHOUSE__PATH="hdfs://nn/lake")
    assert warehouse_store(hdfs) is None
    nameless = _settings(monkeypatch, tmp_path, CDC_STORES__WAREHOUSE__PATH="s3:///cdc")
    with pytest.raises(ConfigError, match="names no bucket"):
        warehouse_store(nameless)


def test_spark_reads_s3_and_s3a_through_s3a_with_the_secret_among_the_secret_confs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = _settings(
        monkeypatch,
        tmp_path,
        CDC_STORES__WAREHOUSE__PATH="s3://lake/cdc",
        CDC_STORES__WAREHOUSE__S3__ENDPOINT="http://127.0.0.1:9000",
        CDC_STORES__WAREHOUSE__S3__PATH_STYLE="true",
        AWS_ACCESS_KEY_ID="AKIDENV",
        AWS_SECRET_ACCESS_KEY=SECRET,
    )
    store = warehouse_store(settings)
    assert store is not None
    conf = spark_s3_conf(store)
    s3a = "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3.impl"] == conf["spark.hadoop.fs.s3a.impl"] == s3a
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.delta.logStore.s3.impl"] == "io.delta.storage.S3SingleDriverLogStore"
    # the secret goes to Spark through its properties file, never its command line
    held = [k for k, v in conf.items() if v == SECRET]
    assert held == ["spark.hadoop.fs.s3a.secret.key"]
    assert all(SECRET_KEY.search(k) for k in held)


def test_delta_rs_readers_get_the_object_store_crates_keys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = _settings(
        monkeypatch,
        tmp_path,
        CDC_STORES__WAREHOUSE__PATH="s3://lake/cdc",
        CDC_STORES__WAREHOUSE__S3__ENDPOINT="http://127.0.0.1:9000",
        CDC_STORES__WAREHOUSE__S3__PATH_STYLE="true",
        AWS_ACCESS_KEY_ID="AKIDENV",
        AWS_SECRET_ACCESS_KEY=SECRET,
    )
    store = warehouse_store(settings)
    assert store is not None
    assert delta_rs_options(store) == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ACCESS_KEY_ID": "AKIDENV",
        "AWS_SECRET_ACCESS_KEY": SECRET,
    }


def test_a_missing_s3_connector_is_one_line_that_says_to_install(tmp_path: Path) -> None:
    with pytest.raises(NotInstalledError, match="S3 connector is not installed"):
        s3a_jars(tmp_path)


def test_hadoop_aws_is_of_the_hadoop_the_pyspark_wheel_ships() -> None:
    """hadoop-aws must be of the very Hadoop release Spark runs (jvm/pom.xml)."""
    import pyspark

    shipped = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    assert shipped, "pyspark ships no hadoop-client-api"
    version = re.search(r"hadoop-client-api-(.+)\.jar", shipped[-1].name)
    pom = (ROOT / "jvm" / "pom.xml").read_text()
    pinned = re.search(r"<hadoop\.version>(.+?)</hadoop\.version>", pom)
    assert version and pinned and version.group(1) == pinned.group(1)
