"""The dead-letter topic, as the apply job writes it: what each store refused, sent
while applying. A dead letter names the store, the error, and where the change came
from (topic, partition, offset, key). Reading them back and replaying them is a repair:
cdc/check/dead_letters.py."""

from __future__ import annotations

import json
from typing import Any

from cdc.core.clients import kafka_producer_kwargs
from cdc.core.errors import StoreUnavailableError
from cdc.core.settings import Settings
from cdc.core.settings.connections import KafkaSettings
from cdc.core.topics import dead_letter_topic

__all__ = ["DeadLetters", "producer_config"]


def producer_config(kafka: KafkaSettings) -> dict[str, Any]:
    """The dead-letter producer's configuration: a letter carries the event, as large as
    kafka.max_message_bytes."""
    return {
        **kafka_producer_kwargs(kafka),
        "max_request_size": kafka.max_message_bytes,
    }


class DeadLetters:
    """Poison events go to the pipeline's dead-letter topic with the error and where they
    came from (topic, partition, offset); the pipeline goes on."""

    def __init__(self, settings: Settings, store: str) -> None:
        self.settings, self.store = settings, store
        self._producer: Any = None
        self._sent: list[Any] = []  # futures of this batch's sends

    def send(
        self, topic: str, partition: int, offset: int, key: Any, value: Any, error: str
    ) -> None:
        if self._producer is None:
            from kafka import KafkaProducer

            self._producer = KafkaProducer(**producer_config(self.settings.kafka))
        record = {
            "store": self.store,
            "error": error,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "key": key,
            "value": value,
        }
        self._sent.append(
            self._producer.send(
                dead_letter_topic(self.settings.pipeline),
                key=(key or "").encode(),
                value=json.dumps(record, default=str).encode(),
            )
        )

    def send_row(self, row: Any) -> None:
        """A row (mapping) with topic, partition, offset, key, value and error."""
        self.send(
            row["topic"], row["partition"], row["offset"], row["key"], row["value"], row["error"]
        )

    def flush(self) -> None:
        """Wait until Kafka has confirmed every dead letter of the batch (acks=all); raise
        if one was not, so that the batch is not committed."""
        if self._producer is None or not self._sent:
            return
        sent, self._sent = self._sent, []
        self._producer.flush(timeout=60)
        failed = []
        for future in sent:
            try:
                future.get(timeout=1)
            except Exception as exc:  # KafkaError, or a timeout
                failed.append(exc)
        if failed:
            raise StoreUnavailableError(
                f"the dead-letter topic {dead_letter_topic(self.settings.pipeline)} did not take "
                f"{len(failed)} of {len(sent)} dead letter(s) ({type(failed[0]).__name__}: "
                f"{str(failed[0])[:200]}); the batch is not committed"
            )
