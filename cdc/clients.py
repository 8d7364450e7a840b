"""Clients of the components, built in one place: Kafka's admin client, Redis and
OpenSearch. The library, the stores and the local stack all take theirs from here."""

from __future__ import annotations

from typing import Any

from cdc.settings import RedisSettings

__all__ = ["kafka_admin", "opensearch_client", "redis_client"]


def kafka_admin(bootstrap_servers: str, timeout_ms: int = 5000) -> Any:
    from kafka import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id="cdc-admin",
        request_timeout_ms=timeout_ms,
    )


def redis_client(section: RedisSettings) -> Any:
    import redis

    return redis.Redis(
        host=section.host,
        port=section.port,
        password=section.password.get_secret_value() if section.password else None,
        socket_timeout=3,
        socket_connect_timeout=3,
    )


def opensearch_client(url: str, timeout: float = 30, serializer: Any = None) -> Any:
    from opensearchpy import OpenSearch

    if serializer is None:
        return OpenSearch(hosts=[url], timeout=timeout)
    return OpenSearch(hosts=[url], timeout=timeout, serializer=serializer)
