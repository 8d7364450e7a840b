"""One Apache Kafka broker in KRaft mode (broker and controller in one process).

With `security_protocol` SASL_SSL (or SSL, SASL_PLAINTEXT) its one client listener
speaks that protocol, and it is also the inter-broker listener, so no plain-text port
serves data. The SCRAM user of the settings is created when the storage is formatted.
The controller listener is on 127.0.0.1. With SASL it takes SASL/PLAIN, with a login
made anew at each start that only this broker knows (KRaft controllers do not take
SCRAM). A `StandardAuthorizer` admits only the settings' user and the controller's login.
Without this, any local user could use the controller (KIP-919 `bootstrap.controllers`)
to add a SCRAM user of their own and then pass the client listener.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import secrets
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.core.clients import kafka_admin, kafka_jaas_config
from cdc.core.errors import ComponentError
from cdc.core.settings.connections import KafkaSettings
from cdc.stack.components._jvm import (
    LOG4J2_PROPERTIES,
    heap_flags,
    jar_version,
    java,
    kafka_lib,
    write_private,
    write_properties,
    write_secret_properties,
)
from cdc.stack.components.base import Component
from cdc.stack.process import inherited_env

if TYPE_CHECKING:
    from pydantic import SecretStr

__all__ = ["Kafka"]


class Kafka(Component):
    name = "kafka"
    start_timeout = 90.0

    @property
    def section(self) -> KafkaSettings:
        return self.settings.kafka

    @property
    def address(self) -> str:
        return self.section.bootstrap

    def ports(self) -> list[int]:
        return [self.section.port, self.section.controller_port]

    def check_installed(self) -> None:
        java(self.settings)
        kafka_lib(self.settings)

    def _classpath(self) -> str:
        return str(kafka_lib(self.settings) / "*")

    def prepare(self) -> None:
        host, port, cport = self.section.host, self.section.port, self.section.controller_port
        # the client listener is named after its protocol (SASL_SSL://…); the controller's
        # is on 127.0.0.1, for this broker alone (SASL_PLAINTEXT with a login when SASL is on)
        listener = self.section.security_protocol
        controller = "SASL_PLAINTEXT" if self.section.sasl else "PLAINTEXT"
        log_dir = self.state_dir / "data"
        formatted = (log_dir / "meta.properties").exists()
        if formatted:  # before any file is rewritten with settings it would refuse
            self._check_sasl_user()
        write_properties(
            self.state_dir / "server.properties",
            {
                "process.roles": "broker,controller",
                "node.id": 1,
                "controller.quorum.voters": f"1@{_CONTROLLER_HOST}:{cport}",
                "listeners": f"{listener}://{host}:{port},CONTROLLER://{_CONTROLLER_HOST}:{cport}",
                "advertised.listeners": f"{listener}://{host}:{port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": listener,
                "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:{controller}",
                **self._security(),
                "log.dirs": log_dir,
                "num.partitions": 1,
                "offsets.topic.replication.factor": 1,
                "transaction.state.log.replication.factor": 1,
                "transaction.state.log.min.isr": 1,
                "share.coordinator.state.topic.replication.factor": 1,
                "share.coordinator.state.topic.min.isr": 1,
                "group.initial.rebalance.delay.ms": 0,
                "auto.create.topics.enable": "false",
                # a row of several MB is a change event of several MB (topics are set alike)
                "message.max.bytes": self.section.max_message_bytes,
                "replica.fetch.max.bytes": self.section.max_message_bytes,
                # compaction runs often enough to see it work on a laptop
                "log.cleaner.backoff.ms": 5000,
            },
        )
        (self.state_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        if formatted:
            return
        cluster_id = "-"
        while cluster_id.startswith("-"):  # as Kafka's own Uuid: "-..." would read as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        args = [
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
        ]
        scram = self._scram_credential()
        if scram is not None:
            args += ["--add-scram", scram]
        # the arguments go in a file of mode 0600 (`java @file`), so the SCRAM credential is
        # never on a command line that `ps` shows; the file is gone when the tool ends
        arg_file = self.state_dir / "secrets" / "format.args"
        write_private(arg_file, "".join(_arg_file_line(arg) for arg in args).encode())
        try:
            proc = subprocess.run(
                [java(self.settings), f"@{arg_file}"],
                capture_output=True,
                text=True,
                check=False,
                env=inherited_env(),  # no CDC_* (passwords among them)
            )
        finally:
            arg_file.unlink(missing_ok=True)
        if proc.returncode != 0:
            output = _SALTED.sub("saltedpassword=****", proc.stdout + proc.stderr)
            self.log_file.write_text(output)
            last = (output.strip() or "no output").splitlines()[-1]
            raise ComponentError(
                f"kafka: formatting the storage failed ({last[:200]}); see {self.log_file}"
            )

    def _security(self) -> dict[str, object]:
        """server.properties lines for TLS and SASL on the client listener (none for
        PLAINTEXT). The listener's JAAS login, which holds the password, stays in a
        secrets file of mode 0600 that the broker reads through its FileConfigProvider."""
        section = self.section
        config: dict[str, object] = {}
        if section.tls and section.cert_file is not None and section.key_file is not None:
            # a PEM key store: the private key and the certificate chain in one file
            key_store = self.state_dir / "secrets" / "broker.pem"
            write_private(key_store, section.key_file.read_bytes() + section.cert_file.read_bytes())
            config["ssl.keystore.type"] = "PEM"
            config["ssl.keystore.location"] = key_store
            if section.ca_file is not None:  # the broker trusts it too (inter-broker)
                config["ssl.truststore.type"] = "PEM"
                config["ssl.truststore.location"] = section.ca_file
        jaas = kafka_jaas_config(section)
        if section.sasl and jaas is not None:
            secrets_dir = self.state_dir / "secrets"
            login = secrets_dir / "broker.properties"
            # the controller's login: made anew at each start, as only this broker uses it
            controller_password = secrets.token_urlsafe(32)
            write_secret_properties(
                login,
                {
                    "sasl.jaas.config": jaas,
                    "controller.jaas.config": (
                        "org.apache.kafka.common.security.plain.PlainLoginModule required "
                        f'username="{_CONTROLLER_USER}" password="{controller_password}" '
                        f'user_{_CONTROLLER_USER}="{controller_password}";'
                    ),
                },
            )
            mechanism = section.sasl_mechanism
            client = f"listener.name.{section.security_protocol.lower()}"
            config.update(
                {
                    f"{client}.sasl.enabled.mechanisms": mechanism,
                    "sasl.mechanism.inter.broker.protocol": mechanism,
                    "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
                    "sasl.mechanism.controller.protocol": "PLAIN",
                    "listener.name.controller.plain.sasl.jaas.config": (
                        f"${{file:{login}:controller.jaas.config}}"
                    ),
                    # only the settings' user (cdc, Connect, Spark) and the controller's
                    "authorizer.class.name": (
                        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                    ),
                    "super.users": f"User:{section.username};User:{_CONTROLLER_USER}",
                    "config.providers": "file",
                    "config.providers.file.class": (
                        "org.apache.kafka.common.config.provider.FileConfigProvider"
                    ),
                    "config.providers.file.param.allowed.paths": secrets_dir,
                    f"{client}.{mechanism.lower()}.sasl.jaas.config": (
                        f"${{file:{login}:sasl.jaas.config}}"
                    ),
                }
            )
        return config

    @property
    def _sasl_user_file(self) -> Path:
        return self.state_dir / "secrets" / "sasl-user.json"

    def _scram_credential(self) -> str | None:
        """The `--add-scram` argument that creates the SASL user at format time, with a
        salted password (never the password itself); records the user's stored key, so a
        later start with another user or password is told, not left failing to log in."""
        section = self.section
        if not section.sasl or section.password is None or section.username is None:
            return None
        salt, iterations = secrets.token_bytes(32), _SCRAM_ITERATIONS
        salted = _salted_password(section.sasl_mechanism, section.password, salt, iterations)
        record = {
            "user": section.username,
            "mechanism": section.sasl_mechanism,
            "salt": base64.b64encode(salt).decode(),
            "iterations": iterations,
            "stored_key": _stored_key(section.sasl_mechanism, salted),
        }
        write_private(self._sasl_user_file, json.dumps(record).encode())
        return (
            f"{section.sasl_mechanism}=[name={section.username},iterations={iterations},"
            f'salt="{record["salt"]}",saltedpassword="{base64.b64encode(salted).decode()}"]'
        )

    def _check_sasl_user(self) -> None:
        """On a formatted storage: the SASL user of the settings is the one created then."""
        section = self.section
        if not section.sasl or section.password is None:
            return
        record: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(self._sasl_user_file.read_text())
        same = (
            record.get("user") == section.username
            and record.get("mechanism") == section.sasl_mechanism
        )
        if same:
            salted = _salted_password(
                section.sasl_mechanism,
                section.password,
                base64.b64decode(record["salt"]),
                int(record["iterations"]),
            )
            same = hmac.compare_digest(
                _stored_key(section.sasl_mechanism, salted), record["stored_key"]
            )
        if not same:
            raise ComponentError(
                f"kafka: its storage in {self.state_dir / 'data'} was formatted without the "
                f"{section.sasl_mechanism} user '{section.username}' and this password (the "
                "user is created when the storage is formatted): restore the settings it was "
                "made with, or remove the broker's data (`cdc down --purge`) to start anew"
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
        admin = kafka_admin(self.section, 3000)
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
        admin = kafka_admin(self.section, 3000)
        try:
            topics = admin.list_topics()
        finally:
            admin.close()
        return {"topics": len([t for t in topics if not t.startswith("__")])}


_CONTROLLER_HOST = "127.0.0.1"
_CONTROLLER_USER = "cdc-controller"
_SALTED = re.compile(r"saltedpassword=\S+")
_SCRAM_ITERATIONS = 8192


def _salted_password(mechanism: str, password: SecretStr, salt: bytes, iterations: int) -> bytes:
    """SCRAM's SaltedPassword (RFC 5802 Hi(), i.e. PBKDF2 with the mechanism's hash)."""
    digest = "sha512" if mechanism == "SCRAM-SHA-512" else "sha256"
    secret = password.get_secret_value().encode()
    return hashlib.pbkdf2_hmac(digest, secret, salt, iterations)


def _stored_key(mechanism: str, salted: bytes) -> str:
    """SCRAM's StoredKey, H(HMAC(SaltedPassword, "Client Key")): what the broker keeps; it
    does not give the password back."""
    digest = hashlib.sha512 if mechanism == "SCRAM-SHA-512" else hashlib.sha256
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    return base64.b64encode(digest(client_key).digest()).decode()


def _arg_file_line(arg: str) -> str:
    """One argument of a `java @file` argument file, quoted as the launcher reads it."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"\n'
