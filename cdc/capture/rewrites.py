"""DDL that changes stored values without a change event.

`ALTER TABLE … ADD COLUMN c … DEFAULT x` gives every existing row the value x, a type
change (`ALTER COLUMN c TYPE …`) rewrites every value, `DROP COLUMN` (or `RENAME
COLUMN`) removes one, and `ALTER TYPE … RENAME VALUE` changes an enum's label in every
row that holds it, yet PostgreSQL's logical decoding emits no row change for any:
the stores would keep NULL, the old value, or the dropped column's.
Each table's columns are recorded (at the snapshot, then by the apply job); when a
micro-batch reads a catalog whose columns changed that way, the table is backfilled
through the log once (all stores take the backfill from the topic), or, when
`apply.backfill_rewritten_tables` is off or the backfill cannot start, one line names
the command to run.
"""

from __future__ import annotations

import fcntl
import json
import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.core.catalog import Table
from cdc.core.say import Say
from cdc.core.settings import Settings
from cdc.core.state_folders import make_state_dir

__all__ = [
    "Rewrite",
    "act_on_rewrites",
    "check_rewrites",
    "find_rewrites",
    "record_schemas",
    "rewrites",
    "schema_of",
    "schemas_file",
]

log = logging.getLogger(__name__)

Schema = dict[str, list[Any]]  # column -> [type, has a default(, an enum's labels)]

_INTEGERS = {"smallint", "integer", "bigint"}
_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
_VARCHAR = re.compile(r"^character varying(\(\d+\))?$")


def schemas_file(settings: Settings) -> Path:
    return settings.data_dir / "checkpoints" / settings.pipeline.name / "schemas.json"


# a column the pipeline leaves out (pipeline.table), as recorded
EXCLUDED = ["excluded"]
# the row filter's and the masks' entries: no column's name is empty or holds a NUL
ROW_FILTER = ""
MASKS = "\x00masks"


def schema_of(table: Table) -> Schema:
    schema: Schema = {
        c.name: [c.type, c.has_default, *([list(c.labels)] if c.labels else [])]
        for c in table.columns
    }
    schema.update((name, EXCLUDED) for name in table.excluded)
    if table.row_filter is not None:
        schema[ROW_FILTER] = ["where", table.row_filter]
    if table.masks:
        schema[MASKS] = [list(m) for m in table.masks]
    return schema


def _same_values(before: str, after: str) -> bool:
    """Whether a type change keeps every value's text: integers widened, a varchar's
    length changed or made text, a numeric's precision changed at the same scale."""
    if before in _INTEGERS and after in _INTEGERS:
        return True
    if _VARCHAR.match(before) and (_VARCHAR.match(after) or after == "text"):
        return True
    old, new = _NUMERIC.match(before), _NUMERIC.match(after)
    return bool(old and (after == "numeric" or (new is not None and new[2] == old[2])))


def rewrites(before: Schema, table: Table) -> list[str]:
    """What changed the table's stored values without a change event, since `before`."""
    found = []
    for column in table.columns:
        old = before.get(column.name)
        if old == EXCLUDED:
            found.append(f"column {column.name} is captured now")
        elif old is None:
            # added: its rows hold its default; or, the table's columns being chosen,
            # added before `cdc setup` named it in the publication (its changes until
            # then left it out)
            if column.has_default:
                found.append(f"column {column.name} was added with a default")
            elif table.listed:
                found.append(f"column {column.name} was added")
        elif old[0] != column.type and not _same_values(old[0], column.type):
            found.append(f"column {column.name} changed type from {old[0]} to {column.type}")
        elif len(old) > 2 and (gone := [v for v in old[2] if v not in column.labels]):
            # RENAME VALUE: every row holding the old label reads the new one
            found.append(
                f"column {column.name}'s type {column.type} no longer has the value(s) "
                f"{', '.join(gone)} (renamed)"
            )
    # a dropped (or renamed) column: every stored row still holds its value, and no
    # event removes it; the backfill writes each row again without it
    names = {c.name for c in table.columns}
    for name, recorded in before.items():
        if name in (ROW_FILTER, MASKS) or name in names or recorded == EXCLUDED:
            continue
        change = "is left out now" if name in table.excluded else "was dropped"
        found.append(f"column {name} {change}")
    recorded_now = schema_of(table)
    if before.get(ROW_FILTER) != recorded_now.get(ROW_FILTER):
        # the rows it holds now are backfilled; those it no longer holds are not
        # removed by a backfill: `cdc verify --repair` removes them
        found.append(
            "its row filter changed (rows it no longer holds stay in the stores until "
            "`cdc verify --repair`)"
        )
    was = {m[0]: tuple(m) for m in before.get(MASKS) or []}
    now = {m[0]: tuple(m) for m in recorded_now.get(MASKS) or []}
    changed = {c for c in was.keys() | now.keys() if was.get(c) != now.get(c)}
    if changed & set(table.key):
        found.append(
            "its key's mask changed (rows under the key as it was masked before stay in "
            "the stores until `cdc verify --repair`)"
        )
    elif changed:
        found.append(f"the mask of {', '.join(sorted(changed))} changed")
    return found


