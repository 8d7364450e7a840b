"""Typed, frozen settings from `cdc.toml` and the `CDC_*` environment: the root, with
its sections in the modules beside it (connections, pipeline, apply, views) and the
settings file edited (file).

Precedence, highest first: explicit overrides, environment (`CDC_KAFKA__PORT=…`,
nested keys joined by `__`), the TOML file (`CDC_CONFIG`, else `./cdc.toml`),
defaults. Secrets are `SecretStr` and print as `**********`.
"""

from __future__ import annotations

import os
import shutil
import sys
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
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
from cdc.core.settings.apply import APPLY_RENAMED, ApplySettings
from cdc.core.settings.connections import (
    SECRET_KEY,
    ConnectSettings,
    KafkaSettings,
    OpenSearchSettings,
    PostgresSettings,
    RedisSettings,
    SparkSettings,
    whole_path,
)
from cdc.core.settings.pipeline import PipelineSettings
from cdc.core.settings.verify import VerifySettings
from cdc.core.store_declarations import declared

__all__ = ["PROJECT_ROOT", "Settings", "load_settings"]

PROJECT_ROOT = Path(__file__).resolve().parents[3]


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
    verify: VerifySettings = VerifySettings()
    # a store's own section (`[stores.<name>]`), of the settings class it declares
    stores: dict[str, Any] = Field(
        default_factory=dict,
        description="each store's own settings, of the class its declaration names "
        "(the built-in stores' are the sections above)",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Keys a store kept elsewhere before its own section (its declaration's
        `renamed`), and the apply job's renamed ones, read under their new names, each
        noted for one deprecation line (`deprecations`)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        moves: list[tuple[str, tuple[str, ...]]] = [
            (f"apply.{old}", ("apply", new)) for old, new in APPLY_RENAMED.items()
        ]
        for declaration in declared().values():
            moves += [
                (old, ("stores", declaration.name, new)) for old, new in declaration.renamed.items()
            ]
        for old, new in moves:
            top, _, key = old.partition(".")
            section = data.get(top)
            if not isinstance(section, dict) or key not in section:
                continue
            section = dict(section)
            value = section.pop(key)
            data[top] = section
            where = f"[{'.'.join(new[:-1])}] {new[-1]}"
            _DEPRECATED.setdefault(
                old, f"{old} is deprecated: set {where} instead (read as it for this release)"
            )
            target = data
            for part in new[:-1]:
                held = target.get(part)
                if isinstance(held, BaseModel):
                    held = held.model_dump(exclude_unset=True)
                held = dict(held) if isinstance(held, dict) else {}
                target[part] = held
                target = held
            target.setdefault(new[-1], value)
        return data

    @field_validator("stores")
    @classmethod
    def _own_sections(cls, sections: dict[str, Any]) -> dict[str, Any]:
        """Each store's own section, validated by the settings class the store declares."""
        declarations = declared()
        checked = {}
        for name, section in sections.items():
            model = declarations[name].settings if name in declarations else None
            if model is None:
                raise ValueError(f"store {name} has no settings of its own (or is not installed)")
            checked[name] = section if isinstance(section, model) else model.model_validate(section)
        return checked

    def store_section(self, name: str) -> Any:
        """Store `name`'s own settings (its declared class's defaults when not given)."""
        model = declared()[name].settings
        if model is None:
            raise ConfigError(f"store {name} has no settings of its own")
        return self.stores.get(name) or model()

    @field_validator("data_dir", "cache_dir", "java_home")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return whole_path(value)

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


# a renamed key read (Settings._renamed_keys) -> its deprecation line; the lines said
_DEPRECATED: dict[str, str] = {}
_SAID: set[str] = set()


def deprecations() -> list[str]:
    """The deprecation lines of the renamed keys the settings read, in this process."""
    return list(_DEPRECATED.values())


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
        try:
            path = whole_path(Path(named))
        except ValueError as exc:
            raise ConfigError(f"CDC_CONFIG: {exc}") from None
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
        problems.append("connect.username and .password (your workers' REST login)")
    if not connect.managed and connect.remote and not connect.tls:
        problems.append(
            f"connect.tls = true (https, with ca_file) for the workers on other hosts "
            f"({', '.join(connect.remote)}): the login crosses the network"
        )
    declarations = declared()
    for store in settings.apply.stores:
        posture = declarations[store].posture
        if posture and (problem := posture(settings)):
            problems.append(problem)
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
    for line in deprecations():  # each once per process
        if line not in _SAID:
            _SAID.add(line)
            print(f"cdc: {line}", file=sys.stderr)
    return settings
