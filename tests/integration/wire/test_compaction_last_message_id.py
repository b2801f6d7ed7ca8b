"""Pulsar's ``GetLastMessageIdCompactedTest`` (reference ``pulsar-compaction.md`` §6.4) with the real client.

``consumer.get_last_message_id()`` and ``reader.has_message_available()`` both send
GET_LAST_MESSAGE_ID; for a read-compacted subscription the broker answers with the rules of
``pulsar-protocol.md`` §2.3 (the raw topic's last message while it is past the horizon, else
the last message that survives compaction, else -1:-1). The library-level versions are in
``tests/unit/compactor/scenarios/test_pulsar_get_last_message_id_compacted_test.py``.

A topic *unload* is ``broker.restart()`` (ledger switch) then a compaction run (which trims
what every durable cursor consumed). Not here: #64 testReadMsgsAfterDisableCompaction, which
deletes the ``__compaction`` subscription through the admin API (none yet).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pulsar
import pytest

from tests.integration.wire.helpers import read_available, wait_for_mark_delete

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/get-last-message-id"
RECEIVE_MS = 5000

Item = tuple[str, bytes | None]
BATCHED = [pytest.param(True, id="batch"), pytest.param(False, id="no-batch")]


def send(client: Any, batched: bool, flushes: Sequence[Sequence[Item]], *,
         compression: Any = pulsar.CompressionType.NONE) -> list[Any]:
    """The Pulsar test's producer: ``sendAsync`` per message, ``flush`` after each group (one
    batch entry per group when batching). Returns every message id, in order."""
    options: dict[str, Any] = {"compression_type": compression}
    if batched:
        options.update(batching_enabled=True, batching_max_messages=1000, batching_max_publish_delay_ms=60_000)
    producer = client.create_producer(TOPIC, **options)
    ids: list[Any] = []
    for group in flushes:
        slots: list[Any] = [None] * len(group)

        def callback(index: int, slots: list[Any] = slots) -> Any:
            def done(result: Any, message_id: Any) -> None:
                slots[index] = (result, message_id)
            return done

        for index, (key, value) in enumerate(group):
            producer.send_async(value, callback(index), partition_key=key)
        producer.flush()
        deadline = time.monotonic() + 10
        while any(s is None for s in slots) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [s[0] for s in slots] == [pulsar.Result.Ok] * len(group)
        ids.extend(s[1] for s in slots)
    producer.close()
    return ids


def create_consumer(client: Any) -> Any:
    """Pulsar's ``createConsumer``: subscription "sub", receiverQueueSize 1, readCompacted."""
    return client.subscribe(TOPIC, "sub", is_read_compacted=True, receiver_queue_size=1)


def compacted_reader(client: Any) -> Any:
    return client.create_reader(TOPIC, pulsar.MessageId.earliest, is_read_compacted=True)


def kv(message: Any) -> tuple[str, bytes]:
    return message.partition_key(), message.data()


def position(message_id: Any) -> tuple[int, int, int]:
    return message_id.ledger_id(), message_id.entry_id(), message_id.batch_index()


def unload(broker: Any) -> None:
    broker.restart()
    broker.compact(TOPIC)


def raw_ledgers(broker: Any) -> list[Any]:
    return list(broker.service.registry.loaded[TOPIC].ledger.ledger_list())


K0_K1: list[list[Item]] = [[("k0", b"v0"), ("k0", b"v1"), ("k0", b"v2")],
                           [("k1", b"v0"), ("k1", b"v1"), ("k1", b"v2")]]


def test_testGetLastMessageIdWhenLedgerEmpty(broker: Any, client: Any) -> None:
    """§6.4 #59: an empty topic → -1:-1 (and nothing available)."""
    consumer = create_consumer(client)
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (-1, -1)
    assert not compacted_reader(client).has_message_available()


