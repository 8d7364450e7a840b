"""A pipeline and what it captures (`[pipeline]`, `[pipeline.table."schema.name"]`)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    model_validator,
)

from cdc.core.filters import filter_problem
from cdc.core.settings.views import QualifiedTable


class TableChoice(BaseModel):
    """What of one captured table leaves PostgreSQL (`[pipeline.table."schema.name"]`).

    `columns` (only these) or `exclude_columns` (all but these): the publication's column
    list, the snapshot's SELECT, backfills and Debezium's column filter name the same
    columns, and the replication role may read no other. `where`: a row filter (one
    boolean expression on the table's replica identity columns), the publication's row
    filter and the snapshot's, backfills' and verify's WHERE. `mask`: columns that leave
    hashed or redacted (the snapshot's SELECT and verify mask them in PostgreSQL, the
    pipeline's Connect transform in every change event).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    columns: list[str] | None = Field(
        None, description="capture only these columns (the key's among them)"
    )
    exclude_columns: list[str] = Field(
        default_factory=list, description="capture every column but these"
    )
    where: str | None = Field(
        None,
        description="capture only the rows this expression holds for (PostgreSQL 15 "
        "publication row filter: its columns must be in the replica identity)",
    )
    mask: dict[str, Literal["hash", "redact"]] = Field(
        default_factory=dict,
        description="per column: hash (salted SHA-256 of the text, the same everywhere) "
        "or redact (redact_with, or NULL)",
    )
    redact_with: str | None = Field(
        None, description="the text a redacted column holds (default: NULL)"
    )

    @model_validator(mode="after")
    def _check(self) -> TableChoice:
        if self.columns is not None and self.exclude_columns:
            raise ValueError("give columns or exclude_columns, not both")
        if self.columns is not None and not self.columns:
            raise ValueError("columns names no column")
        for names in (self.columns or [], self.exclude_columns):
            if len(set(names)) != len(names):
                raise ValueError("a column is named twice")
            if any(not n for n in names):
                raise ValueError("a column name is empty")
        if left_out := [c for c in self.mask if c in self.exclude_columns] + [
            c for c in self.mask if self.columns is not None and c not in self.columns
        ]:
            raise ValueError(f"mask names {left_out[0]!r}, which is not captured")
        if self.redact_with is not None and "redact" not in self.mask.values():
            raise ValueError("redact_with is set, but mask redacts no column")
        if self.where is not None:
            if not self.where.strip():
                raise ValueError("where is empty: leave it out to capture every row")
            if problem := filter_problem(self.where):
                raise ValueError(f"where is not one filter expression: {problem}")
        return self


ReplicaIdentity = Literal["default", "full"]


class PipelineSettings(BaseModel):
    """What is captured and how: tables, topics, the slot and the connector."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        "cdc",
        pattern=r"^[a-z][a-z0-9_]{0,40}$",
        description="names the slot, publication and connector (cdc_<name>, <name>)",
    )
    tables: list[str] = Field(
        default_factory=lambda: ["public.*"],
        description="captured tables: schema.table, or a pattern with * and ? (public.*)",
    )
    exclude_tables: list[str] = Field(default_factory=list, description="patterns left out")
    topic_prefix: str = Field("cdc", pattern=r"^[A-Za-z0-9_\-]+$")
    partitions: int = Field(3, ge=1, le=1000, description="partitions per change topic; fixed")
    replica_identity: dict[str, ReplicaIdentity] = Field(
        default_factory=dict, description='per table: "full" gives full before-images'
    )
    key_columns: dict[str, list[str]] = Field(
        default_factory=dict,
        description="message key for a table without a primary key (needs replica identity full)",
    )
    table: dict[QualifiedTable, TableChoice] = Field(
        default_factory=dict,
        description='per table ("schema.name"): the columns and rows captured '
        "(columns, exclude_columns, where)",
    )
    mask_salt: SecretStr | None = Field(
        None,
        description="the salt of the masks' hashes; default: a random one `cdc setup` makes "
        "once and keeps in the source (cdc.mask_salts, which only the setup's user reads)",
    )
    replication_user: str = Field("cdc_replication", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    replication_password: SecretStr | None = Field(
        None,
        description="the replication role's password; default: a random one cdc generates "
        "and keeps in data_dir/secrets/<role>.password (0600)",
    )
    heartbeat_interval_ms: int = Field(10_000, ge=100)
    read_only_backfills: bool = Field(
        False,
        description="backfills write nothing to the source: signals go through Kafka "
        "(<topic_prefix>.signals) and Debezium's watermarks are pg_current_snapshot() "
        "(read.only); see docs/capture.md for what that costs",
    )
    snapshot_pages_per_reader: int = Field(
        4096, ge=1, description="a table is split into CTID ranges of this many 8 KiB pages"
    )
    snapshot_into_stores: bool = Field(
        True,
        description="`cdc snapshot` also writes its rows itself into the stores of "
        "apply.stores that take them (the warehouse), from the same read as the change "
        "topics; their apply skips those records (docs/capture.md)",
    )
    delete_retention_ms: int = Field(
        86_400_000, ge=0, description="how long compaction keeps a tombstone"
    )
    segment_ms: int = Field(
        3_600_000, ge=60_000, description="segment roll time: bounds how long before compaction"
    )
    wal_retained_warn_bytes: int = Field(
        1 << 30,
        ge=0,
        description="`cdc status` and the metrics warn when the slot retains more WAL than "
        "this (0: never)",
    )

    @property
    def slot(self) -> str:
        return f"cdc_{self.name}"

    @property
    def publication(self) -> str:
        return f"cdc_{self.name}"

    @property
    def connector(self) -> str:
        return f"cdc-{self.name}"
