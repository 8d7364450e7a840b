"""One Kafka Connect worker in distributed mode with the Debezium PostgreSQL plugin."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

from cdc.capture.connect_client import REST_USER, ConnectClient, connect_client, rest_password_file
from cdc.capture.connector_config import DEBEZIUM_POSTGRES
from cdc.capture.role import generated_secret
from cdc.core.clients import kafka_jaas_config, kafka_java_config
from cdc.core.errors import INSTALL_HINT, ComponentError, NotInstalledError
from cdc.core.files import private_folder, write_file
from cdc.core.settings.connections import ConnectSettings
from cdc.core.topics import connect_topics
from cdc.stack.components._jvm import (
    LOG4J2_PROPERTIES,
    heap_flags,
    java,
    kafka_lib,
    write_properties,
    write_secret_properties,
)
from cdc.stack.components.base import Component

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
    # its REST API runs connectors' code: not as root (it reads only its own folder's secrets)
    needs_service_user = True
    start_timeout = 120.0

    @property
    def section(self) -> ConnectSettings:
        return self.settings.connect

    @property
    def address(self) -> str:
        return ", ".join(self.section.urls)

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
        if self.section.host not in ("127.0.0.1", "localhost"):
            raise ComponentError(
                f"connect.host is {self.section.host}: the local Connect worker's REST API "
                "listens on 127.0.0.1 only; set connect.host = "
                '"127.0.0.1", or run your own worker (connect.managed = false)'
            )
        private_folder(self.state_dir / "secrets")
        group = self.section.group_id
        # connector configs may resolve files in the secrets folder only (KIP-993): the
        # worker's own, and the folder cdc writes the connector's secrets to when this
        # worker is one of a group (connect.secrets_dir, shared by the workers)
        allowed = [self.state_dir / "secrets"]
        if self.section.secrets_dir is not None:
            allowed.append(self.section.secrets_dir)
        write_properties(
            self.state_dir / "worker.properties",
            {
                "bootstrap.servers": self.settings.kafka.bootstrap,
                **self._kafka_security(),
                "group.id": group,
                **CONVERTERS,
                **self._internal_topics(group),
                # the connectors' producers: acknowledged by every in-sync replica, and
                # idempotent (Connect turns idempotence off unless told)
                "producer.acks": "all",
                "producer.enable.idempotence": "true",
                "offset.flush.interval.ms": 1000,
                # a worker of a group lost: its tasks go to another after 10 s, not after
                # the 5 minutes Connect waits by default for it to come back
                "scheduled.rebalance.max.delay.ms": 10000,
                # loopback only (prepare refuses more); https with a certificate
                **self._listener(),
                "rest.advertised.host.name": self.section.host,
                "rest.advertised.port": self.section.port,
                "plugin.path": self.plugin_path,
                "plugin.discovery": "hybrid_warn",
                # connector secrets live in files (${file:path:key}), not in the REST API
                "config.providers": "file",
                # connector configs may resolve files in the secrets folder only (KIP-993)
                "config.providers.file.param.allowed.paths": ",".join(map(str, allowed)),
                "config.providers.file.class": (
                    "org.apache.kafka.common.config.provider.FileConfigProvider"
                ),
                # Debezium writes only to topics the project creates with the right settings
                "topic.creation.enable": "true",
                # basic authentication on the REST API, one user: cdc (capture/connect_client.py)
                "rest.extension.classes": (
                    "org.apache.kafka.connect.rest.basic.auth.extension."
                    "BasicAuthSecurityRestExtension"
                ),
            },
        )
        self._write_rest_login()
        write_file(self.state_dir / "log4j2.properties", LOG4J2_PROPERTIES)

    def _internal_topics(self, group: str) -> dict[str, object]:
        """Connect's own topics (configs, offsets, status): their names, and the replicas
        of every topic of the pipeline (kafka.replication_factor, min_insync_replicas)."""
        kafka = self.settings.kafka
        config: dict[str, object] = {}
        for kind in ("config", "offset", "status"):
            config[f"{kind}.storage.topic"] = connect_topics(group)[kind]
            config[f"{kind}.storage.replication.factor"] = kafka.replication_factor
            config[f"{kind}.storage.min.insync.replicas"] = kafka.min_insync_replicas
        return config

    def _listener(self) -> dict[str, object]:
        """The REST listener: http, or https with the worker's certificate (connect.tls),
        the key store and trust store PKCS#12 files made from the PEM files (Jetty reads
        no PEM). The same `listeners.https.*` settings are the worker's client's, which
        forwards a request to the group's leader: it trusts connect.ca_file, else the
        worker's own certificate chain."""
        port = self.section.port
        if not self.section.tls:
            return {"listeners": f"http://127.0.0.1:{port}"}
        assert self.section.cert_file is not None and self.section.key_file is not None
        rest = self.state_dir / "rest"
        private_folder(rest)
        password = secrets.token_urlsafe(24)
        pkcs12_key_store(
            rest / "keystore.p12", self.section.cert_file, self.section.key_file, password
        )
        trusted = self.section.ca_file or self.section.cert_file
        pkcs12_trust_store(self.settings, rest / "truststore.p12", trusted, password)
        prefix = "listeners.https."
        return {
            "listeners": f"https://127.0.0.1:{port}",
            "rest.advertised.listener": "https",
            f"{prefix}ssl.keystore.type": "PKCS12",
            f"{prefix}ssl.keystore.location": rest / "keystore.p12",
            f"{prefix}ssl.keystore.password": password,
            f"{prefix}ssl.key.password": password,
            f"{prefix}ssl.truststore.type": "PKCS12",
            f"{prefix}ssl.truststore.location": rest / "truststore.p12",
            f"{prefix}ssl.truststore.password": password,
        }

    def _write_rest_login(self) -> None:
        """The REST API's one user and its password, in a folder of the worker's outside
        the secrets folder that connector configs may name (`allowed.paths`): the login
        of connect.username/password when set (every worker of a group takes the same),
        else REST_USER with a password generated once, kept for cdc in <data_dir>/secrets."""
        user, password = self.section.username, self.section.password
        if user is None or password is None:
            user = REST_USER
            secret = generated_secret(self.settings, rest_password_file(self.settings))
        else:
            secret = password.get_secret_value()
        rest = self.state_dir / "rest"
        private_folder(rest)
        write_file(rest / "users.properties", f"{user}={secret}\n")
        write_file(
            rest / "jaas.conf",
            "KafkaConnect {\n  org.apache.kafka.connect.rest.basic.auth.extension."
            f'PropertyFileLoginModule required\n  file="{rest / "users.properties"}";\n}};\n',
        )

    def _kafka_security(self) -> dict[str, str]:
        """How the worker logs in to Kafka: for its own clients (config, offset and status
        topics) and, prefixed, for the producer, consumer and admin clients of the
        connectors it runs (Debezium writes the change topics with the producer and
        creates them with the admin client). The SASL login, which holds the password,
        stays in a secrets file of mode 0600 that the worker reads through its
        FileConfigProvider (`${file:…}`), never in worker.properties."""
        kafka = self.settings.kafka
        jaas = kafka_jaas_config(kafka)
        reference = None
        if jaas is not None:
            login = self.state_dir / "secrets" / "kafka.properties"
            write_secret_properties(login, {"sasl.jaas.config": jaas})
            reference = f"${{file:{login}:sasl.jaas.config}}"
        security = kafka_java_config(kafka, reference)
        return {
            f"{prefix}{key}": value
            for prefix in ("", "producer.", "consumer.", "admin.")
            for key, value in security.items()
        }

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [
            java(self.settings),
            *heap_flags(self.section.heap),
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile=file:{self.state_dir / 'log4j2.properties'}",
            f"-Djava.security.auth.login.config={self.state_dir / 'rest' / 'jaas.conf'}",
            "-cp",
            str(kafka_lib(self.settings) / "*"),
            "org.apache.kafka.connect.cli.ConnectDistributed",
            str(self.state_dir / "worker.properties"),
        ], {}

    def client(self) -> ConnectClient:
        return connect_client(self.settings, timeout=5.0)

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


