"""The real pulsar-client against compactd: readers' start positions and seek.

Start-position split of work (``pulsar-protocol.md`` §2.1, §2.4): the broker positions at
the start/seek entry inclusively, the client drops what is at or before the start id
unless ``start_message_id_inclusive``; seek by time starts at the first entry published
at or after the time.
"""

from __future__ import annotations

import time
from typing import Any

import pulsar
import pytest

from tests.integration.wire.helpers import RECEIVE_MS, SILENCE_MS
from tests.integration.wire.helpers import unique_topic as _topic

pytestmark = pytest.mark.integration




def _drain(consumer: Any, silence_ms: int = SILENCE_MS) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(consumer.receive(silence_ms).data())
        except pulsar.Timeout:
            return out


def _read_all(reader: Any) -> list[bytes]:
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(RECEIVE_MS).data())
    return out


def _produce(client: Any, topic: str, count: int, *, start: int = 0) -> list[Any]:
    producer = client.create_producer(topic)
    ids = [producer.send(b"m%d" % i) for i in range(start, start + count)]
    producer.close()
    return ids


def _produce_batches(client: Any, topic: str, sizes: list[int]) -> list[Any]:
    """One batch entry per size; returns every message id in order (payloads m0, m1, ...)."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000,
                                      batching_max_messages=1000)
    ids: list[Any] = []
    number = 0
    for size in sizes:
        first = len(ids)
        ids.extend([None] * size)
        for index in range(first, first + size):
            producer.send_async(b"m%d" % number, lambda _r, mid, index=index: ids.__setitem__(index, mid))
            number += 1
        producer.flush()
    producer.close()
    return ids


def _m(*numbers: int) -> list[bytes]:
    return [b"m%d" % n for n in numbers]


# -- readers: start position, inclusive and exclusive --------------------------------------


def test_reader_start_positions(client: Any) -> None:
    topic = _topic("reader-start")
    ids = _produce(client, topic, 6)
    assert _read_all(client.create_reader(topic, pulsar.MessageId.earliest)) == _m(0, 1, 2, 3, 4, 5)
    assert _read_all(client.create_reader(topic, ids[2])) == _m(3, 4, 5)
    assert _read_all(client.create_reader(topic, ids[2], start_message_id_inclusive=True)) == _m(2, 3, 4, 5)
    assert _read_all(client.create_reader(topic, ids[0], start_message_id_inclusive=True)) == _m(0, 1, 2, 3, 4, 5)
    assert _read_all(client.create_reader(topic, ids[5], start_message_id_inclusive=True)) == _m(5)
    # A reader at latest sees only what comes after it was created.
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    assert not latest.has_message_available()
    _produce(client, topic, 1, start=6)
    assert latest.read_next(RECEIVE_MS).data() == b"m6"
    # A round-tripped (serialized) id works as a start position too.
    restored = pulsar.MessageId.deserialize(ids[3].serialize())
    assert _read_all(client.create_reader(topic, restored)) == _m(4, 5, 6)


def test_reader_start_inside_batches(client: Any) -> None:
    topic = _topic("reader-batch")
    ids = _produce_batches(client, topic, [3, 4])  # m0..m2 | m3..m6
    assert [i.batch_index() for i in ids] == [0, 1, 2, 0, 1, 2, 3]
    assert _read_all(client.create_reader(topic, ids[4])) == _m(5, 6)
    assert _read_all(client.create_reader(topic, ids[4], start_message_id_inclusive=True)) == _m(4, 5, 6)
    assert _read_all(client.create_reader(topic, ids[2])) == _m(3, 4, 5, 6)
    assert _read_all(client.create_reader(topic, ids[3], start_message_id_inclusive=True)) == _m(3, 4, 5, 6)
    assert _read_all(client.create_reader(topic, ids[6])) == []
    assert _read_all(client.create_reader(topic, ids[6], start_message_id_inclusive=True)) == _m(6)


def test_reader_continues_after_a_broker_restart(broker: Any, client: Any) -> None:
    """A reader's subscription is not durable: after the broker restarts, the client
    subscribes again from the last message it handed out, exclusively."""
    topic = _topic("reader-restart")
    _produce(client, topic, 6)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=2)
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(3)] == _m(0, 1, 2)
    broker.restart()
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(3)] == _m(3, 4, 5)
    assert not reader.has_message_available()


# -- reader.seek -----------------------------------------------------------------------------


def test_reader_seek_by_id_and_time(client: Any) -> None:
    topic = _topic("reader-seek")
    ids = _produce(client, topic, 4)
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.05)
    _produce(client, topic, 4, start=4)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert _read_all(reader) == _m(*range(8))

    reader.seek(ids[1])
    assert _read_all(reader) == _m(2, 3, 4, 5, 6, 7)
    reader.seek(boundary)
    assert _read_all(reader) == _m(4, 5, 6, 7)
    reader.seek(pulsar.MessageId.earliest)
    assert _read_all(reader) == _m(*range(8))
    reader.seek(0)  # a time before everything
    assert reader.read_next(RECEIVE_MS).data() == b"m0"
    reader.seek(int(time.time() * 1000) + 60_000)  # a time after everything
    assert not reader.has_message_available()
    _produce(client, topic, 1, start=8)
    assert reader.read_next(RECEIVE_MS).data() == b"m8"


def test_inclusive_reader_seek(client: Any) -> None:
    topic = _topic("reader-seek-incl")
    ids = _produce(client, topic, 5)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, start_message_id_inclusive=True)
    assert _read_all(reader) == _m(0, 1, 2, 3, 4)
    reader.seek(ids[2])
    assert _read_all(reader) == _m(2, 3, 4)


def test_reader_seek_into_a_batch(client: Any) -> None:
    topic = _topic("reader-seek-batch")
    ids = _produce_batches(client, topic, [4, 2])  # m0..m3 | m4, m5
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert _read_all(reader) == _m(0, 1, 2, 3, 4, 5)
    # SEEK carries only the entry; the client filters within the batch.
    reader.seek(ids[1])
    assert _read_all(reader) == _m(2, 3, 4, 5)
    reader.seek(ids[3])
    assert _read_all(reader) == _m(4, 5)


# -- consumer.seek -----------------------------------------------------------------------------


def test_consumer_seek_by_message_id(client: Any) -> None:
    topic = _topic("consumer-seek")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    ids = _produce(client, topic, 6)
    got = [consumer.receive(RECEIVE_MS) for _ in range(6)]
    consumer.acknowledge_cumulative(got[-1])
    assert _drain(consumer) == []

    consumer.seek(ids[2])  # back, over acknowledged messages
    assert _drain(consumer) == _m(3, 4, 5)
    consumer.seek(pulsar.MessageId.earliest)
    again = [consumer.receive(RECEIVE_MS) for _ in range(6)]
    assert [m.data() for m in again] == _m(0, 1, 2, 3, 4, 5)
    consumer.acknowledge_cumulative(again[3])
    consumer.seek(pulsar.MessageId.latest)
    assert _drain(consumer) == []
    _produce(client, topic, 1, start=6)
    assert consumer.receive(RECEIVE_MS).data() == b"m6"


def test_consumer_seek_resets_the_durable_position(client: Any) -> None:
    """A seek moves the subscription itself: a consumer that subscribes again later
    starts *at* the seek position (the broker resets inclusively; only the seeking
    consumer's client filters the target itself), acknowledgements after it dropped."""
    topic = _topic("consumer-seek-durable")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    ids = _produce(client, topic, 5)
    got = [consumer.receive(RECEIVE_MS) for _ in range(5)]
    consumer.acknowledge_cumulative(got[-1])
    consumer.seek(ids[1])
    consumer.close()
    consumer = client.subscribe(topic, "sub")
    assert _drain(consumer) == _m(1, 2, 3, 4)


def test_consumer_seek_by_time(client: Any) -> None:
    topic = _topic("consumer-seek-time")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    _produce(client, topic, 3)
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.05)
    _produce(client, topic, 3, start=3)
    got = [consumer.receive(RECEIVE_MS) for _ in range(6)]
    consumer.acknowledge_cumulative(got[-1])
    assert _drain(consumer) == []

    consumer.seek(boundary)
    assert _drain(consumer) == _m(3, 4, 5)
    consumer.seek(0)
    assert _drain(consumer) == _m(0, 1, 2, 3, 4, 5)


