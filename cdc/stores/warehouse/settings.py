"""The warehouse's own settings: `[stores.warehouse]` (CDC_STORES__WAREHOUSE__<KEY>).

Before this section they were keys of `[apply]`; those are read for one release, each
with one deprecation line (the declaration's `renamed`, cdc/core/settings/__init__.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = [
    "RENAMED",
    "S3Settings",
    "WarehouseSettings",
    "warehouse_settings",
    "with_warehouse",
    "writer_in_use",
]


class S3Settings(BaseModel):
    """How the warehouse on object storage (`path = "s3://bucket/prefix"`) is reached: by
    Spark (S3A, spark.hadoop.fs.s3a.*) and delta-rs alike (cdc.core.object_store). A key
    not set here is taken from the AWS environment variables (AWS_ENDPOINT_URL,
    AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), else the SDKs' own chain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str | None = Field(
        None,
        description="an S3-compatible server's URL (http://host:port or https://…); "
        "default AWS_ENDPOINT_URL, else AWS S3 itself",
    )
    region: str | None = Field(
        None, description="the bucket's region; default AWS_REGION, else us-east-1"
    )
    path_style: bool = Field(
        False,
        description="path-style requests (http://endpoint/bucket/key), as most S3-compatible "
        "servers want, rather than virtual-hosted ones (http://bucket.endpoint/key)",
    )
    access_key_id: str | None = Field(None, description="default AWS_ACCESS_KEY_ID")
    secret_access_key: SecretStr | None = Field(
        None, description="default AWS_SECRET_ACCESS_KEY (never printed)"
    )


class WarehouseSettings(BaseModel):
    """Where the warehouse's Delta tables live and how a batch is written into them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str | None = Field(
        None,
        description="Delta tables' root (any Spark filesystem; s3://bucket/prefix for object "
        "storage, reached as [stores.warehouse.s3] says), default data_dir/warehouse; "
        "a pipeline's tables are under <root>/<topic prefix>",
    )
    s3: S3Settings = Field(
        default_factory=S3Settings,
        description="the object store of an s3:// (or s3a://) path: endpoint, region, "
        "path-style requests, credentials",
    )
    writer: Literal["delta-rs", "spark"] = Field(
        "delta-rs",
        description="what writes a batch into the warehouse's current state and history: "
        "delta-rs (a MERGE of a batch in a tenth of Spark's time, beside the JVM) or Spark; "
        "a table delta-rs cannot write (a remote path, a column-mapped table, a value its "
        "statistics cannot hold) is written by Spark either way",
    )
    max_offsets_per_trigger: int = Field(
        500_000,
        ge=1,
        description="events per warehouse micro-batch: a catch-up in fewer, larger Delta "
        "commits, each MERGE's fixed cost spread over more events",
    )
    iceberg: bool = Field(
        False,
        description="also publish every warehouse table as an Apache Iceberg table over "
        "the same Parquet files (a SQLite catalog, <root>/_iceberg_catalog.db), for "
        "Iceberg readers: PyIceberg, Trino, Snowflake, DuckDB; a local warehouse only",
    )


# the keys of `[apply]` these were before: read as them for one release, with a line
RENAMED = {
    "apply.warehouse_path": "path",
    "apply.warehouse_writer": "writer",
    "apply.warehouse_max_offsets_per_trigger": "max_offsets_per_trigger",
    "apply.iceberg": "iceberg",
}


def warehouse_settings(settings: Any) -> WarehouseSettings:
    """The warehouse's section of `settings` (its defaults when not given)."""
    section: WarehouseSettings = settings.store_section("warehouse")
    return section


def writer_in_use(settings: Any) -> str:
    """What writes the warehouse's tables and views under `settings`: its `writer`, or
    Spark alone under the cluster profile (apply.profile), which collects nothing to the
    driver."""
    from cdc.core.spark import execution_profile

    if execution_profile(settings)[0] == "cluster":
        return "spark"
    return warehouse_settings(settings).writer


def with_warehouse(settings: Any, **changes: Any) -> Any:
    """`settings` with these keys of the warehouse's section changed."""
    section = warehouse_settings(settings).model_copy(update=changes)
    return settings.model_copy(update={"stores": {**settings.stores, "warehouse": section}})
