"""Masked columns (pipeline.table."<t>".mask): how each leaves PostgreSQL.

`hash` is the hex SHA-256 of the pipeline's salt and the value's text (UTF-8), the same
in every change event (the pipeline's Connect transform, jvm/transforms), the snapshot
and verify (cdc.mask_hash in PostgreSQL, sql/pipeline_schema.sql), so joins on a hashed
column still work. `redact` is a text, or NULL. The salt is a secret of the pipeline's,
kept in the source (cdc.mask_salts) and in the Connect worker's secrets file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from cdc.core.catalog import Table
from cdc.core.errors import SourceError
from cdc.core.settings.pipeline import PipelineSettings

__all__ = [
    "MASK_TRANSFORM",
    "masked_value",
    "read_salt",
    "salt_statement",
    "transform_masks",
]

MASK_TRANSFORM = "cdc.connect.MaskColumns"


def masked_value(table: Table, name: str) -> sql.Composable | None:
    """SQL for column `name`'s value as it leaves PostgreSQL masked (None: unmasked)."""
    mask = table.mask(name)
    if mask is None:
        return None
    mode, text = mask
    ref = sql.Identifier(name)
    if mode == "hash":  # the text the change event carries (char(n) keeps its padding)
        return sql.SQL("cdc.mask_hash({}, to_json({}) #>> '{{}}')").format(
            sql.Literal(table.pipeline), ref
        )
    if text is None:
        return sql.SQL("NULL::text")
    return sql.SQL("CASE WHEN {} IS NULL THEN NULL ELSE {} END").format(ref, sql.Literal(text))


def salt_statement(pipeline: PipelineSettings) -> sql.Composed:
    """The statement that gives the pipeline its salt once (run in the setup's
    transaction): pipeline.mask_salt, else a random one PostgreSQL makes (two version-4
    UUIDs, 244 random bits), so it is never printed."""
    name = sql.Literal(pipeline.name)
    if pipeline.mask_salt is not None:
        salt: sql.Composable = sql.Literal(pipeline.mask_salt.get_secret_value())
    else:
        salt = sql.SQL("replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')")
    return sql.SQL(
        "INSERT INTO cdc.mask_salts (pipeline, salt) SELECT {}, {} "
        "ON CONFLICT (pipeline) DO NOTHING"
    ).format(name, salt)


def read_salt(conn: psycopg.Connection[Any], pipeline: PipelineSettings) -> str:
    """The pipeline's salt; refused when pipeline.mask_salt differs from the one its
    hashes were made with."""
    row = conn.execute(
        "SELECT salt FROM cdc.mask_salts WHERE pipeline = %s", (pipeline.name,)
    ).fetchone()
    if row is None:
        raise SourceError(f"pipeline {pipeline.name} has no salt for its masks: run `cdc setup`")
    salt = str(row[0])
    configured = pipeline.mask_salt
    if configured is not None and configured.get_secret_value() != salt:
        raise SourceError(
            f"pipeline.mask_salt is not the salt pipeline {pipeline.name}'s hashes were made "
            "with: set the one it has (cdc.mask_salts), or drop the pipeline (`cdc drop`) "
            "and take a new snapshot with the new salt"
        )
    return salt


def transform_masks(
    tables: Sequence[Table], topic: Callable[[str], str], also: Sequence[str] = ()
) -> str | None:
    """The Connect transform's `masks` setting: every captured table's topic (and those
    of the tables `also` names, masking nothing), with the columns it masks (a topic it
    does not name fails the task: nothing leaves unmasked); None when no table masks a
    column."""
    if not any(t.masks for t in tables):
        return None
    masks: dict[str, dict[str, Any]] = {topic(name): {} for name in also}
    masks |= {
        topic(t.qualified): {
            column: {"mode": mode, **({"value": text} if mode == "redact" else {})}
            for column, mode, text in t.masks
        }
        for t in tables
    }
    keyed = sorted(t.qualified for t in tables if any(t.mask(k) for k in t.key))
    return json.dumps({"topics": masks, "keyed": keyed}, separators=(",", ":"), sort_keys=True)
