"""The real pulsar-client against compactd: producer access modes.

Exclusive refuses a second producer (ProducerFenced for an exclusive newcomer,
ProducerBusy for a shared one) at once; WaitForExclusive waits until the topic is free;
ExclusiveWithFencing takes the topic and the producer it fenced fails its sends with
ProducerFenced.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pulsar
import pytest

from tests.integration.wire.helpers import RECEIVE_MS, SILENCE_MS, drain, wait_until
from tests.integration.wire.helpers import unique_topic as _topic

pytestmark = pytest.mark.integration

Mode = pulsar.ProducerAccessMode
FAST_FAIL_S = 5


def _producer(client: Any, topic: str, mode: Any) -> Any:
    return client.create_producer(topic, access_mode=mode)


class _Creating(threading.Thread):
    """``create_producer`` in the background (WaitForExclusive blocks until granted)."""

    def __init__(self, client: Any, topic: str, mode: Any) -> None:
        super().__init__(daemon=True)
        self.args_ = (client, topic, mode)
        self.producer: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.producer = _producer(*self.args_)
        except Exception as error:  # noqa: BLE001 - asserted by the test
            self.error = error


def test_an_exclusive_producer_refuses_others_at_once(client: Any) -> None:
    topic = _topic("exclusive")
    first = _producer(client, topic, Mode.Exclusive)
    started = time.monotonic()
    with pytest.raises(pulsar.ProducerFenced):
        _producer(client, topic, Mode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        _producer(client, topic, Mode.Shared)
    assert time.monotonic() - started < FAST_FAIL_S
    first.send(b"still mine")
    first.close()
    _producer(client, topic, Mode.Exclusive).send(b"next holder")

    shared = _topic("exclusive-after-shared")
    _producer(client, shared, Mode.Shared)
    with pytest.raises(pulsar.ProducerFenced):
        _producer(client, shared, Mode.Exclusive)


def test_wait_for_exclusive_waits_until_the_topic_is_free(client: Any) -> None:
    topic = _topic("wait-exclusive")
    consumer = client.subscribe(topic, "sub")
    holder = _producer(client, topic, Mode.Exclusive)
    waiting = _Creating(client, topic, Mode.WaitForExclusive)
    waiting.start()
    waiting.join(SILENCE_MS / 1000)
    assert waiting.is_alive()  # queued while the holder is connected
    holder.send(b"from holder")
    holder.close()
    waiting.join(RECEIVE_MS / 1000)
    assert waiting.error is None and waiting.producer is not None
    waiting.producer.send(b"from waiter")
    assert [m.data() for m in drain(consumer)] == [b"from holder", b"from waiter"]


def test_exclusive_with_fencing_takes_over_and_the_fenced_producer_fails(client: Any) -> None:
    topic = _topic("fencing")
    consumer = client.subscribe(topic, "sub")
    old = _producer(client, topic, Mode.Exclusive)
    old.send(b"old")
    queued = _Creating(client, topic, Mode.WaitForExclusive)
    queued.start()
    queued.join(SILENCE_MS / 1000)
    assert queued.is_alive()
    new = _producer(client, topic, Mode.ExclusiveWithFencing)
    queued.join(RECEIVE_MS / 1000)
    assert isinstance(queued.error, pulsar.ProducerFenced)  # fenced out of the queue
    new.send(b"new")

    def fenced() -> bool:
        try:
            old.send(b"late")
        except pulsar.ProducerFenced:
            return True
        return False

    wait_until(fenced, "the fenced producer's send fails with ProducerFenced")
    assert [m.data() for m in drain(consumer)] == [b"old", b"new"]


def test_an_exclusive_producer_keeps_the_topic_across_a_broker_restart(broker: Any, client: Any) -> None:
    topic = _topic("exclusive-restart")
    consumer = client.subscribe(topic, "sub")
    holder = _producer(client, topic, Mode.Exclusive)
    holder.send(b"before")
    broker.restart()
    holder.send(b"after")  # reconnects with its topic epoch and is granted again
    with pytest.raises(pulsar.ProducerFenced):
        _producer(client, topic, Mode.Exclusive)
    assert [m.data() for m in drain(consumer)] == [b"before", b"after"]
