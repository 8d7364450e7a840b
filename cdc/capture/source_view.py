"""The one door through which the apply job's micro-batches read the source side: the
captured tables and the WAL position (source_reader.py's SourceReader: one connection),
the source's lineage and timeline forks (timeline.py), the snapshot generation
(generation.py), and the tables DDL rewrote (rewrites.py). A batch only reads through
it: a rewrite comes back as an intent (rewrites.Rewrite) that the job acts on, never a
backfill started from inside a batch."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc.capture.generation import Generation, read_generation
from cdc.capture.rewrites import Rewrite, find_rewrites
from cdc.capture.source_reader import SourceReader
from cdc.capture.timeline import timeline_forks
from cdc.core.catalog import Table
from cdc.core.settings import Settings

__all__ = ["SourceBatch", "SourceView"]


@dataclass(frozen=True)
class SourceBatch:
    """What one micro-batch knows of the source side, read once at its start."""

    tables: dict[str, Table]  # the captured tables, under the names captured under
    wal: int  # the source's WAL position
    lineage: tuple[str, int | None] | None  # system identifier and timeline
    reused: list[str] = field(default_factory=list)  # names another relation has now
    relations: dict[int, str] = field(default_factory=dict)  # OID -> name now
    renamed: dict[str, str] = field(default_factory=dict)  # name now -> captured under
    rewrites: list[Rewrite] = field(default_factory=list)  # intents for the job
    generation: Generation | None = None  # the newest snapshot generation


class SourceView:
    """What a store's batches read of the source (module doc)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.reader = SourceReader(settings)

    def read_batch(self) -> SourceBatch:
        """Everything a batch reads of the source side, at once (module doc)."""
        tables, wal = self.reader.read()
        return SourceBatch(
            tables=tables,
            wal=wal,
            lineage=self.reader.lineage,
            reused=list(self.reader.reused),
            relations=dict(self.reader.relations),
            renamed=dict(self.reader.renamed),
            rewrites=find_rewrites(self.settings, tables.values()),
            generation=read_generation(self.settings),
        )

    def forks(self, timeline: int) -> dict[int, int]:
        """Per timeline the current one descends from, where it left it."""
        return timeline_forks(self.settings, timeline)

    def generation(self) -> Generation | None:
        """The newest snapshot generation, or None before the first."""
        return read_generation(self.settings)

    def close(self) -> None:
        self.reader.close()
