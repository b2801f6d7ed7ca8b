"""Pulsar's ``GetLastMessageIdCompactedTest`` scenarios (reference ``pulsar-compaction.md`` §6.4).

``getLastMessageId`` is ``CompactedTopic.last_message_id`` (what the broker answers a
consumer of the topic); batch sizes, which Pulsar's ``BatchMessageIdImpl`` also compares,
are not part of a ``Position``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cursor.cursor import InitialPosition
from ledger.errors import MetadataError
from ledger.position import Position
from message.proto import pulsar_api_pb2 as pb
from tests.unit.compactor.scenarios.support import Client, Harness, MakeHarness, batch, message

NO_MESSAGE = Position(-1, -1)


def send(h: Harness, batched: bool, flushes: Sequence[Sequence[tuple[str, bytes | None]]], *,
         compression: int = pb.NONE) -> list[Position]:
    """The test's producer: ``sendAsync`` per message, ``flush`` after each group. Batching
    on, a group is one batch entry; off, one entry per message. Returns every message id."""
    ids: list[Position] = []
    for group in flushes:
        if batched:
            (entry,) = h.publish(batch(group, compression=compression))
            ids.extend(entry.with_batch_index(i) for i in range(len(group)))
        else:
            ids.extend(h.publish(*(message(k, v, compression=compression) for k, v in group)))
    return ids


def create_consumer(h: Harness) -> Client:
    """Pulsar's ``createConsumer``: subscription "sub", receiverQueueSize 1, readCompacted."""
    return h.subscribe("sub", receiver_queue=1)


K0_K1 = [[("k0", b"v0"), ("k0", b"v1"), ("k0", b"v2")], [("k1", b"v0"), ("k1", b"v1"), ("k1", b"v2")]]


def test_testGetLastMessageIdWhenLedgerEmpty(make: MakeHarness) -> None:
    """§6.4 #59 testGetLastMessageIdWhenLedgerEmpty: an empty topic → -1:-1."""
    h = make()
    consumer = create_consumer(h)
    last = consumer.last_message_id()
    assert (last.ledger_id, last.entry_id) == (-1, -1)


def test_testGetLastMessageIdWhenNoNonEmptyLedgerExists(make: MakeHarness) -> None:
    """§6.4 #60 testGetLastMessageIdWhenNoNonEmptyLedgerExists: one msg read, ledger switched, old ledgers trimmed → -1:-1."""
    h = make()
    reader = h.reader(read_compacted=False, receiver_queue=1, name="sub")
    h.publish(message("k0", b"v0"))
    assert reader.receive() is not None
    h.unload()  # ledger switch; no durable cursor holds anything: every old ledger is trimmed
    assert len(h.ml.ledger_list()) == 1
    last = reader.last_message_id()
    assert (last.ledger_id, last.entry_id) == (-1, -1)


@pytest.mark.parametrize("batched", [True, False])
def test_testGetLastMessageIdBeforeCompaction(make: MakeHarness, batched: bool) -> None:
    """§6.4 #61 testGetLastMessageIdBeforeCompaction[batch]: k0:v0..v2, k1:v0..v2 → the topic's last message id."""
    h = make()
    consumer = create_consumer(h)
    ids = send(h, batched, K0_K1)
    assert consumer.last_message_id() == ids[-1]


@pytest.mark.parametrize("batched", [True, False])
def test_testGetLastMessageIdAfterCompaction(make: MakeHarness, batched: bool) -> None:
    """§6.4 #62 testGetLastMessageIdAfterCompaction[batch]: the same after compaction → still the topic's last message id."""
    h = make()
    consumer = create_consumer(h)
    ids = send(h, batched, K0_K1)
    h.compact()
    assert h.topic.horizon == h.ml.last_confirmed_position()
    assert consumer.last_message_id() == ids[-1]


@pytest.mark.parametrize("batched", [True, False])
def test_testGetLastMessageIdAfterCompactionWithCompression(make: MakeHarness, batched: bool) -> None:
    """§6.4 #63 testGetLastMessageIdAfterCompactionWithCompression[batch]: ZSTD, same expectation."""
    h = make()
    consumer = create_consumer(h)
    ids = send(h, batched, K0_K1, compression=pb.ZSTD)
    h.compact()
    assert consumer.last_message_id() == ids[-1]


