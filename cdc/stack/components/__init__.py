"""The components of the local stack, in the order they start."""

from cdc.stack.components.base import Component, ComponentStatus
from cdc.stack.components.connect import Connect
from cdc.stack.components.kafka import Kafka
from cdc.stack.components.opensearch import OpenSearch
from cdc.stack.components.postgres import Postgres
from cdc.stack.components.redis import Redis

__all__ = ["Component", "ComponentStatus", "Connect", "Kafka", "OpenSearch", "Postgres", "Redis"]