def test_consumer_seek_into_a_batch(client: Any) -> None:
    topic = _topic("consumer-seek-batch")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    ids = _produce_batches(client, topic, [3, 3])  # m0..m2 | m3..m5
    got = [consumer.receive(RECEIVE_MS) for _ in range(6)]
    consumer.acknowledge_cumulative(got[-1])
    consumer.seek(ids[4])
    assert _drain(consumer) == _m(5)
    consumer.seek(ids[2])
    assert _drain(consumer) == _m(3, 4, 5)


# -- positions across ledgers (each broker restart starts a new ledger) ------------------------


def test_positions_across_ledgers_and_empty_ledgers(broker: Any, client: Any) -> None:
    topic = _topic("ledgers")
    first = _produce(client, topic, 2)
    broker.restart()
    broker.restart()  # an empty ledger in between, then a new current one
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    assert consumer.get_last_message_id() == first[-1]
    assert not client.create_reader(topic, first[-1]).has_message_available()
    assert not client.create_reader(topic, pulsar.MessageId.latest).has_message_available()
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.05)
    second = _produce(client, topic, 2, start=2)
    assert second[0].ledger_id() > first[0].ledger_id()
    assert consumer.get_last_message_id() == second[-1]

    assert _read_all(client.create_reader(topic, pulsar.MessageId.earliest)) == _m(0, 1, 2, 3)
    assert _read_all(client.create_reader(topic, first[-1])) == _m(2, 3)
    assert _read_all(client.create_reader(topic, first[-1], start_message_id_inclusive=True)) == _m(1, 2, 3)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    reader.seek(boundary)
    assert _read_all(reader) == _m(2, 3)
    reader.seek(first[1])
    assert _read_all(reader) == _m(2, 3)
    assert _drain(consumer) == _m(0, 1, 2, 3)
