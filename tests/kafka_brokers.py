"""Several Kafka brokers started here, from the installed Kafka: KRaft, each node a broker
and a controller (combined mode), all of them voters, on free loopback ports, each JVM
with a small heap. For the tests of Kafka as a cluster (issue 69)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cdc.core.clients import kafka_admin
from cdc.core.settings import Settings
from cdc.stack.components._jvm import java, kafka_lib
from tests.helpers import free_ports


@dataclass
class Broker:
    node_id: int
    port: int
    controller_port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Brokers:
    settings: Settings  # java_home and the installed Kafka
    folder: Path
    brokers: list[Broker] = field(default_factory=list)
    heap: str = "320m"

    @property
    def bootstrap(self) -> list[str]:
        return [b.address for b in self.brokers]

    def _command(self, broker: Broker) -> list[str]:
        return [
            str(java(self.settings)),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={broker.folder}",
            f"-Dlog4j2.configurationFile=file:{broker.folder / 'log4j2.properties'}",
            "-cp",
            str(kafka_lib(self.settings) / "*"),
        ]

    def prepare(self) -> None:
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        voters = ",".join(f"{b.node_id}@127.0.0.1:{b.controller_port}" for b in self.brokers)
        for b in self.brokers:
            b.folder.mkdir(parents=True)
            (b.folder / "log4j2.properties").write_text(
                "rootLogger.level = WARN\nrootLogger.appenderRef.stdout.ref = STDOUT\n"
                "appender.stdout.type = Console\nappender.stdout.name = STDOUT\n"
                "appender.stdout.layout.type = PatternLayout\n"
                "appender.stdout.layout.pattern = [%d] %p %m (%c)%n\n"
            )
            properties = {
                "process.roles": "broker,controller",
                "node.id": b.node_id,
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://127.0.0.1:{b.port},CONTROLLER://127.0.0.1:{b.controller_port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{b.port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": b.folder / "data",
                "num.partitions": 1,
                "offsets.topic.replication.factor": len(self.brokers),
                "transaction.state.log.replication.factor": len(self.brokers),
                "transaction.state.log.min.isr": min(2, len(self.brokers)),
                "group.initial.rebalance.delay.ms": 0,
                "auto.create.topics.enable": "false",
                "num.io.threads": 2,
                "num.network.threads": 2,
                "background.threads": 2,
                "log.cleaner.threads": 1,
                # a loaded 2-core machine stalls a JVM for seconds: no election for that
                "controller.quorum.election.timeout.ms": 5000,
                "controller.quorum.fetch.timeout.ms": 10000,
            }
            (b.folder / "server.properties").write_text(
                "".join(f"{k}={v}\n" for k, v in properties.items())
            )
            subprocess.run(
                [
                    *self._command(b),
                    "kafka.tools.StorageTool",
                    "format",
                    "--cluster-id",
                    cluster_id,
                    "--config",
                    str(b.folder / "server.properties"),
                    "--ignore-formatted",
                ],
                check=True,
                capture_output=True,
            )

    def start(self, broker: Broker) -> None:
        log = (broker.folder / "broker.log").open("ab")
        broker.process = subprocess.Popen(
            [*self._command(broker), "kafka.Kafka", str(broker.folder / "server.properties")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, broker: Broker) -> None:
        """SIGKILL, as a machine lost."""
        if broker.process is not None and broker.process.poll() is None:
            os.killpg(broker.process.pid, signal.SIGKILL)
            broker.process.wait(30)
        broker.process = None

    def wait_ready(self, count: int | None = None, timeout: float = 180.0) -> None:
        """Until `count` brokers (all) are registered and not fenced."""
        want = len(self.brokers) if count is None else count
        kafka = self.kafka_settings().kafka
        deadline = time.monotonic() + timeout
        last = "none"
        while True:
            try:
                admin = kafka_admin(kafka, 3000)
                try:
                    brokers = admin.describe_cluster().get("brokers") or []
                finally:
                    admin.close()
                if len([b for b in brokers if not b.get("is_fenced")]) >= want:
                    return
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                logs = "; ".join((b.folder / "broker.log").read_text()[-400:] for b in self.brokers)
                raise TimeoutError(f"{want} brokers not ready in {timeout:.0f}s ({last}): {logs}")
            time.sleep(1)

    def kafka_settings(self, **more: object) -> Settings:
        return Settings.model_validate(
            {
                "java_home": str(self.settings.java_home),
                "cache_dir": str(self.settings.cache_dir),
                "kafka": {"managed": False, "bootstrap_servers": self.bootstrap, **more},
            }
        )


@contextmanager
def kafka_brokers(settings: Settings, count: int = 3, heap: str = "320m") -> Iterator[Brokers]:
    """`count` brokers started, ready; every one SIGKILLed and its folder left in /tmp
    (the logs) at the end, whatever happens."""
    folder = Path(tempfile.mkdtemp(prefix="cdc-kafka-brokers-"))
    ports = free_ports(2 * count)
    brokers = Brokers(settings, folder, heap=heap)
    for i in range(count):
        brokers.brokers.append(
            Broker(i + 1, ports[2 * i], ports[2 * i + 1], folder / f"broker-{i + 1}")
        )
    try:
        brokers.prepare()
        for b in brokers.brokers:
            brokers.start(b)
        brokers.wait_ready()
        yield brokers
    finally:
        for b in brokers.brokers:
            brokers.kill(b)
