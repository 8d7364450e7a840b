"""One OpenSearch node (single-node discovery) from the integ-test distribution."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import requests

from cdc.components._jvm import heap_flags, java
from cdc.components.base import Component
from cdc.errors import INSTALL_HINT, NotInstalledError
from cdc.settings import OpenSearchSettings

__all__ = ["OpenSearch"]


class OpenSearch(Component):
    name = "opensearch"
    start_timeout = 150.0
    needs_service_user = True

    @property
    def section(self) -> OpenSearchSettings:
        return self.settings.opensearch

    @property
    def address(self) -> str:
        return self.section.url

    def ports(self) -> list[int]:
        return [self.section.port, self.section.transport_port]

    def home(self) -> Path:
        homes = sorted((self.settings.jvm_dir / "opensearch").glob("opensearch-*/bin/opensearch"))
        if not homes:
            raise NotInstalledError(
                f"opensearch is not installed (nothing in {self.settings.jvm_dir / 'opensearch'}): "
                f"{INSTALL_HINT}"
            )
        return homes[-1].parent.parent

    def check_installed(self) -> None:
        java(self.settings)
        self.home()

    def prepare(self) -> None:
        conf = self.state_dir / "config"
        (conf / "jvm.options.d").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.home() / "config" / "log4j2.properties", conf / "log4j2.properties")
        # the distribution's options name paths relative to its home, which is not ours to write
        options = (self.home() / "config" / "jvm.options").read_text()
        options = options.replace("file=logs/", f"file={self.state_dir / 'logs'}/")
        options = options.replace("HeapDumpPath=data", f"HeapDumpPath={self.state_dir / 'data'}")
        options = options.replace("ErrorFile=logs/", f"ErrorFile={self.state_dir / 'logs'}/")
        (conf / "jvm.options").write_text(options)
        for sub in ("data", "logs", "tmp"):
            (self.state_dir / sub).mkdir(exist_ok=True)
        (conf / "opensearch.yml").write_text(
            "cluster.name: cdc\n"
            "node.name: cdc-1\n"
            f"path.data: {self.state_dir / 'data'}\n"
            f"path.logs: {self.state_dir / 'logs'}\n"
            f"network.host: {self.section.host}\n"
            f"http.port: {self.section.port}\n"
            f"transport.port: {self.section.transport_port}\n"
            "discovery.type: single-node\n"
            # a nearly full development disk must not turn indices read-only
            "cluster.routing.allocation.disk.threshold_enabled: false\n"
        )

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [str(self.home() / "bin" / "opensearch")], {
            "OPENSEARCH_PATH_CONF": str(self.state_dir / "config"),
            "OPENSEARCH_JAVA_HOME": str(self.settings.java_home),
            "OPENSEARCH_JAVA_OPTS": " ".join(heap_flags(self.section.heap)),
            "OPENSEARCH_TMPDIR": str(self.state_dir / "tmp"),
            "JAVA_HOME": str(self.settings.java_home),
            "PATH": f"{self.settings.java_home / 'bin'}:/usr/bin:/bin",
        }

    def _get(self, path: str, **params: Any) -> dict[str, Any]:
        resp = requests.get(self.section.url + path, params=params, timeout=5)
        resp.raise_for_status()
        return dict(resp.json())

    def ready(self) -> bool:
        health = self._get("/_cluster/health", wait_for_status="yellow", timeout="1s")
        return health.get("status") in ("green", "yellow")

    def version(self) -> str | None:
        return str(self._get("/").get("version", {}).get("number"))

    def details(self) -> dict[str, Any]:
        health = self._get("/_cluster/health")
        return {"health": health.get("status"), "indices": len(self._get("/_aliases"))}