def test_testGetLastMessageIdWhenNoNonEmptyLedgerExists(broker: Any, client: Any) -> None:
    """§6.4 #60: one message read, ledger switched, every old ledger trimmed → entry -1.

    compactd keeps a ``__compaction`` cursor on every topic, so the old ledger is only
    trimmed once a compaction covers it, after which a read-compacted consumer rightly sees
    the compacted message; the scenario is played with a plain consumer (the raw answer,
    which is what Pulsar's consumer gets with no compaction)."""
    consumer = client.subscribe(TOPIC, "sub", receiver_queue_size=1)
    producer = client.create_producer(TOPIC)
    producer.send(b"v0", partition_key="k0")
    received = consumer.receive(RECEIVE_MS)
    consumer.acknowledge(received)
    wait_for_mark_delete(broker, TOPIC, "sub", received.message_id())
    unload(broker)
    assert len(raw_ledgers(broker)) == 1  # only the new, empty ledger is left
    last = consumer.get_last_message_id()
    assert last.entry_id() == -1
    assert not client.create_reader(TOPIC, pulsar.MessageId.earliest).has_message_available()


@pytest.mark.parametrize("batched", BATCHED)
def test_testGetLastMessageIdBeforeCompaction(broker: Any, client: Any, batched: bool) -> None:
    """§6.4 #61[batch]: k0:v0..v2, k1:v0..v2 → the topic's last message id (batch index when batched)."""
    consumer = create_consumer(client)
    ids = send(client, batched, K0_K1)
    last = consumer.get_last_message_id()
    assert last == ids[-1]
    assert position(last)[2] == (2 if batched else -1)
    assert len(read_available(compacted_reader(client))) == 6


@pytest.mark.parametrize("batched", BATCHED)
def test_testGetLastMessageIdAfterCompaction(broker: Any, client: Any, batched: bool) -> None:
    """§6.4 #62[batch]: the same after compaction → still the topic's last message id."""
    consumer = create_consumer(client)
    ids = send(client, batched, K0_K1)
    broker.compact(TOPIC)
    assert consumer.get_last_message_id() == ids[-1]
    got = read_available(compacted_reader(client))
    assert [kv(m) for m in got] == [("k0", b"v2"), ("k1", b"v2")]
    assert [m.message_id() for m in got] == [ids[2], ids[5]]


@pytest.mark.parametrize("batched", BATCHED)
def test_testGetLastMessageIdAfterCompactionWithCompression(broker: Any, client: Any, batched: bool) -> None:
    """§6.4 #63[batch]: ZSTD, same expectation."""
    consumer = create_consumer(client)
    ids = send(client, batched, K0_K1, compression=pulsar.CompressionType.ZSTD)
    broker.compact(TOPIC)
    assert consumer.get_last_message_id() == ids[-1]
    assert [kv(m) for m in read_available(compacted_reader(client))] == [("k0", b"v2"), ("k1", b"v2")]


@pytest.mark.parametrize("batched", BATCHED)
def test_testGetLastMessageIdAfterCompactionEndWithNullMsg(broker: Any, client: Any, batched: bool) -> None:
    """§6.4 #65[batch]: k1 and k2 end with ∅ → the id of k0:v2; a compacted reader stops after it."""
    consumer = create_consumer(client)
    ids = send(client, batched, [
        [("k0", b"v0"), ("k0", b"v1"), ("k0", b"v2")],
        [("k1", b"v0"), ("k1", b"v1"), ("k1", None), ("k2", b"v0"), ("k2", b"v1"), ("k2", None)],
    ])
    broker.compact(TOPIC)
    last = consumer.get_last_message_id()
    assert last == ids[2]
    assert position(last)[2] == (2 if batched else -1)
    got = read_available(compacted_reader(client))
    assert [kv(m) for m in got] == [("k0", b"v2")] and got[0].message_id() == ids[2]


@pytest.mark.parametrize("batched", BATCHED)
def test_testGetLastMessageIdAfterCompactionEndWithNullMsg2(broker: Any, client: Any, batched: bool) -> None:
    """§6.4 #66[batch]: only k2 ends with ∅ → the id of k1:v2."""
    consumer = create_consumer(client)
    ids = send(client, batched, [
        [("k0", b"v0"), ("k0", b"v1")],
        [("k1", b"v0"), ("k1", b"v1"), ("k1", b"v2"), ("k2", b"v0"), ("k2", b"v1"), ("k2", None)],
    ])
    broker.compact(TOPIC)
    assert consumer.get_last_message_id() == ids[4]
    got = read_available(compacted_reader(client))
    assert [kv(m) for m in got] == [("k0", b"v1"), ("k1", b"v2")]
    assert [m.message_id() for m in got] == [ids[1], ids[4]]


