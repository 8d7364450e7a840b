"""The connections: PostgreSQL, Kafka, Kafka Connect, OpenSearch, Redis and Spark, each
a section of the settings (`[postgres]`, `[kafka]`, ...), its secrets `SecretStr`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode

if TYPE_CHECKING:
    from sqlalchemy import URL

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


def whole_path(value: Path) -> Path:
    """A path setting made absolute (`~` and `~user` expanded); `~user` of a user this
    machine does not have is refused."""
    try:
        return value.expanduser().absolute()
    except RuntimeError:  # pathlib's word for it
        raise ValueError(
            f"{str(value)!r} starts with the home folder of a user this machine does not "
            "have: give the whole path"
        ) from None


def _existing_file(value: Path | None) -> Path | None:
    """A file setting made absolute; one that is not a file is refused."""
    if value is None:
        return None
    value = whole_path(value)
    if not value.is_file():
        raise ValueError(f"{value} is not a file")
    return value


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
        return whole_path(value) if value is not None else None

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


def _addresses(value: Any) -> Any:
    """host:port addresses from a list, or one string: an address, several with commas
    between, or a JSON list (as the environment gives them: CDC_KAFKA__BOOTSTRAP_SERVERS)."""
    if isinstance(value, str):
        text = value.strip()
        try:  # a JSON list, else addresses ("[::1]:9092" is one, not JSON)
            value = json.loads(text) if text.startswith('["') else None
        except ValueError:
            raise ValueError("is not a JSON list of host:port") from None
        if value is None:
            value = [part for part in text.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        return value  # pydantic says what it is not
    addresses = []
    for address in value:
        if not isinstance(address, str):
            raise ValueError(f"{address!r} is not host:port")
        address = address.strip()
        host, _, port = address.rpartition(":")
        if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{address!r} is not host:port")
        addresses.append(address)
    if len(set(addresses)) != len(addresses):
        raise ValueError("names an address twice")
    return tuple(addresses)


# a host name, an IPv4 address or an IPv6 one in brackets
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
KafkaProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
KafkaSaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]


class KafkaSettings(_Section):
    """The broker every Kafka client of the pipeline talks to (Connect, Debezium, Spark,
    kafka-python), and how they authenticate to it."""

    port: Port = 59092
    controller_port: Port = 59093
    heap: Heap = "768m"
    bootstrap_servers: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description=(
            "your own cluster (managed = false): host:port of some of its brokers, a list "
            "or one string (commas between); none: host:port"
        ),
    )
    replication_factor: int = Field(
        1,
        ge=1,
        le=32,
        description=(
            "copies of every topic the pipeline makes (change topics, truncations, "
            "signals, dead letters, Connect's own, Debezium's); the local broker: 1"
        ),
    )
    min_insync_replicas: int = Field(
        1,
        ge=1,
        le=32,
        description=(
            "copies a write must reach before Kafka acknowledges it (every producer of "
            "the pipeline waits for acks=all), at most replication_factor"
        ),
    )
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
    def brokers(self) -> tuple[str, ...]:
        """The addresses (host:port) clients first reach: bootstrap_servers, else host:port."""
        return self.bootstrap_servers or (f"{self.host}:{self.port}",)

    @property
    def bootstrap(self) -> str:
        """`bootstrap.servers` as every Kafka client takes it: the brokers, commas between."""
        return ",".join(self.brokers)

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _servers(cls, value: Any) -> Any:
        return _addresses(value)

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _a_file(cls, value: Path | None) -> Path | None:
        return _existing_file(value)

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        protocol = self.security_protocol
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"kafka min_insync_replicas {self.min_insync_replicas} is above "
                f"replication_factor {self.replication_factor}: no write could be acknowledged"
            )
        if self.managed and self.replication_factor != 1:
            raise ValueError(
                f"kafka replication_factor {self.replication_factor} needs that many brokers; "
                "the local stack runs one: set it to 1, or managed = false for your cluster"
            )
        if self.managed and self.bootstrap_servers not in ((), (f"{self.host}:{self.port}",)):
            raise ValueError(
                "kafka bootstrap_servers names brokers of your own cluster: set managed = false "
                "(the local broker is at host:port)"
            )
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

    hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description=(
            "your own Connect group (managed = false): host:port of its workers, a list or "
            "one string (commas between), each asked in turn when one does not answer; "
            "none: host:port"
        ),
    )
    tls: bool = Field(
        False,
        description="https to the REST API; the worker's certificate is checked (ca_file, "
        "else the system's trust store)",
    )
    ca_file: Path | None = Field(
        None, description="PEM CA bundle that signed the workers' certificates; none: system trust"
    )
    cert_file: Path | None = Field(
        None,
        description="local worker: its PEM certificate (chain); with key_file and tls it "
        "serves https only",
    )
    key_file: Path | None = Field(
        None, description="local worker: the PEM private key (unencrypted) of cert_file"
    )

    @property
    def urls(self) -> tuple[str, ...]:
        """Every worker cdc may ask, in the order it asks them: hosts, else host:port."""
        scheme = "https" if self.tls else "http"
        return tuple(f"{scheme}://{a}" for a in self.hosts or (f"{self.host}:{self.port}",))

    @property
    def url(self) -> str:
        """The first of them."""
        return self.urls[0]

    @property
    def remote(self) -> tuple[str, ...]:
        """The workers' hosts that are not this machine."""
        hosts = [a.rpartition(":")[0].strip("[]") for a in self.hosts] or [self.host]
        return tuple(h for h in hosts if h not in _LOOPBACK)

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any) -> Any:
        return _addresses(value)

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _a_file(cls, value: Path | None) -> Path | None:
        return _existing_file(value)

    @model_validator(mode="after")
    def _consistent(self) -> ConnectSettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("connect.username and connect.password go together: set both")
        if self.managed and self.hosts not in ((), (f"{self.host}:{self.port}",)):
            raise ValueError(
                "connect.hosts names workers of your own Connect group: set managed = false "
                "(the local worker is at host:port)"
            )
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("connect cert_file and key_file go together: set both or neither")
        if not self.tls and (self.ca_file or self.cert_file):
            raise ValueError("a connect ca_file/cert_file is set but tls is false: set tls = true")
        if self.managed and self.tls and self.cert_file is None:
            raise ValueError(
                "the local Connect worker serves https only with a certificate: set "
                "connect.cert_file and key_file, or tls = false"
            )
        return self


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


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
    hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description=(
            "your own cluster (managed = false): host:port of its nodes, a list or one "
            "string (commas between); none: host:port"
        ),
    )
    number_of_shards: int = Field(
        1,
        ge=1,
        le=1024,
        description="primary shards of an index the pipeline makes (fixed once it is made)",
    )
    number_of_replicas: int = Field(
        0,
        ge=0,
        le=16,
        description="copies of each shard on other nodes, kept by `cdc setup` on every "
        "index of the pipeline; the local node: 0",
    )

    @property
    def urls(self) -> tuple[str, ...]:
        """Every node clients may reach: hosts, else host:port."""
        scheme = "https" if self.tls else "http"
        return tuple(f"{scheme}://{a}" for a in self.hosts or (f"{self.host}:{self.port}",))

    @property
    def url(self) -> str:
        """The first of them."""
        return self.urls[0]

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any) -> Any:
        return _addresses(value)

    @property
    def secured(self) -> bool:
        """The local node runs with the security plugin (TLS and users)."""
        return self.cert_file is not None

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _absolute_path(cls, value: Path | None) -> Path | None:
        return whole_path(value) if value is not None else None

    @model_validator(mode="after")
    def _check_tls(self) -> OpenSearchSettings:
        if self.managed and self.hosts not in ((), (f"{self.host}:{self.port}",)):
            raise ValueError(
                "opensearch hosts names nodes of your own cluster: set managed = false "
                "(the local node is at host:port)"
            )
        if self.managed and self.number_of_replicas:
            raise ValueError(
                f"opensearch number_of_replicas {self.number_of_replicas} needs that many "
                "more nodes; the local stack runs one (a replica would never be placed): "
                "set it to 0, or managed = false for your cluster"
            )
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
        return whole_path(value) if value is not None else None

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
