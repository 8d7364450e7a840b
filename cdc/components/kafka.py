"""One Apache Kafka broker in KRaft mode (broker and controller in one process)."""

from __future__ import annotations

import base64
import subprocess
import uuid
from typing import Any

from cdc.clients import kafka_admin
from cdc.components._jvm import (
    LOG4J2_PROPERTIES,
    heap_flags,
    jar_version,
    java,
    kafka_lib,
    write_properties,
)
from cdc.components.base import Component
from cdc.errors import ComponentError
from cdc.settings import KafkaSettings

__all__ = ["Kafka"]


class Kafka(Component):
    name = "kafka"
    start_timeout = 90.0

    @property
    def section(self) -> KafkaSettings:
        return self.settings.kafka

    @property
    def address(self) -> str:
        return self.section.bootstrap_servers

    def ports(self) -> list[int]:
        return [self.section.port, self.section.controller_port]

    def check_installed(self) -> None:
        java(self.settings)
        kafka_lib(self.settings)

    def _classpath(self) -> str:
        return str(kafka_lib(self.settings) / "*")

    def prepare(self) -> None:
        host, port, cport = self.section.host, self.section.port, self.section.controller_port
        log_dir = self.state_dir / "data"
        write_properties(
            self.state_dir / "server.properties",
            {
                "process.roles": "broker,controller",
                "node.id": 1,
                "controller.quorum.voters": f"1@{host}:{cport}",
                "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
                "advertised.listeners": f"PLAINTEXT://{host}:{port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": log_dir,
                "num.partitions": 1,
                "offsets.topic.replication.factor": 1,
                "transaction.state.log.replication.factor": 1,
                "transaction.state.log.min.isr": 1,
                "share.coordinator.state.topic.replication.factor": 1,
                "share.coordinator.state.topic.min.isr": 1,
                "group.initial.rebalance.delay.ms": 0,
                "auto.create.topics.enable": "false",
                # compaction runs often enough to see it work on a laptop
                "log.cleaner.backoff.ms": 5000,
            },
        )
        (self.state_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        if (log_dir / "meta.properties").exists():
            return
        cluster_id = "-"
        while cluster_id.startswith("-"):  # as Kafka's own Uuid: "-..." would read as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        proc = subprocess.run(
            [
                java(self.settings),
                "-cp",
                self._classpath(),
                *self._log_flags(),
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                cluster_id,
                "--config",
                str(self.state_dir / "server.properties"),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            self.log_file.write_text(proc.stdout + proc.stderr)
            last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise ComponentError(
                f"kafka: formatting the storage failed ({last[:200]}); see {self.log_file}"
            )

    def _log_flags(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile=file:{self.state_dir / 'log4j2.properties'}"]

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [
            java(self.settings),
            *heap_flags(self.section.heap),
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            *self._log_flags(),
            f"-Dkafka.logs.dir={self.state_dir}",
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(self.state_dir / "server.properties"),
        ], {}

    def ready(self) -> bool:
        admin = kafka_admin(self.address, 3000)
        try:
            cluster = admin.describe_cluster()
            return bool(cluster.get("brokers"))
        finally:
            admin.close()

    def version(self) -> str | None:
        if self.managed:
            return jar_version(kafka_lib(self.settings), "kafka_2.13")
        return None

    def details(self) -> dict[str, Any]:
        admin = kafka_admin(self.address, 3000)
        try:
            topics = admin.list_topics()
        finally:
            admin.close()
        return {"topics": len([t for t in topics if not t.startswith("__")])}