@pytest.mark.parametrize("batched", BATCHED)
def test_testGetLastMessageIdAfterCompactionAllNullMsg(broker: Any, client: Any, batched: bool) -> None:
    """§6.4 #67[batch]: every key ends with ∅ → -1:-1, not a batch id; nothing available."""
    consumer = create_consumer(client)
    send(client, batched, [
        [("k0", b"v0"), ("k0", None)],
        [("k1", b"v0"), ("k1", None), ("k2", b"v0"), ("k2", None)],
    ])
    broker.compact(TOPIC)
    assert position(consumer.get_last_message_id()) == (-1, -1, -1)
    assert read_available(compacted_reader(client)) == []


@pytest.mark.parametrize("batched", BATCHED)
def test_testReaderStuckWithCompaction(broker: Any, client: Any, batched: bool) -> None:
    """§6.4 #68[batch]: k0:v0,v1 compacted, ledger switch + trim → a plain reader from earliest
    never gets stuck (every has_message_available is followed by a message)."""
    send(client, batched, [[("k0", b"v0"), ("k0", b"v1")]])
    broker.compact(TOPIC)
    unload(broker)
    assert len(raw_ledgers(broker)) == 1
    reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
    assert read_available(reader) == []
    assert [kv(m) for m in read_available(compacted_reader(client))] == [("k0", b"v1")]


# -- the same rules seen from CompactedTopicTest / CompactorTest ---------------------------


def test_testLastMessageIdForCompactedLedger(broker: Any, client: Any) -> None:
    """§6.3 #53: 10 × one key, compact, unload (raw trimmed) → an RC reader has one message, the
    last message id is its id, then nothing; after another unload (LAC entry -1) the same."""
    ids = send(client, False, [[("k", b"v%d" % i) for i in range(10)]])
    broker.compact(TOPIC)
    for _ in range(2):
        unload(broker)
        reader = compacted_reader(client)
        got = read_available(reader)
        assert [kv(m) for m in got] == [("k", b"v9")] and got[0].message_id() == ids[-1]
        reader.close()
        consumer = create_consumer(client)
        assert consumer.get_last_message_id() == ids[-1]
        consumer.close()


def test_testAllCompactedOut(broker: Any, client: Any) -> None:
    """§6.2 #43: batch [K1:V1, K2:V2, K2:∅]; compact; K1:∅; compact → every has_message_available
    that says true is followed by a real message (no phantom entries when all slots of a
    compacted batch are gone)."""
    send(client, True, [[("K1", b"V1"), ("K2", b"V2"), ("K2", None)]])
    broker.compact(TOPIC)
    assert [kv(m) for m in read_available(compacted_reader(client))] == [("K1", b"V1")]
    send(client, False, [[("K1", None)]])
    broker.compact(TOPIC)
    assert read_available(compacted_reader(client)) == []
    assert position(create_consumer(client).get_last_message_id()) == (-1, -1, -1)


@pytest.mark.parametrize("batched", BATCHED)
def test_newMessagesAfterTombstonedTail(broker: Any, client: Any, batched: bool) -> None:
    """#18808/#22634 family: a compacted reader at the end of a view whose tail was tombstoned
    must see messages published afterwards (has_message_available turns true again)."""
    send(client, batched, [[("k0", b"v0"), ("k1", b"v0"), ("k1", None)]])
    broker.compact(TOPIC)
    reader = compacted_reader(client)
    assert [kv(m) for m in read_available(reader)] == [("k0", b"v0")]
    ids = send(client, batched, [[("k2", b"v0")]])
    assert reader.has_message_available()
    message = reader.read_next(RECEIVE_MS)
    assert kv(message) == ("k2", b"v0") and message.message_id() == ids[0]
    assert not reader.has_message_available()