@pytest.mark.parametrize("inject_cursor_delete_error", [False, True])
def test_testReadMsgsAfterDisableCompaction(make: MakeHarness, inject_cursor_delete_error: bool) -> None:
    """§6.4 #64 testReadMsgsAfterDisableCompaction[injectError]: k0..k2 compacted, s1 deleted (and a failed __compaction delete) → RC reader gets v0..v3."""
    h = make()
    s1 = h.subscribe("s1", initial=InitialPosition.EARLIEST, read_compacted=False)
    h.publish(message("k0", b"v0"), message("k1", b"v1"), message("k2", b"v2"))
    h.compact()
    s1.cursor.delete_durable()  # admin deleteSubscription(topic, "s1")

    if inject_cursor_delete_error:  # the first deletion of the __compaction cursor fails
        faults = h.metadata.database.fault_points

        def failing_once(**_: object) -> None:
            del faults["cursor.delete.before"]
            raise MetadataError("injected: session expired")

        faults["cursor.delete.before"] = failing_once
        with pytest.raises(MetadataError):
            h.topic.drop_view()
        assert h.topic.view is not None  # a failed deletion changes nothing

    h.unload()
    reader = h.reader()
    h.publish(message("k3", b"v3"))
    for expected in ("v0", "v1", "v2", "v3"):
        assert reader.has_message_available()
        m = reader.receive()
        assert m is not None and m.text == expected


@pytest.mark.parametrize("batched", [True, False])
def test_testGetLastMessageIdAfterCompactionEndWithNullMsg(make: MakeHarness, batched: bool) -> None:
    """§6.4 #65 testGetLastMessageIdAfterCompactionEndWithNullMsg[batch]: k1, k2 end with ∅ → the id of k0:v2."""
    h = make()
    consumer = create_consumer(h)
    ids = send(h, batched, [
        [("k0", b"v0"), ("k0", b"v1"), ("k0", b"v2")],
        [("k1", b"v0"), ("k1", b"v1"), ("k1", None), ("k2", b"v0"), ("k2", b"v1"), ("k2", None)],
    ])
    h.compact()
    assert consumer.last_message_id() == ids[2]


@pytest.mark.parametrize("batched", [True, False])
def test_testGetLastMessageIdAfterCompactionEndWithNullMsg2(make: MakeHarness, batched: bool) -> None:
    """§6.4 #66 testGetLastMessageIdAfterCompactionEndWithNullMsg2[batch]: k2 ends with ∅ → the id of k1:v2."""
    h = make()
    consumer = create_consumer(h)
    ids = send(h, batched, [
        [("k0", b"v0"), ("k0", b"v1")],
        [("k1", b"v0"), ("k1", b"v1"), ("k1", b"v2"), ("k2", b"v0"), ("k2", b"v1"), ("k2", None)],
    ])
    h.compact()
    assert consumer.last_message_id() == ids[4]


@pytest.mark.parametrize("batched", [True, False])
def test_testGetLastMessageIdAfterCompactionAllNullMsg(make: MakeHarness, batched: bool) -> None:
    """§6.4 #67 testGetLastMessageIdAfterCompactionAllNullMsg[batch]: every key ends with ∅ → -1:-1, not a batch id."""
    h = make()
    consumer = create_consumer(h)
    send(h, batched, [
        [("k0", b"v0"), ("k0", None)],
        [("k1", b"v0"), ("k1", None), ("k2", b"v0"), ("k2", None)],
    ])
    h.compact()
    last = consumer.last_message_id()
    assert last == NO_MESSAGE and last.batch_index == -1


@pytest.mark.parametrize("batched", [True, False])
def test_testReaderStuckWithCompaction(make: MakeHarness, batched: bool) -> None:
    """§6.4 #68 testReaderStuckWithCompaction[batch]: compacted, ledger switch + trim → a plain reader never gets stuck."""
    h = make()
    send(h, batched, [[("k0", b"v0"), ("k0", b"v1")]])
    h.compact()
    h.unload()
    assert len(h.ml.ledger_list()) == 1
    reader = h.reader(read_compacted=False, name="sub")
    while reader.has_message_available():
        assert reader.receive() is not None
