"""The components of the local stack, in the order they start."""

from cdc.components.base import Component, ComponentStatus
from cdc.components.connect import Connect
from cdc.components.kafka import Kafka
from cdc.components.opensearch import OpenSearch
from cdc.components.postgres import Postgres
from cdc.components.redis import Redis

__all__ = ["Component", "ComponentStatus", "Connect", "Kafka", "OpenSearch", "Postgres", "Redis"]