@contextmanager
def _locked(settings: Settings) -> Iterator[dict[str, Schema]]:
    """The recorded schemas, read and written under a lock (the stores' queries, in one
    process or several, check them side by side)."""
    path = schemas_file(settings)
    if not path.parent.is_dir():  # made once (and again after `cdc down --purge`)
        make_state_dir(settings, path.parent)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            recorded: dict[str, Schema] = json.loads(path.read_text())
        except (OSError, ValueError):
            recorded = {}
        before = json.dumps(recorded, sort_keys=True)
        yield recorded
        if json.dumps(recorded, sort_keys=True) != before:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(recorded, sort_keys=True))
            tmp.replace(path)


def record_schemas(settings: Settings, tables: Iterable[Table]) -> None:
    """Note the tables' columns as a snapshot read them."""
    with _locked(settings) as recorded:
        for table in tables:
            recorded[table.qualified] = schema_of(table)


@dataclass(frozen=True)
class Rewrite:
    """A table whose stored values changed without change events (DDL), and how: what
    the apply job acts on (act_on_rewrites), never a micro-batch itself."""

    table: Table
    why: str


def find_rewrites(settings: Settings, tables: Iterable[Table]) -> list[Rewrite]:
    """The tables whose columns differ from those recorded in a way that changed their
    stored values; a table seen for the first time is recorded as it is."""
    found = []
    with _locked(settings) as recorded:
        for table in tables:
            now = schema_of(table)
            before = recorded.get(table.qualified)
            if before is None:
                recorded[table.qualified] = now
                continue
            changes = rewrites(before, table) if before != now else []
            if changes:
                found.append(Rewrite(table, "; ".join(changes)))
            elif before != now:
                recorded[table.qualified] = now  # changed, and no stored value with it
    return found


def act_on_rewrites(settings: Settings, found: Iterable[Rewrite], say: Say) -> list[str]:
    """Backfill (once) each table of `found` that still differs from what is recorded
    (another process may have acted on it meanwhile), then record it; the tables acted on.
    A backfill that cannot start yet leaves it to be found and acted on again."""
    acted = []
    with _locked(settings) as recorded:
        for rewrite in found:
            table = rewrite.table
            if recorded.get(table.qualified) == schema_of(table):
                continue  # acted on already
            if not _backfill(settings, table, rewrite.why, say):
                continue
            recorded[table.qualified] = schema_of(table)
            acted.append(table.qualified)
    return acted


def check_rewrites(settings: Settings, tables: Iterable[Table], say: Say) -> list[str]:
    """find_rewrites, then act on them at once (the apply job's start): the tables
    backfilled (or told to be)."""
    return act_on_rewrites(settings, find_rewrites(settings, tables), say)


_told: dict[str, str] = {}  # table -> the last line said about it (not said again)


def _backfill(settings: Settings, table: Table, why: str, say: Say) -> bool:
    """Start the table's backfill, or say what to run; False if it is to be tried again."""
    command = f"cdc backfill {table.qualified}"
    if not settings.apply.backfill_rewritten_tables:
        say(f"{table.qualified}: {why}, which emits no change events: run `{command}`")
        return True
    from cdc.capture.backfill import start_backfill

    try:
        start_backfill(settings, table.qualified, acknowledge=False)
    except Exception as exc:  # e.g. Connect down: tried again at the next micro-batch
        line = (
            f"{table.qualified}: {why}, which emits no change events, and its backfill cannot "
            f"start yet ({str(exc).splitlines()[0][:200]}); trying again, or run `{command}`"
        )
        if _told.get(table.qualified) != line:
            _told[table.qualified] = line
            say(line)
        return False
    _told.pop(table.qualified, None)
    say(f"{table.qualified}: {why}, which emits no change events: backfill started")
    log.info("%s: backfill started after %s", table.qualified, why)
    return True
