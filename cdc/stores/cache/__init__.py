"""The cache: Redis, one hash per row (store.py: CacheStore)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.core.store_declarations import StoreDeclaration

if TYPE_CHECKING:
    from cdc.core.settings import Settings


def _posture(settings: Settings) -> str | None:
    redis = settings.redis
    return None if redis.tls and redis.password is not None else "redis.tls and redis.password"


def _setup(settings: Settings, tables: list[str]) -> list[str]:
    from cdc.stores.cache.store import check_standalone

    return check_standalone(settings.redis)


DECLARATION = StoreDeclaration(
    name="cache",
    summary="Redis, a hash per row",
    make="cdc.stores.cache.store:make",
    slo_s=5.0,
    section="redis",
    posture=_posture,
    setup=_setup,
)
