"""An admin client of a broker that does not answer fails within the time it is given,
so `cdc status` with Kafka down reports it at once (kafka-python 3 alone waits 30 s)."""

from __future__ import annotations

import socket

import pytest

from cdc.core.clients import kafka_admin
from cdc.core.settings.connections import KafkaSettings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# the safety net is the test: without the bootstrap timeout the client waits 30 s
@pytest.mark.timeout(15)
def test_an_admin_client_of_a_broker_that_is_down_fails_within_its_timeout() -> None:
    from kafka.errors import KafkaError

    section = KafkaSettings(port=_free_port())
    with pytest.raises(KafkaError):
        kafka_admin(section, 1000)
