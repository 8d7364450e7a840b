"""Clients of the components, built in one place: Kafka's admin client, Redis and
OpenSearch. The library, the stores and the local stack all take theirs from here."""

from __future__ import annotations

from typing import Any

from cdc.core.settings.connections import KafkaSettings, OpenSearchSettings, RedisSettings

__all__ = [
    "kafka_admin",
    "kafka_client_kwargs",
    "kafka_jaas_config",
    "kafka_java_config",
    "kafka_producer_kwargs",
    "opensearch_client",
    "redis_client",
]


def kafka_client_kwargs(section: KafkaSettings) -> dict[str, Any]:
    """Where the broker is and how to log in, as kafka-python's keyword arguments: every
    KafkaConsumer, KafkaProducer and KafkaAdminClient of the project takes these (they
    hold the password: never print them). TLS checks the broker's certificate and host
    name against ca_file, else the system's trust store."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": section.bootstrap,
        "security_protocol": section.security_protocol,
    }
    if section.sasl and section.password is not None:
        kwargs.update(
            sasl_mechanism=section.sasl_mechanism,
            sasl_plain_username=section.username,
            sasl_plain_password=section.password.get_secret_value(),
        )
    if section.tls:
        kwargs["ssl_check_hostname"] = True
        if section.ca_file is not None:
            kwargs["ssl_cafile"] = str(section.ca_file)
    return kwargs


def kafka_producer_kwargs(section: KafkaSettings) -> dict[str, Any]:
    """kafka_client_kwargs for a KafkaProducer: every producer of the project waits for
    every in-sync replica (acks=all; kafka.min_insync_replicas of them at least) and is
    idempotent, so a retried send is not written twice."""
    return {**kafka_client_kwargs(section), "acks": "all", "enable_idempotence": True}


def kafka_admin(section: KafkaSettings, timeout_ms: int = 5000) -> Any:
    """An admin client; a broker that does not answer fails it within `timeout_ms`
    (kafka-python 3 waits 30 s for its first connection otherwise: `cdc status` with
    Kafka down took that long)."""
    from kafka import KafkaAdminClient

    kwargs: dict[str, Any] = {"request_timeout_ms": timeout_ms}
    if "bootstrap_timeout_ms" in KafkaAdminClient.DEFAULT_CONFIG:  # kafka-python 3
        kwargs["bootstrap_timeout_ms"] = timeout_ms
    return KafkaAdminClient(**kafka_client_kwargs(section), client_id="cdc-admin", **kwargs)


def kafka_jaas_config(section: KafkaSettings) -> str | None:
    """The `sasl.jaas.config` value of a Java Kafka client (holds the password: write it
    only to a file of mode 0600, never to a log), or None without SASL."""
    if not section.sasl or section.password is None:
        return None
    module = (
        "org.apache.kafka.common.security.plain.PlainLoginModule"
        if section.sasl_mechanism == "PLAIN"
        else "org.apache.kafka.common.security.scram.ScramLoginModule"
    )
    return (
        f'{module} required username="{_jaas_quoted(section.username or "")}" '
        f'password="{_jaas_quoted(section.password.get_secret_value())}";'
    )


def kafka_java_config(section: KafkaSettings, jaas_config: str | None) -> dict[str, str]:
    """The security properties of a Java Kafka client (Connect's worker, its producer,
    consumer and admin, Spark's source and sink): protocol, SASL mechanism and login,
    and the CA as a PEM trust store. `jaas_config` is the login itself or a reference to
    it (`${file:path:key}`); it is left out without SASL."""
    config: dict[str, str] = {"security.protocol": section.security_protocol}
    if section.sasl and jaas_config is not None:
        config["sasl.mechanism"] = section.sasl_mechanism
        config["sasl.jaas.config"] = jaas_config
    if section.tls:
        config["ssl.endpoint.identification.algorithm"] = "https"
        if section.ca_file is not None:
            config["ssl.truststore.type"] = "PEM"
            config["ssl.truststore.location"] = str(section.ca_file)
    return config


def _jaas_quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def redis_client(section: RedisSettings, **options: Any) -> Any:
    """A redis-py client as the settings say: the ACL user and its password (never in a
    URL), TLS with the server's certificate and host name checked. `options` are further
    redis.Redis arguments (timeouts, decode_responses)."""
    import redis

    kwargs: dict[str, Any] = {"socket_timeout": 3, "socket_connect_timeout": 3, **options}
    if section.tls:
        kwargs.update(
            ssl=True,
            ssl_cert_reqs="required",
            ssl_check_hostname=True,
            ssl_ca_certs=str(section.ca_file) if section.ca_file else None,
        )
    return redis.Redis(
        host=section.host,
        port=section.port,
        username=section.username,
        password=section.password.get_secret_value() if section.password else None,
        **kwargs,
    )


def opensearch_client(
    section: OpenSearchSettings, timeout: float = 30, serializer: Any = None, **options: Any
) -> Any:
    """An opensearch-py client as the settings say: https with the server's certificate
    checked (ca_file, else the system's trust store) and basic auth when a user is set.
    `options` are further OpenSearch arguments (max_retries)."""
    from opensearchpy import OpenSearch

    kwargs: dict[str, Any] = {"timeout": timeout, **options}
    if serializer is not None:
        kwargs["serializer"] = serializer
    if section.tls:
        kwargs.update(use_ssl=True, verify_certs=True, ssl_show_warn=True)
        if section.ca_file is not None:
            kwargs["ca_certs"] = str(section.ca_file)
    if section.username is not None and section.password is not None:
        kwargs["http_auth"] = (section.username, section.password.get_secret_value())
    return OpenSearch(hosts=list(section.urls), **kwargs)
