"""Typed, frozen settings from `cdc.toml` and the `CDC_*` environment.

Precedence, highest first: explicit overrides, environment (`CDC_KAFKA__PORT=…`,
nested keys joined by `__`), the TOML file (`CDC_CONFIG`, else `./cdc.toml`),
defaults. Secrets are `SecretStr` and print as `**********`.
"""

from __future__ import annotations

import os
import re
import shutil
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PositiveFloat,
    SecretStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from cdc.core.errors import ConfigError
from cdc.core.filters import filter_problem

if TYPE_CHECKING:
    from sqlalchemy import URL

__all__ = ["PROJECT_ROOT", "STORE_NAMES", "Settings", "load_settings"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# a configuration key whose value is a secret (Spark and Hadoop settings, by name)
SECRET_KEY = re.compile(
    r"(?i)(secret|password|passwd|token|credential|jaas|private|signature|"
    r"(access|account|api|auth|encryption|sas)[._-]?key|\.key$)"
)
Port = Annotated[int, Field(ge=1, le=65535)]
Heap = Annotated[
    str, Field(pattern=r"^[1-9][0-9]*[mMgG]$", description="JVM heap, e.g. 512m or 1g")
]
SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    managed: bool = Field(
        True, description="start and stop it with `cdc up`/`cdc down`; false: use an existing one"
    )
    host: str = "127.0.0.1"


class PostgresSettings(_Section):
    port: Port = 55432
    user: str = "postgres"
    password: SecretStr = Field(
        SecretStr("postgres"),
        description="the superuser's; none on the local stack: generated into "
        "<data_dir>/secrets/postgres.password",
    )
    database: str = "cdc"
    connector_host: str | None = Field(
        None, description="host Kafka Connect reaches PostgreSQL at, if not `host` (containers)"
    )
    connector_port: Port | None = Field(None, description="port Kafka Connect reaches it at")
    sslmode: SslMode = Field(
        "prefer",
        description="libpq sslmode of every connection to it (cdc's, the replication role's, "
        "Spark's and Debezium's): verify-full checks the certificate and the host name",
    )
    ca_file: Path | None = Field(
        None,
        description="CA bundle that signed the server's certificate (libpq sslrootcert); "
        "none: the system's trust store",
    )
    cert_file: Path | None = Field(
        None, description="local stack: the server's certificate (PEM); with key_file, TLS only"
    )
    key_file: Path | None = Field(None, description="local stack: the server's private key (PEM)")
    version: int | None = Field(
        None,
        ge=14,
        le=18,
        description="local stack: the PostgreSQL major it runs, 14 to 18 (./install.sh "
        "fetches 14, 16, 17 and 18; 15 is Debian's package); none: the newest the "
        "machine's packages give",
    )
    standbys: list[str] = Field(
        default_factory=list,
        description="host:port of physical standbys: `cdc status` says whether each holds "
        "the pipeline's failover slot, synchronized (PostgreSQL 17+)",
    )
    max_slot_wal_keep_size: str = Field(
        "4GB",
        pattern=r"^(-1|[1-9][0-9]*(kB|MB|GB|TB))$",
        description="local stack: WAL a replication slot may keep before PostgreSQL "
        "invalidates it (the slot is then lost and needs a new snapshot); -1: no limit",
    )

    @field_validator("standbys")
    @classmethod
    def _standbys(cls, value: list[str]) -> list[str]:
        for address in value:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{address!r} is not host:port")
        return value

    def at(self, address: str) -> PostgresSettings:
        """These settings for the server at `address` (host:port), a standby of this one."""
        host, _, port = address.rpartition(":")
        return self.model_copy(update={"host": host.strip("[]"), "port": int(port)})

    def dsn(self, database: str | None = None) -> str:
        """A libpq connection string as the configured user (holds the password: never
        print it)."""
        return self.conninfo(self.user, self.password, database)

    def conninfo(
        self, user: str, password: SecretStr | None, database: str | None = None, **extra: str
    ) -> str:
        """A libpq connection string built by libpq's rules (psycopg quotes every value,
        so a password with a space or a quote works); holds the password: never print it."""
        from psycopg.conninfo import make_conninfo

        params: dict[str, str | int] = {
            "host": self.host,
            "port": self.port,
            "dbname": database or self.database,
            "user": user,
            **extra,
        }
        if password is not None:
            params["password"] = password.get_secret_value()
        return make_conninfo("", **params, **self.ssl_params())

    def ssl_params(self) -> dict[str, str]:
        """libpq's TLS parameters of every connection to it: sslmode and sslrootcert (the
        CA file; with verify-full and no CA file, `system`: the system's trust store)."""
        params: dict[str, str] = {"sslmode": self.sslmode}
        if self.ca_file is not None:
            params["sslrootcert"] = str(self.ca_file)
        elif self.sslmode == "verify-full":
            params["sslrootcert"] = "system"
        return params

    def jdbc_ssl_params(self) -> dict[str, str]:
        """The same for the PostgreSQL JDBC driver (Spark's reads; Debezium's as
        `database.*`): it reads the CA file itself, from its own machine."""
        params: dict[str, str] = {"sslmode": self.sslmode}
        if self.ca_file is not None:
            params["sslrootcert"] = str(self.ca_file)
        elif self.sslmode == "verify-full":
            params["sslfactory"] = "org.postgresql.ssl.DefaultJavaSSLFactory"
        return params

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _absolute_path(cls, value: Path | None) -> Path | None:
        return value.expanduser().absolute() if value is not None else None

    @model_validator(mode="after")
    def _check_tls(self) -> PostgresSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file (the local server's), or neither")
        if self.ca_file is not None and self.sslmode not in ("verify-ca", "verify-full"):
            raise ValueError(
                f"ca_file is set but sslmode {self.sslmode} does not check the server's "
                "certificate: set sslmode to verify-full"
            )
        if self.sslmode == "verify-ca" and self.ca_file is None:
            raise ValueError(
                "sslmode verify-ca needs ca_file (without one, use verify-full: the system's "
                "trust store)"
            )
        if self.cert_file is not None and self.sslmode == "disable":
            raise ValueError(
                "with cert_file the local server admits TLS connections only, which sslmode "
                "disable never makes: set sslmode to verify-full"
            )
        return self

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
            query=self.ssl_params(),
        )


KafkaProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
KafkaSaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]


