"""One exception root, with subclasses by what the user can do about it.

Every message is one line a person understands: what is wrong and what to do.
Messages never contain a secret.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "INSTALL_HINT",
    "BackfillError",
    "CdcError",
    "ComponentError",
    "ConfigError",
    "ConnectorError",
    "LogRewoundError",
    "NotInstalledError",
    "PortInUseError",
    "QueryError",
    "SnapshotError",
    "SourceError",
    "SourceRewoundError",
    "SourceUnavailableError",
    "StoreBusyError",
    "StoreError",
    "StoreUnavailableError",
    "TopicError",
    "ValueDecodeError",
    "VerifyError",
    "carried_message",
    "unanswered",
]


class CdcError(Exception):
    """Root of every error this project raises on purpose. Each subclass has its own exit
    code (a subclass that refines another shares its parent's); the README lists them."""

    exit_code = 1  # verify found drift (its report, not an exception, says so)

    def __str__(self) -> str:
        # one line, whatever it quotes: a control character in a name or value someone
        # typed (a line break in a TOML key, a table pattern) shows escaped
        text = super().__str__()
        if text.isprintable():
            return text
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ConfigError(CdcError):
    """A setting is missing or invalid: fix cdc.toml or the CDC_* environment."""

    exit_code = 2


INSTALL_HINT = "run `make install`"  # what a NotInstalledError tells to do


class NotInstalledError(CdcError):
    """A component's binaries are not on this machine: run the install step."""

    exit_code = 3


class PortInUseError(CdcError):
    """A port a component needs is taken: free it or configure another one."""

    exit_code = 4


class ComponentError(CdcError):
    """A component failed to start, stopped, or does not answer."""

    exit_code = 5


class SourceUnavailableError(ComponentError):
    """PostgreSQL does not answer (down, restarting): `cdc apply` waits for it."""

    exit_code = 5


class ConnectorError(CdcError):
    """Kafka Connect refused or failed a connector."""

    exit_code = 6


class SourceError(CdcError):
    """The source database is not as the pipeline needs it (a table, a key, a privilege)."""

    exit_code = 7


class RelationReusedError(SourceError):
    """A captured name belongs to another captured relation now (tables swapped): the
    apply job holds its batches until `cdc setup` cuts and backfills it."""


class StoreError(CdcError):
    """A store refused what the apply job had to do (a write, a schema change)."""

    exit_code = 8


class StoreUnavailableError(StoreError):
    """A store does not answer (refused, timed out, 5xx, 429): its apply waits and retries;
    nothing is committed or dropped meanwhile."""

    exit_code = 8


class StoreBusyError(StoreUnavailableError):
    """A store that takes one writing process at a time (the warehouse on S3) is being
    written by another (cdc.core.one_writer): said when a writer starts, not waited for."""

    exit_code = 8


class LogRewoundError(CdcError):
    """A change topic no longer holds what a store has applied (deleted and created
    again): the store must be rebuilt from the log (`cdc rebuild`)."""

    exit_code = 11


class SourceRewoundError(LogRewoundError):
    """PostgreSQL's WAL is behind what a store has applied (the database was restored
    from a backup or replaced): its new changes would be refused as older."""

    exit_code = 11


class QueryError(CdcError):
    """A query names what is not there, or is not valid."""

    exit_code = 9


class VerifyError(CdcError):
    """Verification could not be made (a store behind the cut, a component down)."""

    exit_code = 10


class SnapshotError(CdcError):
    """The snapshot cannot run as asked."""

    exit_code = 12


class BackfillError(CdcError):
    """A backfill cannot start, or it was aborted."""

    exit_code = 13


class TopicError(CdcError):
    """A topic exists but not as the pipeline needs it (other partitions, not compacted)."""

    exit_code = 14


class ValueDecodeError(CdcError):
    """A change event holds a value its column's encoding cannot be: dead-letter the
    record for the store that decodes it; other records and stores keep going."""

    exit_code = 15

    def __init__(self, column: str, value: Any, reason: str) -> None:
        self.column, self.value, self.reason = column, value, reason
        super().__init__(f"column {column}: cannot decode {str(value)[:80]!r}: {reason}")


def carried_message(exc: BaseException, kind: type[CdcError]) -> str | None:
    """The message of a `kind` error (or of a subclass's) that `exc` is, or that it
    carries as text: raised in a Python worker or in foreachBatch, Spark hands the
    driver the traceback's text, whose last `<Kind>: <message>` line tells it. None when
    `exc` says nothing of that kind."""
    if isinstance(exc, kind):
        return str(exc)
    text = str(exc)
    kinds, found = [kind], -1
    while kinds:
        one = kinds.pop()
        kinds.extend(one.__subclasses__())
        found = max(found, text.rfind(f"{one.__name__}: "))
    if found < 0:
        return None
    rest = text[found:]
    return rest[rest.index(": ") + 2 :].splitlines()[0].strip()


# the errors of the components' clients that mean they could not be reached (refused,
# timed out, no broker found, a login refused), by the client's module
_UNANSWERED = {
    "kafka.errors": (
        "Kafka",
        {"NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError", "NodeNotReadyError"},
    ),
    "redis.exceptions": ("Redis", {"ConnectionError", "TimeoutError", "BusyLoadingError"}),
    "opensearchpy.exceptions": ("OpenSearch", {"ConnectionError", "ConnectionTimeout"}),
    "psycopg": ("PostgreSQL", {"OperationalError"}),
    "requests.exceptions": ("Kafka Connect", {"ConnectionError", "Timeout"}),
}


def unanswered(exc: BaseException) -> ComponentError | None:
    """A component's client error that says it could not be reached, met by a command
    where it did not expect it, as one line: which component, the client's first line,
    and what to do. None for any other error (a bug keeps its traceback)."""
    for kind in type(exc).__mro__:
        component, names = _UNANSWERED.get(kind.__module__, ("", set()))
        if kind.__name__ in names:
            said = (str(exc).strip().splitlines() or [""])[0]
            said = said.removeprefix(f"{type(exc).__name__}: ")[:200]
            return ComponentError(
                f"{component} could not be reached ({type(exc).__name__}: {said}): "
                "see `cdc status`, start it (`cdc up`) or fix its settings"
            )
    return None
