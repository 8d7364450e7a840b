"""Typed, frozen settings from `cdc.toml` and the `CDC_*` environment.

Precedence, highest first: explicit overrides, environment (`CDC_KAFKA__PORT=…`,
nested keys joined by `__`), the TOML file (`CDC_CONFIG`, else `./cdc.toml`),
defaults. Secrets are `SecretStr` and print as `**********`.
"""

from __future__ import annotations

import os
import shutil
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from cdc.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy import URL

__all__ = ["PROJECT_ROOT", "STORE_NAMES", "Settings", "load_settings"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
Port = Annotated[int, Field(ge=1, le=65535)]
Heap = Annotated[
    str, Field(pattern=r"^[1-9][0-9]*[mMgG]$", description="JVM heap, e.g. 512m or 1g")
]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    managed: bool = Field(
        True, description="start and stop it with `cdc up`/`cdc down`; false: use an existing one"
    )
    host: str = "127.0.0.1"


class PostgresSettings(_Section):
    port: Port = 55432
    user: str = "postgres"
    password: SecretStr = SecretStr("postgres")
    database: str = "cdc"
    connector_host: str | None = Field(
        None, description="host Kafka Connect reaches PostgreSQL at, if not `host` (containers)"
    )
    connector_port: Port | None = Field(None, description="port Kafka Connect reaches it at")

    def dsn(self, database: str | None = None) -> str:
        """A libpq connection string (holds the password: never print it)."""
        return (
            f"host={self.host} port={self.port} dbname={database or self.database} "
            f"user={self.user} password={self.password.get_secret_value()}"
        )

    def sqlalchemy_url(self) -> URL:
        """The source as an SQLAlchemy URL (the psycopg 3 driver), built by SQLAlchemy so
        that any character of the password works (it holds the password: never print it)."""
        from sqlalchemy import URL

        return URL.create(
            "postgresql+psycopg",
            username=self.user,
            password=self.password.get_secret_value(),
            host=self.host,
            port=self.port,
            database=self.database,
        )


class KafkaSettings(_Section):
    port: Port = 59092
    controller_port: Port = 59093
    heap: Heap = "768m"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"


class ConnectSettings(_Section):
    port: Port = 58083
    heap: Heap = "768m"
    group_id: str = "cdc-connect"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class OpenSearchSettings(_Section):
    port: Port = 59200
    transport_port: Port = 59300
    heap: Heap = "768m"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class RedisSettings(_Section):
    port: Port = 56379
    password: SecretStr | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


class SparkSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = Field("local[*]", description="local[*] by default; any Spark master URL")
    driver_memory: Heap = "2g"
    shuffle_partitions: int = Field(4, ge=1)
    log_level: str = "WARN"
    conf: dict[str, str] = Field(default_factory=dict, description="extra spark.* settings")


StoreName = Literal["warehouse", "search", "cache"]
STORE_NAMES: tuple[StoreName, ...] = get_args(StoreName)  # the store registry's names


ViewName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
QualifiedTable = Annotated[str, Field(pattern=r"^[^.\s]+\.[^.\s]+$")]


class JoinView(BaseModel):
    """A table joined with the table one of its columns references, kept in the warehouse.

    Each row of `table` with `columns` of the `references` row whose primary key equals
    its `on` column (NULLs when there is none), named `<prefix><column>`. A change on
    either side updates the joined rows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ViewName
    table: QualifiedTable
    references: QualifiedTable
    on: str = Field(description="the column of `table` holding the referenced primary key")
    columns: list[str] = Field(min_length=1, description="the referenced table's columns")
    prefix: str | None = Field(None, description="default: `on` without _id, then _")

    @property
    def column_prefix(self) -> str:
        return self.prefix if self.prefix is not None else self.on.removesuffix("_id") + "_"


class WindowAggregate(BaseModel):
    """Rows created in `table` per tumbling window of commit time, and the sum of a column.

    A Structured Streaming aggregation with a watermark: an event whose commit time is
    older than the newest commit time seen minus `watermark` is too late and not
    counted (`cdc status` shows how many were).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ViewName
    table: QualifiedTable
    sum: str | None = Field(None, description="a numeric column to add up")
    window: str = Field("1 minute", pattern=r"^\d+ (second|minute|hour|day)s?$")
    watermark: str = Field("10 minutes", pattern=r"^\d+ (second|minute|hour|day)s?$")


class ApplySettings(BaseModel):
    """The apply job: how often it runs, how much it takes per micro-batch, where it keeps state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stores: list[StoreName] = Field(
        default_factory=lambda: list(STORE_NAMES), description="stores to keep"
    )
    trigger_interval_s: float = Field(1.0, gt=0, description="micro-batch interval")
    max_offsets_per_trigger: int = Field(200_000, ge=1, description="events per micro-batch")
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
        None, description="Delta tables' root (any Spark filesystem); default data_dir/warehouse"
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
    replication_user: str = Field("cdc_replication", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    replication_password: SecretStr = SecretStr("cdc_replication")
    heartbeat_interval_ms: int = Field(10_000, ge=100)
    snapshot_pages_per_reader: int = Field(
        4096, ge=1, description="a table is split into CTID ranges of this many 8 KiB pages"
    )
    delete_retention_ms: int = Field(
        86_400_000, ge=0, description="how long compaction keeps a tombstone"
    )
    segment_ms: int = Field(
        3_600_000, ge=60_000, description="segment roll time: bounds how long before compaction"
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


def _default_java_home() -> Path:
    env = os.environ.get("JAVA_HOME")
    for candidate in (
        Path("/usr/lib/jvm/java-17-openjdk-amd64"),
        *sorted(Path("/usr/lib/jvm").glob("java-17-openjdk*")),
        *([Path(env)] if env else []),
    ):
        if (candidate / "bin" / "java").exists():
            return candidate
    java = shutil.which("java")
    return Path(java).resolve().parent.parent if java else Path("/usr/lib/jvm/default-java")


class Settings(BaseSettings):
    """Everything `cdc` reads. Frozen: build a new one to change a value."""

    model_config = SettingsConfigDict(
        env_prefix="CDC_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        toml_file=None,
    )

    data_dir: Path = Field(
        PROJECT_ROOT / ".data", description="state of the local stack: one folder per component"
    )
    cache_dir: Path = Field(
        PROJECT_ROOT / ".cache", description="installed JVM artifacts (written by the install step)"
    )
    java_home: Path = Field(default_factory=_default_java_home, description="JDK 17+ for the JVMs")
    service_user: str = Field(
        "cdc", description="unprivileged user that runs PostgreSQL and OpenSearch when cdc is root"
    )
    postgres: PostgresSettings = PostgresSettings()
    kafka: KafkaSettings = KafkaSettings()
    connect: ConnectSettings = ConnectSettings()
    opensearch: OpenSearchSettings = OpenSearchSettings()
    redis: RedisSettings = RedisSettings()
    spark: SparkSettings = SparkSettings()
    pipeline: PipelineSettings = PipelineSettings()
    apply: ApplySettings = ApplySettings()

    @field_validator("data_dir", "cache_dir", "java_home")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _config_file()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)

    def masked(self) -> dict[str, Any]:
        """The settings as plain data, secrets replaced by `**********`."""
        return self.model_dump(mode="json")

    @cached_property
    def jvm_dir(self) -> Path:
        return self.cache_dir / "jvm"


def _config_file() -> Path | None:
    named = os.environ.get("CDC_CONFIG")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(f"CDC_CONFIG names {path}, which is not a file: fix the path")
        return path
    default = Path.cwd() / "cdc.toml"
    return default if default.is_file() else None


def load_settings(**overrides: Any) -> Settings:
    """Read the settings, turning any invalid value into one readable ConfigError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        env = "CDC_" + "__".join(str(part) for part in first["loc"]).upper()
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(
            f"invalid setting {where}: {first['msg']}{more}; fix it in cdc.toml or {env}"
        ) from None
    except ValueError as exc:  # a malformed TOML file
        raise ConfigError(f"cannot read the settings file: {exc}") from None
