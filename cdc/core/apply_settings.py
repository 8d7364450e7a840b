"""The apply job's settings (`[apply]`): the stores it keeps, its cadence, its freshness
SLO, the warehouse's place, and the derived views."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    field_validator,
)

from cdc.core.store_declarations import declared, unknown_stores
from cdc.core.view_settings import JoinView, WindowAggregate

# a store's name: one the stores declare (cdc/core/store_declarations.py)
StoreName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]


def _known(names: list[str]) -> list[str]:
    if problem := unknown_stores(names):
        raise ValueError(problem)
    return names


class ApplySettings(BaseModel):
    """The apply job: how often it runs, how much it takes per micro-batch, where it keeps state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stores: list[StoreName] = Field(
        default_factory=lambda: list(declared()), description="stores to keep (default: all)"
    )
    trigger_interval_s: float = Field(1.0, gt=0, description="micro-batch interval")
    views_trigger_interval_s: float = Field(
        15.0,
        gt=0,
        description="micro-batch interval of the window queries and stream-stream joins: "
        "each of their batches costs the cores the stores share, whatever it holds (at "
        "50 TPS on two cores, 5 s left the warehouse's batches a third of the cores)",
    )
    views_share_queries: bool = Field(
        True,
        description="window aggregates and stream-stream joins that write in one output "
        "mode, read the same tables and have one watermark run in one streaming query (each "
        "trigger planned, read and checkpointed once for all of them); false: a query per "
        "view. A change either way starts the views' queries afresh (their tables are "
        "computed again from the log)",
    )
    views_state_partitions: int = Field(
        1,
        ge=1,
        description="partitions of the state of a window query or stream-stream join "
        "started afresh: each is a task and a state store per stateful step and trigger "
        "(a query keeps the number its checkpoint began with)",
    )
    max_offsets_per_trigger: int = Field(200_000, ge=1, description="events per micro-batch")
    warehouse_max_offsets_per_trigger: int = Field(
        500_000,
        ge=1,
        description="events per warehouse micro-batch: a catch-up in fewer, larger Delta "
        "commits, each MERGE's fixed cost spread over more events",
    )
    freshness_slo_s: dict[StoreName, PositiveFloat] | None = Field(
        None,
        description="per store, the commit-to-visible latency its p99 over "
        "freshness_window_s (and its lag) must stay under: `cdc status` exits 1 and the "
        "metrics say so when it does not (a store left out has no SLO; unset: the "
        "default each store declares)",
    )
    freshness_window_s: float = Field(
        300.0, gt=0, description="the window `cdc status` gives freshness percentiles over"
    )
    warehouse_apart: bool = Field(
        True,
        description="`cdc apply` of the warehouse beside other stores runs the warehouse "
        "(and its views) in a process of its own, at warehouse_nice, so that its Spark "
        "jobs never take the cores the other stores' batches need",
    )
    warehouse_nice: int = Field(
        5,
        ge=0,
        le=19,
        description="the CPU priority (nice) of the warehouse's own process, and of its "
        "session where Linux shares the cores by session (autogroups): 5 gives it about a "
        "third of what the other stores' process gets when both want the cores; 19 leaves "
        "it only what the others leave",
    )
    driver_batch_events: int = Field(
        10_000,
        ge=0,
        description="a cache or search batch at most this many events behind the log is "
        "written by the driver, through the store's connection kept from batch to batch; a "
        "larger one (a catch-up) by Spark's Python workers, one per topic partition (0: always)",
    )
    deleted_marker_ttl_s: int = Field(
        86_400, ge=1, description="how long the cache keeps a deleted key's position"
    )
    store_retry_s: float = Field(
        30.0,
        gt=0,
        description="how long a write to a store that does not answer is retried before its "
        "batch waits, uncommitted, for the store to answer again",
    )
    warehouse_path: str | None = Field(
        None,
        description="Delta tables' root (any Spark filesystem), default data_dir/warehouse; "
        "a pipeline's tables are under <root>/<topic prefix>",
    )
    warehouse_writer: Literal["delta-rs", "spark"] = Field(
        "delta-rs",
        description="what writes a batch into the warehouse's current state and history: "
        "delta-rs (a MERGE of a batch in a tenth of Spark's time, beside the JVM) or Spark; "
        "a table delta-rs cannot write (a remote path, a column-mapped table, a value its "
        "statistics cannot hold) is written by Spark either way",
    )
    iceberg: bool = Field(
        False,
        description="also publish every warehouse table as an Apache Iceberg table over "
        "the same Parquet files (a SQLite catalog, <root>/_iceberg_catalog.db), for "
        "Iceberg readers: PyIceberg, Trino, Snowflake, DuckDB; a local warehouse only",
    )
    backfill_rewritten_tables: bool = Field(
        True,
        description="backfill a table whose values DDL changed without change events "
        "(ADD COLUMN with a default, a type change); false: only say what to run",
    )
    joins: list[JoinView] = Field(default_factory=list, description="join views to keep")
    windows: list[WindowAggregate] = Field(
        default_factory=list, description="windowed aggregates to keep"
    )

    @field_validator("stores")
    @classmethod
    def _stores_known(cls, stores: list[str]) -> list[str]:
        return _known(stores)

    @field_validator("freshness_slo_s")
    @classmethod
    def _slo_stores_known(cls, slo: dict[str, float] | None) -> dict[str, float] | None:
        if slo is not None:
            _known(list(slo))
        return slo

    def slo_s(self, store: str) -> float | None:
        """The commit-to-visible p99 `store` is held to (None: none)."""
        if self.freshness_slo_s is None:
            declaration = declared().get(store)
            return declaration.slo_s if declaration else None
        return self.freshness_slo_s.get(store)
