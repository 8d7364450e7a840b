"""Redis, the cache store."""

from __future__ import annotations

import shutil
from typing import Any

from cdc.clients import redis_client
from cdc.components.base import Component
from cdc.errors import INSTALL_HINT, NotInstalledError
from cdc.settings import RedisSettings

__all__ = ["Redis"]


class Redis(Component):
    name = "redis"
    start_timeout = 30.0

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
        lines = [
            f"port {self.section.port}",
            f"bind {self.section.host}",
            f"dir {self.state_dir}",
            "daemonize no",
            'logfile ""',
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
        ]
        if self.section.password is not None:
            lines.append(f"requirepass {self.section.password.get_secret_value()}")
        conf = self.state_dir / "redis.conf"
        conf.write_text("\n".join(lines) + "\n")
        conf.chmod(0o600)

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [self._binary(), str(self.state_dir / "redis.conf")], {}

    def ready(self) -> bool:
        return bool(redis_client(self.section).ping())

    def version(self) -> str | None:
        return str(redis_client(self.section).info("server").get("redis_version"))

    def details(self) -> dict[str, Any]:
        return {"keys": int(redis_client(self.section).dbsize())}
