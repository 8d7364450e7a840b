"""The local stack as a whole: bring it up, ask it, bring it down (`Stack`); its
components, each a process (components/), and how a process is started, found and
stopped (process.py). Imports core, types and capture only.

Start order: PostgreSQL, Kafka, OpenSearch and Redis are launched together
(each then asked until it answers); Kafka Connect starts once Kafka answers.
If any component fails, every component this call started is stopped again.

A purge removes, under data_dir only, the folders `cdc` made (each carries the
marker of cdc/core/state_folders.py): the managed components' state and the pipelines' state
(checkpoints, Spark's folder, a warehouse under data_dir). A folder without the
marker, a symbolic link, or anything outside data_dir is left, and said so.
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cdc.core.errors import ComponentError
from cdc.core.say import Say, quiet
from cdc.core.settings import Settings
from cdc.core.state_folders import (
    MARKER,
    PIPELINE_STATE,
    inside,
    is_marked,
    local_warehouse,
    warehouse_path,
)
from cdc.stack.components import (
    Component,
    ComponentStatus,
    Connect,
    Kafka,
    OpenSearch,
    Postgres,
    Redis,
)

__all__ = ["PurgePlan", "Stack"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PurgePlan:
    """What a purge removes (folders `cdc` made under data_dir) and what it leaves, why."""

    data_dir: Path
    remove: list[Path] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # one line per folder left

    def names(self) -> str:
        return ", ".join(p.relative_to(self.data_dir).as_posix() for p in self.remove)


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.postgres = Postgres(settings)
        self.kafka = Kafka(settings)
        self.connect = Connect(settings)
        self.opensearch = OpenSearch(settings)
        self.redis = Redis(settings)

    @property
    def components(self) -> list[Component]:
        return [self.postgres, self.kafka, self.connect, self.opensearch, self.redis]

    def up(self, say: Say = quiet) -> None:
        """Start every managed component that is not running; wait until all answer."""
        managed = [c for c in self.components if c.managed]
        to_start = [c for c in managed if c.pid() is None]
        for component in to_start:
            component.check_installed()
        for component in to_start:
            component.check_ports()
        started: list[Component] = []

        def start(component: Component) -> None:
            say(f"starting {component.name} on {component.address}")
            component.start()
            started.append(component)
            say(f"{component.name} is ready")

        first = [c for c in to_start if c is not self.connect]
        try:
            with ThreadPoolExecutor(max_workers=len(first) or 1) as pool:
                for future in [pool.submit(start, c) for c in first]:
                    future.result()
            if self.connect in to_start:
                start(self.connect)
            for component in self.components:
                if not component.managed:
                    self._expect_answer(component)
            admitted = (
                self.postgres.managed
                and self.postgres not in to_start
                and self.postgres.admit_database()
            )
            if admitted:
                say(
                    f"postgres: database {self.settings.postgres.database} admitted for "
                    "the pipelines' replication roles"
                )
        except BaseException:
            for component in reversed(self.components):
                if component in started or component in to_start:
                    component.stop()
            raise

    @staticmethod
    def _expect_answer(component: Component) -> None:
        status = component.status()
        if not status.up:
            raise ComponentError(
                f"{component.name} at {component.address} does not answer "
                f"({status.error or 'not ready'}); start it or fix the [{component.name}] settings"
            )

    def down(self, say: Say = quiet) -> list[str]:
        """Stop every managed component, Connect first, PostgreSQL last. Returns their names."""
        stopped = []
        for component in [self.connect, self.opensearch, self.redis, self.kafka, self.postgres]:
            if component.managed and component.stop():
                say(f"stopped {component.name}")
                stopped.append(component.name)
        return stopped

    def purge_plan(self) -> PurgePlan:
        """The folders a purge would remove: the managed components' state and the
        pipelines' state, each only if `cdc` made it (marked), a folder (not a link) and
        inside data_dir. Nothing is removed here."""
        data_dir = self.settings.data_dir
        plan = PurgePlan(data_dir)
        candidates = [c.state_dir for c in self.components if c.managed]
        candidates += [data_dir / name for name in PIPELINE_STATE]
        warehouse = local_warehouse(self.settings)
        if warehouse is None or not warehouse.is_relative_to(data_dir) or warehouse == data_dir:
            where = warehouse_path(self.settings)
            plan.left.append(
                f"left the warehouse at {where}: not under {data_dir}, a purge never removes "
                "it (remove its tables there yourself if the pipeline is gone)"
            )
        elif not any(warehouse.is_relative_to(c) for c in candidates):
            candidates.append(warehouse)
        for path in candidates:
            why = _why_left(path, data_dir)
            if why is not None:
                plan.left.append(f"left {path}: {why}")
            elif path.exists():
                plan.remove.append(path)
        return plan

    def purge(self, plan: PurgePlan, say: Say = quiet) -> None:
        """Remove the plan's folders (stop the stack first). The marker goes last, so that
        an interrupted purge can be run again."""
        for line in plan.left:
            say(line)
        for path in plan.remove:
            if _why_left(path, plan.data_dir) is not None:  # changed since the plan
                continue
            for child in path.iterdir():
                if child.name == MARKER:
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            shutil.rmtree(path)
            say(f"deleted {path}")

    def status(self) -> list[ComponentStatus]:
        with ThreadPoolExecutor(max_workers=len(self.components)) as pool:
            return list(pool.map(lambda c: c.status(), self.components))


def _why_left(path: Path, data_dir: Path) -> str | None:
    """Why a purge must leave this folder, or None if it may remove it (or it is not
    there)."""
    if path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)}); a purge follows no link"
    if not path.exists():
        return None
    if not path.is_dir():
        return "not a folder"
    if not inside(path, data_dir) or path.resolve() == data_dir.resolve():
        return f"it lies outside {data_dir} (through a symbolic link); a purge never goes there"
    if not is_marked(path):
        return (
            f"not made by cdc (no {MARKER} in it: a folder of your own, or made by a cdc "
            f"older than the marker); if it is the stack's, remove it yourself: rm -rf {path}"
        )
    return None
