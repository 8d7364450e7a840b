"""The apply job's settings (`[apply]`): the stores it keeps, its cadence, its freshness
SLO, and the derived views. A store's own settings are its section, `[stores.<name>]`."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    field_validator,
)

from cdc.core.settings.views import JoinView, WindowAggregate
from cdc.core.store_declarations import declared, unknown_stores

# a store's name: one the stores declare (cdc/core/store_declarations.py)
StoreName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]


def _known(names: list[str]) -> list[str]:
    if problem := unknown_stores(names):
        raise ValueError(problem)
    return names


# keys of `[apply]` renamed: old -> new, read as the new one for one release
APPLY_RENAMED = {"warehouse_apart": "own_process", "warehouse_nice": "own_process_nice"}


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
    checkpoints: str | None = Field(
        None,
        description="where the streaming queries keep their Spark checkpoints (offsets, "
        "commits, the views' state): a folder, or s3://bucket/prefix (reached with "
        "[stores.warehouse.s3], as the warehouse is), which a cluster's executors must "
        "share; the pipeline's own records stay in data_dir (unset: data_dir/checkpoints)",
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
    profile: Literal["auto", "local", "cluster"] = Field(
        "auto",
        description="how the apply job spreads its work: local (batches collected to the "
        "driver where that is fastest on one machine: the warehouse decoded in Arrow and "
        "written by delta-rs, a small row batch written by the driver) or cluster (no "
        "batch collected to the driver: the warehouse, its history and its views written "
        "by Spark on the executors, every row batch by the executors); auto: cluster when "
        "spark.master is not local or the warehouse is on a remote path",
    )
    own_process: bool = Field(
        True,
        description="`cdc apply` of a store that asks for a process of its own (the "
        "warehouse, with its views) beside other stores runs it in one, at "
        "own_process_nice, so that its Spark jobs never take the cores the other stores' "
        "batches need",
    )
    own_process_nice: int = Field(
        5,
        ge=0,
        le=19,
        description="the CPU priority (nice) of a store's own process, and of its "
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
    row_store_tasks: int = Field(
        0,
        ge=0,
        description="the tasks a cache or search batch written by Spark's workers is "
        "split into: its events shuffled by key (a key's events stay in one task, in log "
        "order) into this many, for more writers than the topics have partitions (0: one "
        "task per topic partition, no shuffle)",
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

    @field_validator("checkpoints")
    @classmethod
    def _checkpoints_where(cls, where: str | None) -> str | None:
        if where is None:
            return None
        scheme = urlparse(where).scheme
        if len(scheme) > 1 and scheme not in ("file", "s3", "s3a", "s3n"):
            raise ValueError(
                f"{where!r} is on a filesystem the pipeline cannot read ({scheme}://): "
                "give a folder or s3://bucket/prefix"
            )
        if not where.strip("/ "):
            raise ValueError("give a folder or s3://bucket/prefix")
        return where

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
