"""One OpenSearch node (single-node discovery) from the integ-test distribution.

Plain by default: http, no users, exactly the distribution as installed. With the
section's cert_file/key_file the node runs the security plugin instead: https and
transport TLS with that certificate, basic auth with the one configured user (mapped to
all_access). The plugin is installed into a private copy of the distribution in the
state directory, so the installed distribution (and a plain node) never carries it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cdc.core.clients import opensearch_client
from cdc.core.errors import INSTALL_HINT, ComponentError, NotInstalledError
from cdc.core.files import chmod_tree, read_plain, write_file
from cdc.core.settings import Settings
from cdc.core.settings.connections import OpenSearchSettings
from cdc.stack.components._jvm import heap_flags, java
from cdc.stack.components.base import Component

__all__ = ["OpenSearch"]

PLUGIN = "opensearch-security"
# the yml files of the security plugin's configuration that cdc writes itself; the others
# (config.yml: basic auth against the internal users, no anonymous access; roles.yml, ...)
# are the plugin's own defaults
INTERNAL_USERS = "internal_users.yml"
ROLES_MAPPING = "roles_mapping.yml"


class OpenSearch(Component):
    name = "opensearch"
    start_timeout = 150.0
    needs_service_user = True

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        if self.section.secured:  # the security plugin's first start also writes its index
            self.start_timeout = 300.0

    @property
    def section(self) -> OpenSearchSettings:
        return self.settings.opensearch

    @property
    def address(self) -> str:
        return self.section.url

    def ports(self) -> list[int]:
        return [self.section.port, self.section.transport_port]

    def _installed(self) -> list[Path]:
        found = (self.settings.jvm_dir / "opensearch").glob("opensearch-*/bin/opensearch")
        return [binary.parent.parent for binary in sorted(found)]

    def home(self) -> Path:
        """The installed distribution: with the security plugin, the one it was built for."""
        homes = self._installed()
        if not homes:
            raise NotInstalledError(
                f"opensearch is not installed (nothing in {self.settings.jvm_dir / 'opensearch'}): "
                f"{INSTALL_HINT}"
            )
        if not self.section.secured:
            return homes[-1]
        version = self.plugin_zip().name.removeprefix(f"{PLUGIN}-").removesuffix(".zip")
        for home in homes:  # the plugin's version is the distribution's plus a fourth number
            if version.rsplit(".", 1)[0] == home.name.removeprefix("opensearch-"):
                return home
        raise NotInstalledError(
            f"the OpenSearch security plugin {version} needs OpenSearch "
            f"{version.rsplit('.', 1)[0]}, which is not installed: {INSTALL_HINT}"
        )

    def plugin_zip(self) -> Path:
        zips = sorted((self.settings.jvm_dir / "opensearch-plugins").glob(f"{PLUGIN}-*.zip"))
        if not zips:
            raise NotInstalledError(
                "the OpenSearch security plugin (needed with opensearch cert_file) is not "
                f"installed (nothing in {self.settings.jvm_dir / 'opensearch-plugins'}): "
                f"{INSTALL_HINT}"
            )
        return zips[-1]

    def runtime_home(self) -> Path:
        """Where the node runs from: the installed distribution, or with TLS the private
        copy that has the security plugin."""
        return self.state_dir / "home" if self.section.secured else self.home()

    def check_installed(self) -> None:
        java(self.settings)
        self.home()

    def _env(self) -> dict[str, str]:
        return {
            "OPENSEARCH_JAVA_HOME": str(self.settings.java_home),
            "JAVA_HOME": str(self.settings.java_home),
            "PATH": f"{self.settings.java_home / 'bin'}:/usr/bin:/bin",
        }

    def prepare(self) -> None:
        home = self.runtime_home()
        if self.section.secured:
            self._install_secured_home()
        conf = self.state_dir / "config"
        (conf / "jvm.options.d").mkdir(parents=True, exist_ok=True)
        log4j2 = read_plain(home / "config" / "log4j2.properties")
        write_file(conf / "log4j2.properties", log4j2, 0o644)
        # the distribution's options name paths relative to its home, which is not ours to write
        options = read_plain(home / "config" / "jvm.options").decode()
        options = options.replace("file=logs/", f"file={self.state_dir / 'logs'}/")
        options = options.replace("HeapDumpPath=data", f"HeapDumpPath={self.state_dir / 'data'}")
        options = options.replace("ErrorFile=logs/", f"ErrorFile={self.state_dir / 'logs'}/")
        write_file(conf / "jvm.options", options, 0o644)
        for sub in ("data", "logs", "tmp"):
            (self.state_dir / sub).mkdir(exist_ok=True)
        config = (
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
        if self.section.secured:
            config += self._security_config(conf)
        write_file(conf / "opensearch.yml", config, 0o644)
        if self.section.secured:  # what the security plugin asks of its config directory
            chmod_tree(conf, 0o700, 0o600)

    def _install_secured_home(self) -> None:
        """A private copy of the distribution with the security plugin installed (once)."""
        home, dist, plugin = self.state_dir / "home", self.home(), self.plugin_zip()
        marker = home / ".cdc-installed"
        want = f"{dist.name} {plugin.name}\n"
        if marker.exists() and read_plain(marker).decode() == want:
            return
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(dist, home, symlinks=True)
        run = subprocess.run(
            [str(home / "bin" / "opensearch-plugin"), "install", "--batch", plugin.as_uri()],
            env={**self._env(), "OPENSEARCH_PATH_CONF": str(home / "config")},
            capture_output=True,
            text=True,
            timeout=300,
        )
        if run.returncode != 0:
            lines = (run.stderr or run.stdout).strip().splitlines() or ["no output"]
            raise ComponentError(
                f"opensearch: installing the security plugin from {plugin} failed: {lines[-1]}"
            )
        write_file(marker, want, 0o644)

    def _security_config(self, conf: Path) -> str:
        """Write the certificates, the user and the security plugin's files into the
        node's config directory (the plugin reads files only from there); return the
        opensearch.yml lines that turn it on."""
        s = self.section
        assert s.cert_file is not None and s.key_file is not None and s.ca_file is not None
        assert s.username is not None and s.password is not None
        write_file(conf / "node.crt", s.cert_file.read_bytes())
        write_file(conf / "ca.crt", s.ca_file.read_bytes())
        write_file(conf / "node.key", s.key_file.read_bytes())
        security = conf / "opensearch-security"
        if security.exists():
            shutil.rmtree(security)
        shutil.copytree(
            self.runtime_home() / "config" / "opensearch-security", security, symlinks=True
        )
        user = _yaml_string(s.username)
        write_file(
            security / INTERNAL_USERS,
            (
                '_meta:\n  type: "internalusers"\n  config_version: 2\n'
                f"{user}:\n  hash: {_yaml_string(self._bcrypt(s.password.get_secret_value()))}\n"
                '  reserved: true\n  description: "cdc (cdc.toml [opensearch] username)"\n'
            ).encode(),
        )
        write_file(
            security / ROLES_MAPPING,
            '_meta:\n  type: "rolesmapping"\n  config_version: 2\n'
            f"all_access:\n  reserved: true\n  users: [{user}]\n",
        )
        return (
            "plugins.security.ssl.transport.pemcert_filepath: node.crt\n"
            "plugins.security.ssl.transport.pemkey_filepath: node.key\n"
            "plugins.security.ssl.transport.pemtrustedcas_filepath: ca.crt\n"
            "plugins.security.ssl.transport.enforce_hostname_verification: false\n"
            "plugins.security.ssl.http.enabled: true\n"
            "plugins.security.ssl.http.pemcert_filepath: node.crt\n"
            "plugins.security.ssl.http.pemkey_filepath: node.key\n"
            "plugins.security.ssl.http.pemtrustedcas_filepath: ca.crt\n"
            # the files above become the security index on the first start only
            "plugins.security.allow_default_init_securityindex: true\n"
            # no certificate is an administrator: the configured user (all_access) is the
            # only way in, and securityadmin.sh is not used
            "plugins.security.authcz.admin_dn: []\n"
            f"plugins.security.nodes_dn: [{_yaml_string(_subject_dn(s.cert_file))}]\n"
            "plugins.security.audit.type: noop\n"
            "plugins.security.restapi.roles_enabled: [all_access]\n"
        )

    def _bcrypt(self, password: str) -> str:
        """The password's bcrypt hash, made by the plugin's own hasher (the password goes
        through the environment, never the command line)."""
        hasher = self.runtime_home() / "plugins" / PLUGIN / "tools" / "hash.sh"
        variable = "CDC_OPENSEARCH_HASH_INPUT"
        run = subprocess.run(
            ["/bin/bash", str(hasher), "-env", variable],
            env={**self._env(), variable: password},
            capture_output=True,
            text=True,
            timeout=120,
        )
        hashes = re.findall(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$", run.stdout, re.M)
        if run.returncode != 0 or not hashes:
            raise ComponentError(
                f"opensearch: hashing the password of user {self.section.username!r} failed "
                f"(exit {run.returncode})"
            )
        return str(hashes[-1])

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [str(self.runtime_home() / "bin" / "opensearch")], {
            **self._env(),
            "OPENSEARCH_PATH_CONF": str(self.state_dir / "config"),
            "OPENSEARCH_JAVA_OPTS": " ".join(heap_flags(self.section.heap)),
            "OPENSEARCH_TMPDIR": str(self.state_dir / "tmp"),
        }

    def _client(self) -> Any:
        return opensearch_client(self.section, timeout=5, max_retries=0)

    def ready(self) -> bool:
        health = self._client().cluster.health()
        return health.get("status") in ("green", "yellow")

    def version(self) -> str | None:
        return str(self._client().info().get("version", {}).get("number"))

    def details(self) -> dict[str, Any]:
        client = self._client()
        health = client.cluster.health()
        return {"health": health.get("status"), "indices": len(client.indices.get_alias())}


def _yaml_string(value: str) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is valid YAML)."""
    return json.dumps(value)


def _subject_dn(cert_file: Path) -> str:
    """The certificate's subject as an RFC 2253 DN, the form the security plugin compares."""
    run = subprocess.run(
        ["openssl", "x509", "-in", str(cert_file), "-noout", "-subject", "-nameopt", "RFC2253"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if run.returncode != 0 or not run.stdout.startswith("subject="):
        raise ComponentError(f"opensearch: cannot read the subject of {cert_file} with openssl")
    return run.stdout.removeprefix("subject=").strip()
