"""Redis, the cache store."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from cdc.core.clients import redis_client
from cdc.core.errors import INSTALL_HINT, ComponentError, NotInstalledError
from cdc.core.settings.connections import RedisSettings
from cdc.stack.components.base import Component

__all__ = ["Redis"]


class Redis(Component):
    name = "redis"
    # a Redis that exits (a bad setting, a port taken) is seen at once; one that lives
    # but does not answer is loading its data file, 20 s per 3.5 M keys here
    start_timeout = 600.0

    @property
    def section(self) -> RedisSettings:
        return self.settings.redis

    @property
    def address(self) -> str:
        return self.section.url

    def ports(self) -> list[int]:
        return [self.section.port]

    def _binary(self) -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise NotInstalledError(
                f"redis is not installed (no redis-server on PATH): {INSTALL_HINT}"
            )
        return binary

    def check_installed(self) -> None:
        self._binary()

    def prepare(self) -> None:
        section = self.section
        lines = [
            f"bind {section.host}",
            f"dir {self.state_dir}",
            "daemonize no",
            'logfile ""',
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
        ]
        if section.cert_file is not None and section.key_file is not None:
            for path in (section.cert_file, section.key_file):
                if not path.is_file():
                    raise ComponentError(f"redis: no file {path} (redis.cert_file/key_file)")
            # TLS only: no plain-text port; clients are not asked for certificates
            lines += [
                "port 0",
                f"tls-port {section.port}",
                f"tls-cert-file {_quoted(section.cert_file)}",
                f"tls-key-file {_quoted(section.key_file)}",
                "tls-auth-clients no",
            ]
            if section.ca_file is not None:
                lines.append(f"tls-ca-cert-file {_quoted(section.ca_file)}")
        else:
            lines.append(f"port {section.port}")
        if section.password is not None:
            # SHA-256 of the password (ACL `#`): the file never holds the password itself
            digest = hashlib.sha256(section.password.get_secret_value().encode()).hexdigest()
            rules = f"on #{digest} ~* &* +@all"
            if section.username is None or section.username == "default":
                lines.append(f"user default reset {rules}")
            else:
                lines += ["user default reset off", f"user {section.username} reset {rules}"]
        conf = self.state_dir / "redis.conf"
        conf.touch(mode=0o600)
        conf.chmod(0o600)
        conf.write_text("\n".join(lines) + "\n")

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [self._binary(), str(self.state_dir / "redis.conf")], {}

    def ready(self) -> bool:
        return bool(redis_client(self.section).ping())

    def version(self) -> str | None:
        return str(redis_client(self.section).info("server").get("redis_version"))

    def details(self) -> dict[str, Any]:
        return {"keys": int(redis_client(self.section).dbsize())}


def _quoted(path: Path) -> str:
    """A path as a redis.conf argument (double-quoted, escaped: spaces work)."""
    return json.dumps(str(path), ensure_ascii=False)
