"""The local stack as a whole: bring it up, ask it, bring it down.

Start order: PostgreSQL, Kafka, OpenSearch and Redis are launched together
(each then asked until it answers); Kafka Connect starts once Kafka answers.
If any component fails, every component this call started is stopped again.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from cdc.components import Component, ComponentStatus, Connect, Kafka, OpenSearch, Postgres, Redis
from cdc.errors import ComponentError
from cdc.settings import Settings

__all__ = ["Stack"]

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


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

    def up(self, progress: Progress = lambda _: None) -> None:
        """Start every managed component that is not running; wait until all answer."""
        managed = [c for c in self.components if c.managed]
        to_start = [c for c in managed if c.pid() is None]
        for component in to_start:
            component.check_installed()
        for component in to_start:
            component.check_ports()
        started: list[Component] = []

        def start(component: Component) -> None:
            progress(f"starting {component.name} on {component.address}")
            component.start()
            started.append(component)
            progress(f"{component.name} is ready")

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

    def down(self, purge: bool = False, progress: Progress = lambda _: None) -> list[str]:
        """Stop every managed component, Connect first, PostgreSQL last. Returns their names."""
        stopped = []
        for component in [self.connect, self.opensearch, self.redis, self.kafka, self.postgres]:
            if component.managed and component.stop():
                progress(f"stopped {component.name}")
                stopped.append(component.name)
        if purge:
            for component in self.components:
                if component.managed and component.state_dir.exists():
                    shutil.rmtree(component.state_dir)
                    progress(f"deleted {component.state_dir}")
        return stopped

    def status(self) -> list[ComponentStatus]:
        with ThreadPoolExecutor(max_workers=len(self.components)) as pool:
            return list(pool.map(lambda c: c.status(), self.components))
