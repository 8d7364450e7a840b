"""One Kafka Connect worker in distributed mode with the Debezium PostgreSQL plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc.capture import DEBEZIUM_POSTGRES
from cdc.components._jvm import (
    LOG4J2_PROPERTIES,
    heap_flags,
    java,
    kafka_lib,
    write_properties,
)
from cdc.components.base import Component
from cdc.connect import ConnectClient
from cdc.errors import INSTALL_HINT, NotInstalledError
from cdc.settings import ConnectSettings

__all__ = ["CONVERTERS", "Connect"]

# Keys and values are JSON without embedded schemas (the apply job reads each table's
# schema from the Postgres catalog). docker-compose.yml sets the same; a test checks it.
CONVERTERS = {
    "key.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "key.converter.schemas.enable": "false",
    "value.converter.schemas.enable": "false",
}


class Connect(Component):
    name = "connect"
    start_timeout = 120.0

    @property
    def section(self) -> ConnectSettings:
        return self.settings.connect

    @property
    def address(self) -> str:
        return self.section.url

    def ports(self) -> list[int]:
        return [self.section.port]

    @property
    def plugin_path(self) -> Path:
        return self.settings.jvm_dir / "connect-plugins"

    def check_installed(self) -> None:
        java(self.settings)
        kafka_lib(self.settings)
        if not any(
            (self.plugin_path / "debezium-connector-postgres").glob(
                "debezium-connector-postgres-*.jar"
            )
        ):
            raise NotInstalledError(
                "the Debezium PostgreSQL connector is not installed "
                f"(nothing in {self.plugin_path}): {INSTALL_HINT}"
            )

    def prepare(self) -> None:
        group = self.section.group_id
        write_properties(
            self.state_dir / "worker.properties",
            {
                "bootstrap.servers": self.settings.kafka.bootstrap_servers,
                "group.id": group,
                **CONVERTERS,
                "config.storage.topic": f"_{group}-configs",
                "offset.storage.topic": f"_{group}-offsets",
                "status.storage.topic": f"_{group}-status",
                "config.storage.replication.factor": 1,
                "offset.storage.replication.factor": 1,
                "status.storage.replication.factor": 1,
                "offset.flush.interval.ms": 1000,
                "listeners": f"http://{self.section.host}:{self.section.port}",
                "rest.advertised.host.name": self.section.host,
                "rest.advertised.port": self.section.port,
                "plugin.path": self.plugin_path,
                "plugin.discovery": "hybrid_warn",
                # connector secrets live in files (${file:path:key}), not in the REST API
                "config.providers": "file",
                "config.providers.file.class": (
                    "org.apache.kafka.common.config.provider.FileConfigProvider"
                ),
                # Debezium writes only to topics the project creates with the right settings
                "topic.creation.enable": "true",
            },
        )
        (self.state_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [
            java(self.settings),
            *heap_flags(self.section.heap),
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile=file:{self.state_dir / 'log4j2.properties'}",
            "-cp",
            str(kafka_lib(self.settings) / "*"),
            "org.apache.kafka.connect.cli.ConnectDistributed",
            str(self.state_dir / "worker.properties"),
        ], {}

    def client(self) -> ConnectClient:
        return ConnectClient(self.section.url, timeout=5.0)

    def ready(self) -> bool:
        client = self.client()
        client.connectors()  # answers only once the worker has joined its group
        return DEBEZIUM_POSTGRES in client.plugins()

    def version(self) -> str | None:
        return str(self.client().info().get("version"))

    def details(self) -> dict[str, Any]:
        connectors = {}
        for name, entry in self.client().connectors().items():
            status = entry.get("status", {})
            connectors[name] = {
                "state": status.get("connector", {}).get("state"),
                "tasks": [t.get("state") for t in status.get("tasks", [])],
            }
        return {"connectors": connectors}