class KafkaSettings(_Section):
    """The broker every Kafka client of the pipeline talks to (Connect, Debezium, Spark,
    kafka-python), and how they authenticate to it."""

    port: Port = 59092
    controller_port: Port = 59093
    heap: Heap = "768m"
    max_message_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024 * 1024,
        le=256 * 1024 * 1024,
        description=(
            "the largest change event (a row as JSON) Kafka takes: the local broker, every "
            "topic of the pipeline and every producer (Debezium, the snapshot) are set to it"
        ),
    )
    oversized: Literal["stop", "dead_letter"] = Field(
        "stop",
        description=(
            "a change event over max_message_bytes: stop (capture stops at it, nothing "
            "after it is lost, until the limit is raised) or dead_letter (its key, position "
            "and size go to the dead-letter topic, the stores keep the row as it was, "
            "capture goes on; `cdc dlq replay` finishes it once the limit is raised)"
        ),
    )
    security_protocol: KafkaProtocol = Field(
        "PLAINTEXT", description="SASL_SSL: TLS and a SASL login; SSL: TLS only"
    )
    sasl_mechanism: KafkaSaslMechanism = Field(
        "SCRAM-SHA-512", description="with SASL_*; the local broker supports the SCRAM ones"
    )
    username: str | None = Field(None, description="SASL user (the local broker creates it)")
    password: SecretStr | None = Field(None, description="SASL password")
    ca_file: Path | None = Field(
        None, description="PEM CA bundle that signed the broker's certificate; none: system trust"
    )
    cert_file: Path | None = Field(
        None, description="local broker: its PEM certificate (chain); TLS is on when set"
    )
    key_file: Path | None = Field(
        None, description="local broker: the PEM private key (PKCS#8, unencrypted) of cert_file"
    )

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _a_file(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        value = value.expanduser().absolute()
        if not value.is_file():
            raise ValueError(f"{value} is not a file")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        protocol = self.security_protocol
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("kafka cert_file and key_file go together: set both or neither")
        if self.sasl and (not self.username or self.password is None):
            raise ValueError(f"security_protocol {protocol} needs a kafka username and password")
        if not self.sasl and (self.username or self.password is not None):
            raise ValueError(
                f"a kafka username/password is set but security_protocol is {protocol}: "
                "set it to SASL_SSL"
            )
        if not self.tls and (self.ca_file or self.cert_file):
            raise ValueError(
                f"a kafka ca_file/cert_file is set but security_protocol is {protocol}: "
                "set it to SSL or SASL_SSL"
            )
        if self.managed and self.tls and self.cert_file is None:
            raise ValueError(
                f"the local broker serves {protocol} only with a certificate: "
                "set kafka cert_file and key_file"
            )
        if self.managed and self.sasl and self.sasl_mechanism == "PLAIN":
            raise ValueError("the local broker authenticates with SCRAM: set a SCRAM-SHA mechanism")
        if self.managed and self.username and not re.fullmatch(r"[A-Za-z0-9._@-]+", self.username):
            raise ValueError("the local broker's kafka username takes letters, digits and ._@-")
        return self


class ConnectSettings(_Section):
    port: Port = 58083
    heap: Heap = "768m"
    group_id: str = "cdc-connect"
    secrets_dir: Path | None = Field(
        None,
        description="your own worker (managed = false): a folder cdc writes connector "
        "secrets to (0600) and the worker's FileConfigProvider reads; default: the local "
        "worker's data_dir/connect/secrets",
    )
    worker_secrets_dir: str | None = Field(
        None, description="the same folder as the worker sees it (a container's mount)"
    )
    inline_secrets: bool = Field(
        False,
        description="your own worker without a shared secrets folder: put the password in "
        "the connector config itself (Connect's config topic and REST API then show it)",
    )
    username: str | None = Field(
        None, description="your own worker's REST API user (basic authentication)"
    )
    password: SecretStr | None = Field(
        None,
        description="that user's password; the local worker's is generated "
        "(<data_dir>/secrets/connect-rest.password)",
    )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class OpenSearchSettings(_Section):
    """The search store, and how every client reaches it (https with basic auth when
    `tls`); the local node with cert_file/key_file runs the security plugin."""

    port: Port = 59200
    transport_port: Port = 59300
    heap: Heap = "768m"
    tls: bool = Field(
        False, description="https; the server's certificate is checked (ca_file, else system)"
    )
    ca_file: Path | None = Field(
        None, description="PEM CA bundle that signed the server's certificate; none: system trust"
    )
    cert_file: Path | None = Field(
        None,
        description="local node: its PEM certificate; with key_file it runs the security "
        "plugin (https and transport TLS, basic auth)",
    )
    key_file: Path | None = Field(
        None, description="local node: the PEM private key (PKCS#8, unencrypted) of cert_file"
    )
    username: str | None = Field(
        None, description="basic-auth user (the local TLS node's only user, with all access)"
    )
    password: SecretStr | None = Field(None, description="basic-auth password")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def secured(self) -> bool:
        """The local node runs with the security plugin (TLS and users)."""
        return self.cert_file is not None

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _absolute_path(cls, value: Path | None) -> Path | None:
        return value.expanduser().absolute() if value is not None else None

    @model_validator(mode="after")
    def _check_tls(self) -> OpenSearchSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file (the local node's), or neither")
        if (self.username is None) != (self.password is None):
            raise ValueError("set both username and password, or neither")
        if self.password is not None and not self.tls:
            raise ValueError("a password over http would travel in clear text: set tls = true")
        if self.cert_file is not None:
            if not self.tls:
                raise ValueError("with cert_file the local node serves https only: set tls = true")
            if self.ca_file is None:
                raise ValueError(
                    "set ca_file to the CA that signed cert_file, so clients can "
                    "check the local node's certificate"
                )
            if self.username is None:
                raise ValueError(
                    "the local node with TLS admits only its user: set username and password"
                )
        elif self.tls and self.managed:
            raise ValueError(
                "tls for the local node needs its cert_file and key_file "
                "(or managed = false for an existing cluster)"
            )
        return self


class RedisSettings(_Section):
    port: Port = 56379
    tls: bool = Field(False, description="connect over TLS (the local server: TLS only)")
    ca_file: Path | None = Field(
        None, description="CA bundle that signed the server's certificate; none: the system's"
    )
    cert_file: Path | None = Field(
        None, description="local stack: the server's certificate (PEM); needs tls = true"
    )
    key_file: Path | None = Field(None, description="local stack: the server's private key (PEM)")
    username: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="an ACL user (the local server gets it, and its default user is off)",
    )
    password: SecretStr | None = None

    @property
    def url(self) -> str:
        """Where it is, for people: no password in it."""
        scheme = "rediss" if self.tls else "redis"
        user = f"{self.username}@" if self.username else ""
        return f"{scheme}://{user}{self.host}:{self.port}/0"

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _absolute_path(cls, value: Path | None) -> Path | None:
        return value.expanduser().absolute() if value is not None else None

    @model_validator(mode="after")
    def _check_tls(self) -> RedisSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file (the local server's), or neither")
        if self.cert_file is not None and not self.tls:
            raise ValueError("cert_file is set, so the local server takes TLS only: set tls = true")
        if self.ca_file is not None and not self.tls:
            raise ValueError("ca_file is set but tls is false: set tls = true")
        if self.username is not None and self.password is None:
            raise ValueError(f"username {self.username} needs a password")
        return self


class SparkSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = Field(
        "local[*]",
        description="local[*] (this machine, twice its cores in task slots) by default; "
        "local[N] for N slots; any Spark master URL",
    )
    driver_memory: Heap = "2g"
    shuffle_partitions: int = Field(4, ge=1)
    log_level: str = "WARN"
    conf: dict[str, str] = Field(default_factory=dict, description="extra spark.* settings")


StoreName = Literal["warehouse", "search", "cache"]
STORE_NAMES: tuple[StoreName, ...] = get_args(StoreName)  # the store registry's names
# commit to visible, p99 over apply.freshness_window_s, that each store is held to
_FRESHNESS_SLO_S: dict[StoreName, float] = {"cache": 5.0, "search": 5.0, "warehouse": 30.0}


ViewName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]
QualifiedTable = Annotated[str, Field(pattern=r"^[^.\s]+\.[^.\s]+$")]


_DURATION = r"^[0-9]{1,9} (second|minute|hour|day)s?$"
_UNIT_MS = {"second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}


def duration_ms(text: str) -> int:
    """'10 minutes' -> 600000 (the settings' window and watermark form)."""
    count, unit = text.split()
    return int(count) * _UNIT_MS[unit.rstrip("s")]


# the settings that belong to one kind of view only, and that kind (the first named when
# several have it): a view of another kind naming one is told where it belongs
_KIND_OF_FIELD = {
    "when": "stream_stream",
    "within": "stream_stream",
    "slide": "hopping",
    "gap": "session",
    "group_by": "session",
    "watermark": "stream_stream",
}


class _ViewSettings(BaseModel):
    """What every derived view has: a name, the table it reads, its kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ViewName
    table: QualifiedTable
    kind: str

    @property
    def sides(self) -> tuple[str, ...]:
        """The captured tables it reads."""
        return (self.table,)

    @model_validator(mode="before")
    @classmethod
    def _fields_of_other_kinds(cls, data: Any) -> Any:
        """A setting of another kind of view is refused with the kind it is for."""
        if not isinstance(data, dict):
            return data
        what = "join" if issubclass(cls, JoinSettings) else "window"
        (kind,) = get_args(cls.model_fields["kind"].annotation)
        kept = {}
        for name, value in data.items():
            if name in cls.model_fields:
                kept[name] = value
            elif name == "window" and kind == "session":
                if value != "1 minute":  # (the default, as a dump of an older version holds it)
                    raise ValueError(
                        f"window {data.get('name')} is a session window: it has a gap, not a window"
                    )
            elif name in _KIND_OF_FIELD and value not in (None, {}, []):
                raise ValueError(
                    f"{what} {data.get('name')} is {kind}: {name} is for "
                    f'kind = "{_KIND_OF_FIELD[name]}"'
                )
            elif name not in _KIND_OF_FIELD:
                kept[name] = value  # refused as unknown
        return kept


class JoinSettings(_ViewSettings):
    """A table joined with the table one of its columns references, kept in the warehouse."""

    references: QualifiedTable
    on: str = Field(description="the column of `table` holding the referenced primary key")
    columns: list[str] = Field(
        default_factory=list, description="the referenced table's columns to carry"
    )
    prefix: str | None = Field(None, description="default: `on` without _id, then _")

    @property
    def sides(self) -> tuple[str, ...]:
        return (self.table, self.references)

    @property
    def carried(self) -> list[str]:
        """The view's names of the referenced columns it carries."""
        return [self.column_prefix + c for c in self.columns]

    @property
    def column_prefix(self) -> str:
        if self.prefix is not None:
            return self.prefix
        return self.on.removesuffix("_id") + "_"

    @model_validator(mode="after")
    def _carries_a_column(self) -> JoinSettings:
        if not self.columns:
            raise ValueError(f"join {self.name}: name at least one column to carry")
        return self


class TableJoin(JoinSettings):
    """kind `table` (a table-table join): each row of `table` with `columns` of the
    `references` row whose primary key equals its `on` column (NULLs when there is
    none), named `<prefix><column>`. A change on either side updates the joined rows."""

    kind: Literal["table"] = "table"


class StreamTableJoin(JoinSettings):
    """kind `stream_table` (an enrichment): each row ever inserted into `table` (an
    event: it stays when the row is later changed or deleted) with `columns` of the
    `references` row as it was when the insert committed, at the insert's position in
    the source: a later change of the referenced row never rewrites it."""

    kind: Literal["stream_table"]


class StreamStreamJoin(JoinSettings):
    """kind `stream_stream` (two streams within a window): each row inserted into
    `table` (the start) with the first later change of a `references` row whose `on`
    column holds the start's key and whose values match `when` (the end), committed at
    most `within` after the start; a start with no end within is kept as such once the
    watermark has passed its window. `references` may be `table` itself (on = its key)."""

    kind: Literal["stream_stream"]
    on: str = Field(description="the column of `references` holding `table`'s key")
    prefix: str | None = Field(None, description="default: end_")
    when: dict[str, list[str]] = Field(
        default_factory=dict,
        description="the end's columns and the values (as text) one of which each must "
        'hold, e.g. {status = ["shipped", "cancelled"]}',
    )
    within: str = Field(pattern=_DURATION, description="the longest start-to-end time")
    watermark: str = Field(
        "10 minutes",
        pattern=_DURATION,
        description="how late an event may come (older ones are counted, not joined)",
    )

    @property
    def column_prefix(self) -> str:
        return "end_" if self.prefix is None else self.prefix

    @model_validator(mode="before")
    @classmethod
    def _within_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("within") is None:
            raise ValueError(
                f'join {data.get("name")} is stream_stream: set within (e.g. "30 minutes")'
            )
        return data

    @model_validator(mode="after")
    def _carries_a_column(self) -> StreamStreamJoin:  # an end may carry nothing
        for column, values in self.when.items():
            if not values:
                raise ValueError(f"join {self.name}: when.{column} names no value")
        return self


class WindowSettings(_ViewSettings):
    """Rows created in `table` per window of commit time, and the sum of a column: a
    Structured Streaming aggregation with a watermark. An event whose commit time is
    older than the newest commit time seen minus `watermark` is too late and not
    counted (`cdc status` shows how many were)."""

    sum: str | None = Field(None, description="a numeric column to add up")
    watermark: str = Field("10 minutes", pattern=_DURATION)

    @property
    def key(self) -> list[str]:
        """The columns that name one window in its table."""
        return ["window_start"]


class _Sized(WindowSettings):
    window: str = Field("1 minute", pattern=_DURATION, description="its length")

    @property
    def step(self) -> str:
        """How often a window starts."""
        return self.window

    @model_validator(mode="after")
    def _longer_than_zero(self) -> _Sized:
        if duration_ms(self.window) == 0:
            raise ValueError(f"window {self.name}: its window must be longer than 0")
        return self


class TumblingWindow(_Sized):
    """kind `tumbling`: windows of `window` one after the other, kept as they fill."""

    kind: Literal["tumbling"] = "tumbling"


class HoppingWindow(_Sized):
    """kind `hopping`: windows of `window` starting every `slide` (an event is in each
    window that holds its time), kept as they fill."""

    kind: Literal["hopping"]
    slide: str = Field(pattern=_DURATION, description="how often a window starts")

    @model_validator(mode="before")
    @classmethod
    def _slide_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("slide") is None:
            raise ValueError(f"window {data.get('name')} is hopping: set its slide")
        return data

    @property
    def step(self) -> str:
        return self.slide

    @model_validator(mode="after")
    def _shorter_slide(self) -> HoppingWindow:
        if not 0 < duration_ms(self.slide) < duration_ms(self.window):
            raise ValueError(
                f"window {self.name}: slide {self.slide} must be shorter than its "
                f"window {self.window} (and not 0)"
            )
        return self


class SlidingWindow(_Sized):
    """kind `sliding`: one window ending at each creation's commit time, holding the
    creations of the `window` up to it (both ends included), kept once the watermark
    has passed its end."""

    kind: Literal["sliding"]

    @property
    def key(self) -> list[str]:
        return ["window_end"]


class SessionWindow(WindowSettings):
    """kind `session`: per value of `group_by`, creations less than `gap` apart (a
    session ends `gap` after its last creation), kept once the watermark has passed its
    end."""

    kind: Literal["session"]
    gap: str = Field(pattern=_DURATION, description="the quiet time that ends a session")
    group_by: str | None = Field(
        None, description="the column whose values have sessions of their own"
    )

    @model_validator(mode="before")
    @classmethod
    def _gap_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("gap") is None:
            raise ValueError(
                f'window {data.get("name")} is a session window: set its gap (e.g. "10 minutes")'
            )
        return data

    @model_validator(mode="after")
    def _gap_longer_than_zero(self) -> SessionWindow:
        if duration_ms(self.gap) == 0:
            raise ValueError(
                f'window {self.name} is a session window: set its gap (e.g. "10 minutes")'
            )
        return self

    @property
    def key(self) -> list[str]:
        return [*([self.group_by] if self.group_by else []), "window_start"]


def _kind(default: str, *others: str) -> Any:
    """The tag of a view's settings: its kind, `default` when it names none."""

    def tag(value: Any) -> str | None:
        if isinstance(value, dict):
            return str(value.get("kind", default))
        return getattr(value, "kind", None)  # None: not a view's settings (refused)

    kinds = ", ".join(f'"{k}"' for k in (default, *others))
    return Discriminator(
        tag,
        custom_error_type="view_kind",
        custom_error_message=f"a view is a table of settings whose kind is one of {kinds}",
    )


# a view's settings, of the class its kind selects (`[[apply.joins]]`, `[[apply.windows]]`)
JoinView = Annotated[
    Annotated[TableJoin, Tag("table")]
    | Annotated[StreamTableJoin, Tag("stream_table")]
    | Annotated[StreamStreamJoin, Tag("stream_stream")],
    _kind("table", "stream_table", "stream_stream"),
]
WindowAggregate = Annotated[
    Annotated[TumblingWindow, Tag("tumbling")]
    | Annotated[HoppingWindow, Tag("hopping")]
    | Annotated[SlidingWindow, Tag("sliding")]
    | Annotated[SessionWindow, Tag("session")],
    _kind("tumbling", "hopping", "sliding", "session"),
]
ViewSettings = JoinSettings | WindowSettings


class ApplySettings(BaseModel):
    """The apply job: how often it runs, how much it takes per micro-batch, where it keeps state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stores: list[StoreName] = Field(
        default_factory=lambda: list(STORE_NAMES), description="stores to keep"
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
    freshness_slo_s: dict[StoreName, PositiveFloat] = Field(
        default_factory=lambda: dict(_FRESHNESS_SLO_S),
        description="per store, the commit-to-visible latency its p99 over "
        "freshness_window_s (and its lag) must stay under: `cdc status` exits 1 and the "
        "metrics say so when it does not (a store left out has no SLO)",
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
    posture: Literal["local", "production"] = Field(
        "local",
        description="production: refuse any setting that leaves a component without TLS "
        "or a login (checked when the settings are read)",
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
        """The settings as plain data, secrets replaced by `**********`: the SecretStr
        fields, and every `spark.conf` value whose key names a secret (S3 keys, tokens,
        JAAS configs, passwords)."""
        data = self.model_dump(mode="json")
        conf = data["spark"]["conf"]
        for key in conf:
            if SECRET_KEY.search(key):
                conf[key] = "**********"
        return data

    @cached_property
    def jvm_dir(self) -> Path:
        return self.cache_dir / "jvm"


def admin_password_file(settings: Settings) -> Path:
    return settings.data_dir / "secrets" / "postgres.password"


def local_admin_password(settings: Settings) -> Settings:
    """The settings with the local stack's generated superuser password (made with its
    cluster: cdc.stack.components.postgres) when none is configured."""
    pg = settings.postgres
    if not pg.managed or "password" in pg.model_fields_set:
        return settings
    try:
        text = admin_password_file(settings).read_text().strip()
    except OSError:  # none (a cluster made before keeps `postgres`), or another user's
        return settings
    if not text:
        return settings
    return settings.model_copy(
        update={"postgres": pg.model_copy(update={"password": SecretStr(text)})}
    )


def _config_file() -> Path | None:
    named = os.environ.get("CDC_CONFIG")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(f"CDC_CONFIG names {path}, which is not a file: fix the path")
        return path
    default = Path.cwd() / "cdc.toml"
    return default if default.is_file() else None


def posture_problems(settings: Settings) -> list[str]:
    """What `posture = "production"` refuses: every component in use reached over TLS
    that checks the server, with a login, and no secret where others can read it."""
    if settings.posture != "production":
        return []
    problems = []
    pg = settings.postgres
    if pg.sslmode != "verify-full":
        problems.append("postgres.sslmode = verify-full")
    chosen = "password" in pg.model_fields_set or not pg.managed  # else generated locally
    if chosen and pg.password.get_secret_value() == "postgres":
        problems.append("postgres.password other than `postgres`")
    if settings.kafka.security_protocol != "SASL_SSL":
        problems.append("kafka.security_protocol = SASL_SSL")
    connect = settings.connect
    if connect.inline_secrets:
        problems.append("connect.inline_secrets = false")
    if not connect.managed and connect.password is None:
        problems.append("connect.username and .password (your worker's REST login)")
    if not connect.managed and connect.host not in ("127.0.0.1", "localhost", "::1"):
        problems.append("connect.host on this machine (its REST API is http only)")
    stores = settings.apply.stores
    if "cache" in stores and not (settings.redis.tls and settings.redis.password is not None):
        problems.append("redis.tls and redis.password")
    search = settings.opensearch
    if "search" in stores and not (search.tls and search.password is not None):
        problems.append("opensearch.tls, .username and .password")
    return problems


def load_settings(**overrides: Any) -> Settings:
    """Read the settings, turning any invalid value into one readable ConfigError."""
    try:
        settings = local_admin_password(Settings(**overrides))
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
    except RecursionError:
        raise ConfigError(
            "cannot read the settings file: it nests arrays or tables too deep"
        ) from None
    problems = posture_problems(settings)
    if problems:
        raise ConfigError(
            "posture = production needs " + "; ".join(problems) + ": set them in cdc.toml "
            "(or CDC_* variables), or posture = local for a machine of your own"
        )
    return settings
