"""The real pulsar-client against compactd: delayed delivery (``deliver_after``, ``deliver_at``).

On Shared and Key_Shared subscriptions a message is not delivered before its
``deliver_at_time``; the messages after it are not held back by it; it survives a broker
restart (it stays unacknowledged in the log and is indexed again when read). Exclusive
and Failover subscriptions deliver it at once, as Pulsar does.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pulsar
import pytest

from tests.integration.wire.helpers import RECEIVE_MS, SILENCE_MS
from tests.integration.wire.helpers import unique_topic as _topic

pytestmark = pytest.mark.integration

DELAY = timedelta(seconds=1.5)


def _subscribe(client: Any, topic: str, consumer_type: Any) -> Any:
    return client.subscribe(topic, "sub", consumer_type=consumer_type,
                            initial_position=pulsar.InitialPosition.Earliest)


def _received_at(consumer: Any) -> tuple[bytes, float]:
    message = consumer.receive(RECEIVE_MS)
    consumer.acknowledge(message)
    return message.data(), time.time()


@pytest.mark.parametrize("consumer_type", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared])
def test_a_delayed_message_waits_for_its_time_without_holding_back_the_others(
        broker: Any, client: Any, consumer_type: Any) -> None:
    topic = _topic("delayed")
    consumer = _subscribe(client, topic, consumer_type)
    producer = client.create_producer(topic)
    sent_at = time.time()
    producer.send(b"later", partition_key="k", deliver_after=DELAY)
    deliver_at_ms = int((time.time() + 0.5) * 1000)
    producer.send(b"at", partition_key="k", deliver_at=deliver_at_ms)
    producer.send(b"now", partition_key="k")

    first = _received_at(consumer)
    assert first[0] == b"now"
    stats = broker.service.admin.stats(topic)["subscriptions"]["sub"]
    assert stats["type"] == {pulsar.ConsumerType.Shared: "Shared"}.get(consumer_type, "Key_Shared")
    assert stats["msgDelayed"] == 2
    at = _received_at(consumer)
    assert at[0] == b"at" and at[1] * 1000 >= deliver_at_ms
    later = _received_at(consumer)
    assert later[0] == b"later" and later[1] >= sent_at + DELAY.total_seconds()
    with pytest.raises(pulsar.Timeout):
        consumer.receive(SILENCE_MS)


@pytest.mark.parametrize("consumer_type", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover])
def test_exclusive_and_failover_deliver_a_delayed_message_at_once(client: Any, consumer_type: Any) -> None:
    topic = _topic("delayed-exclusive")
    consumer = _subscribe(client, topic, consumer_type)
    producer = client.create_producer(topic)
    sent_at = time.time()
    producer.send(b"later", deliver_after=timedelta(seconds=60))
    data, received_at = _received_at(consumer)
    assert data == b"later" and received_at - sent_at < 30


def test_a_delayed_message_survives_a_restart_and_still_waits(broker: Any, client: Any) -> None:
    topic = _topic("delayed-restart")
    consumer = _subscribe(client, topic, pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    deliver_at_ms = int((time.time() + 2.5) * 1000)
    producer.send(b"later", deliver_at=deliver_at_ms)
    producer.send(b"now")
    assert _received_at(consumer)[0] == b"now"
    consumer.close()
    producer.close()
    broker.restart()

    consumer = _subscribe(client, topic, pulsar.ConsumerType.Shared)
    data, received_at = _received_at(consumer)
    assert data == b"later" and received_at * 1000 >= deliver_at_ms


@pytest.mark.parametrize("consumer_type", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared])
def test_a_long_run_of_delayed_messages_does_not_hide_the_message_after_it(client: Any, consumer_type: Any) -> None:
    topic = _topic("delayed-run")
    producer = client.create_producer(topic)
    for n in range(250):
        producer.send_async(b"later %d" % n, None, deliver_after=timedelta(seconds=60))
    producer.send_async(b"now", None)
    producer.flush()
    consumer = _subscribe(client, topic, consumer_type)  # the backlog is there before the first read
    assert _received_at(consumer)[0] == b"now"