def pkcs12_key_store(path: Path, cert_file: Path, key_file: Path, password: str) -> None:
    """A PKCS#12 key store (mode 0600) of a PEM private key and its certificate chain."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        chain = x509.load_pem_x509_certificates(cert_file.read_bytes())
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ComponentError(
            f"connect.cert_file/key_file cannot be read as PEM ({exc}): give the worker's "
            "certificate chain and its unencrypted private key"
        ) from None
    data = pkcs12.serialize_key_and_certificates(
        b"connect",
        key,  # type: ignore[arg-type]
        chain[0],
        chain[1:] or None,
        serialization.BestAvailableEncryption(password.encode()),
    )
    write_file(path, data)


def pkcs12_trust_store(settings: Any, path: Path, pem_file: Path, password: str) -> None:
    """A PKCS#12 trust store of every certificate in a PEM file, by the JDK's keytool
    (Java trusts a PKCS#12 certificate only with the attribute keytool gives it)."""
    keytool = Path(java(settings)).parent / "keytool"
    path.unlink(missing_ok=True)
    text = pem_file.read_text()
    end = "-----END CERTIFICATE-----"
    blocks = [b + end + "\n" for b in text.split(end) if "-----BEGIN CERTIFICATE-----" in b]
    for i, block in enumerate(blocks):
        one = path.with_suffix(f".{i}.pem")
        write_file(one, block)
        try:
            done = subprocess.run(
                [
                    str(keytool),
                    "-importcert",
                    "-noprompt",
                    "-alias",
                    f"ca{i}",
                    "-file",
                    str(one),
                    "-keystore",
                    str(path),
                    "-storetype",
                    "PKCS12",
                    "-storepass:env",
                    "STOREPASS",
                ],
                env={"STOREPASS": password},
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            one.unlink(missing_ok=True)
        if done.returncode != 0:
            last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            raise ComponentError(
                f"keytool could not trust {pem_file} for the Connect worker: {last[0][:200]}"
            )
    if not blocks:
        raise ComponentError(f"{pem_file} holds no PEM certificate: give the CA that signed it")
