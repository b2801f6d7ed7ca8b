"""Pulsar's ``CompactionTest`` scenarios (reference ``pulsar-compaction.md`` §6.1), library level.

Each test is named after the Pulsar test method it re-enacts on the real stack (see
``support.py`` for how producers, the broker and clients are played).

Not here, or only in part, because the feature does not exist yet:

* #31 testHealthCheckTopicNotCompacted: no heartbeat namespaces, system topics or per-topic
  "compaction enabled" switch.
* #34 testDispatcherMaxReadSizeBytes: ``read_compacted`` has no byte budget (Pulsar's
  ``dispatcherMaxReadSizeBytes`` / ``applyMaxSizeCap``).
* #6: the "subscribe fails while the broker is down" step is a network matter.
* #35: the mid-run unload (the compactor's RawReader reconnecting, the broker redelivering)
  has no library counterpart; the outcome (no duplicate entries) is checked.
* #37, #40: no compaction-aware topic deletion exists; ``delete_topic`` composes what a
  forced deletion does (``drop_view``, then ``ManagedLedger.delete``).
* #38: no TTL monitor; its effect (the user subscription acknowledged to the end, never
  ``__compaction``) is applied by hand.
* #18-#22: no client-side encryption; entries carry ``encryption_keys`` and a sealed payload,
  which is all the broker sees.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest

from compactor.runs.runner import CompactionConfig
from compactor.view.topic import COMPACTION_SUBSCRIPTION
from cursor.cursor import InitialPosition
from cursor.store import CursorRecord
from ledger.managed_ledger import ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import EARLIEST
from ledger.storage import FileLedgerStore, SyncPolicy
from message.proto import pulsar_api_pb2 as pb
from tests.unit.compactor.scenarios.support import (
    REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST,
    TXN_ABORT,
    TXN_COMMIT,
    Harness,
    MakeHarness,
    Received,
    RecordingStore,
    batch,
    marker,
    message,
)

EARLIEST_SUB = InitialPosition.EARLIEST


def pairs(messages: list[Received]) -> list[tuple[str | None, str | None]]:
    return [(m.key, m.text) for m in messages]


def delete_topic(h: Harness) -> None:
    """A forced topic deletion at storage level: every subscription goes (``__compaction``
    through ``drop_view``, which deletes its compacted ledger), then the managed ledger."""
    h.topic.drop_view()
    h.ml.delete()


# -- 1..7: the basics ------------------------------------------------------------------


def test_testCompaction(make: MakeHarness) -> None:
    """§6.1 #1 testCompaction: 20 msgs/10 keys → compacted entries == #keys; RC latest per key; non-RC all 20."""
    h = make()
    h.subscribe("sub1")  # subscribe().close() before sending
    rng = random.Random(0)
    expected: dict[str, bytes] = {}
    everything: list[tuple[str, bytes]] = []
    for j in range(20):
        key = f"key{rng.randrange(10)}"
        data = f"my-message-{key}-{j}".encode()
        h.publish(message(key, data))
        expected[key] = data
        everything.append((key, data))
    figures = h.compact()
    assert len(h.compacted_entries()) == len(expected)
    assert h.compacted_ledger_id > -1 and figures.ledger_id == h.compacted_ledger_id

    compacted = h.subscribe("sub1").receive_all()
    assert len(compacted) == len(expected)
    assert {m.key: m.value for m in compacted} == expected

    full = h.subscribe("sub1", read_compacted=False).receive_all()  # same subscription, nothing acked
    assert [(m.key, m.value) for m in full] == everything


def test_testCompactionWithReader(make: MakeHarness) -> None:
    """§6.1 #2 testCompactionWithReader: infinite retention, readers from earliest: RC latest per key, non-RC history."""
    h = make(ledger_config=ManagedLedgerConfig(retention_time_ms=-1, retention_size_bytes=-1))
    rng = random.Random(0)
    expected: dict[str, str] = {}
    everything: list[tuple[str, str]] = []
    for j in range(20):
        key = f"key{rng.randrange(10)}"
        value = f"my-message-{key}-{j}"
        h.publish(message(key, value.encode()))
        expected[key] = value
        everything.append((key, value))
    h.compact()

    compacted = h.reader(read_compacted=True, name="r1").receive_all()
    assert len(compacted) == len(expected) and {m.key: m.text for m in compacted} == expected
    assert pairs(h.reader(read_compacted=False, name="r2").receive_all()) == everything


def test_testReadCompactedBeforeCompaction(make: MakeHarness) -> None:
    """§6.1 #3 testReadCompactedBeforeCompaction: c0,c1,c2 uncompacted → RC gets all 3; after compaction → c2."""
    h = make()
    h.subscribe("sub1")
    h.publish(*(message("key0", f"content{i}".encode()) for i in range(3)))
    before = h.subscribe("sub1").receive_all()
    assert pairs(before) == [("key0", "content0"), ("key0", "content1"), ("key0", "content2")]
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key0", "content2")]


def test_testReadEntriesAfterCompaction(make: MakeHarness) -> None:
    """§6.1 #4 testReadEntriesAfterCompaction: c0..c2, compact, c3 → RC gets c2 then c3."""
    h = make()
    h.subscribe("sub1")
    h.publish(*(message("key0", f"content{i}".encode()) for i in range(3)))
    h.compact()
    h.publish(message("key0", b"content3"))
    assert pairs(h.subscribe("sub1").receive_all()) == [("key0", "content2"), ("key0", "content3")]


def test_testSeekEarliestAfterCompaction(make: MakeHarness) -> None:
    """§6.1 #5 testSeekEarliestAfterCompaction: RC seek(earliest) → c2; non-RC seek(earliest) → c0,c1,c2."""
    h = make()
    h.publish(*(message("key0", f"content{i}".encode()) for i in range(3)))
    h.compact()
    rc = h.subscribe("sub1")
    rc.seek(EARLIEST)
    assert pairs(rc.receive_all()) == [("key0", "content2")]
    plain = h.subscribe("sub1", read_compacted=False)
    plain.seek(EARLIEST)
    assert pairs(plain.receive_all()) == [("key0", f"content{i}") for i in range(3)]


def test_testBrokerRestartAfterCompaction(tmp_path: Path) -> None:
    """§6.1 #6 testBrokerRestartAfterCompaction: compact, RC gets c2; restart the broker → RC still gets c2."""
    def start() -> Harness:
        store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
        return Harness(store, MetadataStore(str(tmp_path / "metadata.db")))

    h = start()
    h.subscribe("sub1")
    h.publish(*(message("key0", f"content{i}".encode()) for i in range(3)))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key0", "content2")]
    h.ml.close()
    h.store.shutdown()
    h.metadata.close()

    h = start()  # state comes back from the __compaction cursor's properties
    try:
        assert h.topic.view is not None
        assert pairs(h.subscribe("sub1").receive_all()) == [("key0", "content2")]
    finally:
        h.store.shutdown()
        h.metadata.close()


def test_testCompactEmptyTopic(make: MakeHarness) -> None:
    """§6.1 #7 testCompactEmptyTopic: compacting an empty topic is no error; then key0:content0 → RC gets it."""
    h = make()
    h.subscribe("sub1")
    assert h.compact().ledger_id == -1
    h.publish(message("key0", b"content0"))
    assert pairs(h.subscribe("sub1").receive_all()) == [("key0", "content0")]


# -- 8..14: ids, batches, tombstones ---------------------------------------------------


def test_testFirstMessageRetained(make: MakeHarness) -> None:
    """§6.1 #8 testFirstMessageRetained: key1:m1, key2:m2, key2:m3 → RC gets m1 and m3 with their original ids."""
    h = make()
    h.subscribe("sub1")
    h.publish(message("key1", b"my-message-1"), message("key2", b"my-message-2"), message("key2", b"my-message-3"))
    before = h.subscribe("sub1").receive_all()
    assert len(before) == 3
    h.compact()
    after = h.subscribe("sub1").receive_all()
    assert pairs(after) == [("key1", "my-message-1"), ("key2", "my-message-3")]
    assert [m.message_id for m in after] == [before[0].message_id, before[2].message_id]


def test_testBatchMessageIdsDontChange(make: MakeHarness) -> None:
    """§6.1 #9 testBatchMessageIdsDontChange: batch [key1:m1, key2:m2, key2:m3] → RC gets slot 0 and slot 2, same ids."""
    h = make()
    h.subscribe("sub1")
    h.publish(batch([("key1", b"my-message-1"), ("key2", b"my-message-2"), ("key2", b"my-message-3")]))
    before = h.subscribe("sub1").receive_all()
    assert len({m.message_id.entry_position() for m in before}) == 1  # all in one batch
    h.compact()
    after = h.subscribe("sub1").receive_all()
    assert pairs(after) == [("key1", "my-message-1"), ("key2", "my-message-3")]
    assert [m.message_id for m in after] == [before[0].message_id, before[2].message_id]


def test_testBatchMessageWithNullValue(make: MakeHarness) -> None:
    """§6.1 #10 testBatchMessageWithNullValue: 3 batches with null values → RC gets exactly key2, key3, key5."""
    h = make()
    h.subscribe("sub1", receiver_queue=1)
    h.publish(
        batch([("key1", b"my-message-1"), ("key1", None), ("key2", b"my-message-3")]),
        batch([("key3", b"my-message-4"), ("key3", b"my-message-5"), ("key3", b"my-message-6")]),
        batch([("key4", b"my-message-7"), ("key4", None), ("key5", b"my-message-9")]),
    )
    h.compact()
    got = h.subscribe("sub1", receiver_queue=1).receive_all()
    assert [m.key for m in got] == ["key2", "key3", "key5"]


def test_testWholeBatchCompactedOut(make: MakeHarness) -> None:
    """§6.1 #11 testWholeBatchCompactedOut: batch [key1:m1..m3] then key1:m4 → RC gets only m4; batch not written."""
    h = make()
    h.subscribe("sub1")
    h.publish(batch([("key1", b"my-message-1"), ("key1", b"my-message-2"), ("key1", b"my-message-3")]),
              message("key1", b"my-message-4"))
    h.compact()
    assert len(h.compacted_entries()) == 1
    assert pairs(h.subscribe("sub1").receive_all()) == [("key1", "my-message-4")]


@pytest.mark.parametrize("retain_null_key", [True, False])
def test_testKeyLessMessagesPassThrough(make: MakeHarness, retain_null_key: bool) -> None:
    """§6.1 #12 testKeyLessMessagesPassThrough[retainNullKey]: key-less messages kept in order iff retainNullKey."""
    h = make(compaction_config=CompactionConfig(retain_null_key=retain_null_key))
    h.subscribe("sub1")
    h.publish(
        message(None, b"my-message-1"),
        batch([(None, b"my-message-2"), ("key1", b"my-message-3"), ("key1", b"my-message-4")]),
        batch([("key2", b"my-message-5"), ("key2", b"my-message-6"), (None, b"my-message-7")]),
        message(None, b"my-message-8"),
    )
    h.compact()
    got = pairs(h.subscribe("sub1").receive_all())
    if retain_null_key:
        assert got == [(None, "my-message-1"), (None, "my-message-2"), ("key1", "my-message-4"),
                       ("key2", "my-message-6"), (None, "my-message-7"), (None, "my-message-8")]
    else:
        assert got == [("key1", "my-message-4"), ("key2", "my-message-6")]


def _empty_payload_deletes(compression: int) -> list[bytes]:
    return [
        message("key0", b"my-message-0", compression=compression),   # key0 persists through it all
        message("key1", b"my-message-1", compression=compression),   # key1 added, then deleted
        message("key1", None, compression=compression),
        batch([("key2", b"my-message-2"), ("key3", b"my-message-3"), ("key2", None)],
              compression=compression),                                 # key2 added and deleted in one batch
        batch([("key3", None), ("key4", b"my-message-3"), ("key4", None)],
              compression=compression),                                 # key3 deleted in a later batch
        message("key4", b"my-message-4", compression=compression),   # key4 resurrected
    ]


def test_testEmptyPayloadDeletes(make: MakeHarness) -> None:
    """§6.1 #13 testEmptyPayloadDeletes: tombstones in and across batches → RC gets key0:m0 then key4:m4 only."""
    h = make()
    h.subscribe("sub1")
    h.publish(*_empty_payload_deletes(pb.NONE))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key0", "my-message-0"), ("key4", "my-message-4")]


def test_testEmptyPayloadDeletesWhenCompressed(make: MakeHarness) -> None:
    """§6.1 #14 testEmptyPayloadDeletesWhenCompressed: the same with LZ4 on both producers → same result."""
    h = make()
    h.subscribe("sub1")
    h.publish(*_empty_payload_deletes(pb.LZ4))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key0", "my-message-0"), ("key4", "my-message-4")]


# -- 15..22: incremental runs, compression, encryption ----------------------------------


def test_testCompactorReadsCompacted(make: MakeHarness) -> None:
    """§6.1 #15 testCompactorReadsCompacted: the second run reads the previous compacted ledger, not the raw ledgers it covers."""
    h = make(record=True)
    store = h.store
    assert isinstance(store, RecordingStore)
    h.subscribe("sub1", read_compacted=False)
    h.publish(message("key0", b"my-message-0"))
    h.unload(trim=False)  # force a ledger roll
    h.publish(message("key1", b"my-message-1"))
    ledgers = [record.ledger_id for record in h.ml.ledger_list()]
    assert len(ledgers) == 2

    store.reads.clear()
    h.compact()
    assert ledgers[0] in store.reads  # the first ledger's raw data is compacted
    first_compacted = h.compacted_ledger_id

    h.unload(trim=False)
    h.publish(message("key2", b"my-message-2"))
    ledgers = [record.ledger_id for record in h.ml.ledger_list()]
    assert len(ledgers) == 3
    store.reads.clear()
    h.compact()
    # Pulsar's comment expects the penultimate ledger to be opened too (a BookKeeper
    # handle artefact, corrected upstream in #25119); every raw entry it holds is at or
    # before the horizon, so compactd need not read it.
    assert first_compacted in store.reads
    assert ledgers[0] not in store.reads and ledgers[1] not in store.reads
    assert ledgers[2] in store.reads

    got = h.subscribe("sub1").receive_all()
    assert pairs(got) == [("key0", "my-message-0"), ("key1", "my-message-1"), ("key2", "my-message-2")]


def test_testCompactCompressedNoBatch(make: MakeHarness) -> None:
    """§6.1 #16 testCompactCompressedNoBatch: LZ4 key1:m1, key2:m2, key2:m3 → RC key1:m1, key2:m3."""
    h = make()
    h.subscribe("sub1")
    h.publish(message("key1", b"my-message-1", compression=pb.LZ4),
              message("key2", b"my-message-2", compression=pb.LZ4),
              message("key2", b"my-message-3", compression=pb.LZ4))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key1", "my-message-1"), ("key2", "my-message-3")]


def test_testCompactCompressedBatching(make: MakeHarness) -> None:
    """§6.1 #17 testCompactCompressedBatching: LZ4 batch [key1:m1, key2:m2, key2:m3] → RC key1:m1, key2:m3."""
    h = make()
    h.subscribe("sub1")
    h.publish(batch([("key1", b"my-message-1"), ("key2", b"my-message-2"), ("key2", b"my-message-3")],
                    compression=pb.LZ4))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key1", "my-message-1"), ("key2", "my-message-3")]


def test_testCompactEncryptedNoBatch(make: MakeHarness) -> None:
    """§6.1 #18 testCompactEncryptedNoBatch: encrypted key1:m1, key2:m2, key2:m3 → RC (with key) key1:m1, key2:m3."""
    h = make()
    h.subscribe("sub1")
    h.publish(message("key1", b"my-message-1", encrypted=True),
              message("key2", b"my-message-2", encrypted=True),
              message("key2", b"my-message-3", encrypted=True))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key1", "my-message-1"), ("key2", "my-message-3")]


def test_testCompactEncryptedBatching(make: MakeHarness) -> None:
    """§6.1 #19 testCompactEncryptedBatching: encrypted batch → two-phase passes all three messages through."""
    h = make()
    h.subscribe("sub1")
    entry = batch([("key1", b"my-message-1"), ("key2", b"my-message-2"), ("key2", b"my-message-3")], encrypted=True)
    h.publish(entry)
    h.compact()
    assert [e.data for e in h.compacted_entries()] == [entry]  # kept whole, byte for byte
    assert pairs(h.subscribe("sub1").receive_all()) == [
        ("key1", "my-message-1"), ("key2", "my-message-2"), ("key2", "my-message-3")]


def test_testCompactEncryptedAndCompressedNoBatch(make: MakeHarness) -> None:
    """§6.1 #20 testCompactEncryptedAndCompressedNoBatch: encrypted+LZ4 non-batched → key1:m1, key2:m3."""
    h = make()
    h.subscribe("sub1")
    h.publish(*(message(k, v, compression=pb.LZ4, encrypted=True) for k, v in
                [("key1", b"my-message-1"), ("key2", b"my-message-2"), ("key2", b"my-message-3")]))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("key1", "my-message-1"), ("key2", "my-message-3")]


def test_testCompactEncryptedAndCompressedBatching(make: MakeHarness) -> None:
    """§6.1 #21 testCompactEncryptedAndCompressedBatching: encrypted+LZ4 batch → all three pass through."""
    h = make()
    h.subscribe("sub1")
    h.publish(batch([("key1", b"my-message-1"), ("key2", b"my-message-2"), ("key2", b"my-message-3")],
                    compression=pb.LZ4, encrypted=True))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [
        ("key1", "my-message-1"), ("key2", "my-message-2"), ("key2", "my-message-3")]


def test_testEmptyPayloadDeletesWhenEncrypted(make: MakeHarness) -> None:
    """§6.1 #22 testEmptyPayloadDeletesWhenEncrypted: non-batched tombstones work; the encrypted batch passes whole."""
    h = make()
    h.subscribe("sub1")
    h.publish(
        message("key0", b"my-message-0", encrypted=True),
        message("key1", b"my-message-1", encrypted=True),
        message("key1", None, encrypted=True),
        batch([("key2", b"my-message-2"), ("key3", b"my-message-3"), ("key2", None)], encrypted=True),
        message("key4", b"my-message-4", encrypted=True),
    )
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [
        ("key0", "my-message-0"), ("key2", "my-message-2"), ("key3", "my-message-3"), ("key2", None),
        ("key4", "my-message-4")]


# -- 23..30: empty tails, batch/non-batch mixes, repeated runs ---------------------------


def _sends(batching: bool, items: list[tuple[str, bytes]]) -> list[bytes]:
    """Synchronous sends: one entry each; a batching producer sends one-message batches."""
    if batching:
        return [batch([item]) for item in items]
    return [message(key, value) for key, value in items]


def _grouped(batching: bool, items: list[tuple[str, bytes]], size: int) -> list[bytes]:
    """sendAsync with ``batchingMaxMessages=size``: batches of ``size`` (non-batched without batching)."""
    if not batching:
        return [message(key, value) for key, value in items]
    return [batch(items[i : i + size]) for i in range(0, len(items), size)]


@pytest.mark.parametrize("batching", [True, False])
def test_testCompactionWithLastDeletedKey(make: MakeHarness, batching: bool) -> None:
    """§6.1 #23 testCompactionWithLastDeletedKey[batching]: 1:1, 2:2, 3:3, 1:"", 2:"" → RC receives key 3 only."""
    h = make()
    h.subscribe("sub1")
    h.publish(*_sends(batching, [("1", b"1"), ("2", b"2"), ("3", b"3"), ("1", b""), ("2", b"")]))
    h.compact()
    assert pairs(h.subscribe("sub1").receive_all()) == [("3", "3")]


@pytest.mark.parametrize("batching", [True, False])
def test_testEmptyCompactionLedger(make: MakeHarness, batching: bool) -> None:
    """§6.1 #24 testEmptyCompactionLedger[batching]: 1:1, 2:2, 1:"", 2:"" → empty compacted ledger, RC receives nothing."""
    h = make()
    h.subscribe("sub1")
    h.publish(*_sends(batching, [("1", b"1"), ("2", b"2"), ("1", b""), ("2", b"")]))
    h.compact()
    assert h.compacted_ledger_id != -1 and h.compacted_entries() == []
    assert h.subscribe("sub1").receive() is None


@pytest.mark.parametrize("batching", [True, False])
def test_testAllEmptyCompactionLedger(make: MakeHarness, batching: bool) -> None:
    """§6.1 #25 testAllEmptyCompactionLedger[batching]: 10 × key "1" with empty value → RC from earliest gets nothing."""
    h = make()
    h.publish(*_grouped(batching, [("1", b"")] * 10, 2))
    h.compact()
    assert h.subscribe("sub1", initial=EARLIEST_SUB).receive() is None


def _k1_history() -> list[bytes]:
    return [message("k1", b"0"), batch([("k1", b"1"), ("k1", b"2")]), message("k1", b"3"),
            batch([("k1", b"4"), ("k1", b"5")])]


def test_testBatchAndNonBatchWithoutEmptyPayload(make: MakeHarness) -> None:
    """§6.1 #26 testBatchAndNonBatchWithoutEmptyPayload: mixed batch/non-batch → RC exactly k1:5, k2:3, then nothing."""
    h = make()
    h.publish(*_k1_history(), batch([("k2", b"0"), ("k2", b"1"), ("k2", b"2")]), message("k2", b"3"))
    h.compact()
    consumer = h.subscribe("sub1", initial=EARLIEST_SUB)
    assert pairs(consumer.receive_all()) == [("k1", "5"), ("k2", "3")]
    assert consumer.receive() is None


def test_testBatchAndNonBatchWithEmptyPayload(make: MakeHarness) -> None:
    """§6.1 #27 testBatchAndNonBatchWithEmptyPayload: k2 batch then k2:"" then k3:0 → RC exactly k1:5, k3:0."""
    h = make()
    h.publish(*_k1_history(), batch([("k2", b"10"), ("k2", b"11"), ("k2", b"12")]), message("k2", b""),
              message("k3", b"0"))
    h.compact()
    consumer = h.subscribe("sub1", initial=EARLIEST_SUB)
    assert pairs(consumer.receive_all()) == [("k1", "5"), ("k3", "0")]
    assert consumer.receive() is None


def test_testBatchAndNonBatchEndOfEmptyPayload(make: MakeHarness) -> None:
    """§6.1 #28 testBatchAndNonBatchEndOfEmptyPayload: the topic ends with a tombstone → RC exactly k1:5."""
    h = make()
    h.publish(*_k1_history(), batch([("k2", b"10"), ("k2", b"11"), ("k2", b"12")]), message("k2", b""))
    h.compact()
    consumer = h.subscribe("sub1", initial=EARLIEST_SUB)
    assert pairs(consumer.receive_all()) == [("k1", "5")]
    assert consumer.receive() is None


@pytest.mark.parametrize("batching", [True, False])
def test_testCompactMultipleTimesWithoutEmptyMessage(make: MakeHarness, batching: bool) -> None:
    """§6.1 #29 testCompactMultipleTimesWithoutEmptyMessage[batching]: 0..9, compact, 10..19, compact → RC gets "19"."""
    h = make()
    h.publish(*_grouped(batching, [("1", str(i).encode()) for i in range(10)], 2))
    h.compact()
    h.publish(*_grouped(batching, [("1", str(i).encode()) for i in range(10, 20)], 2))
    h.compact()
    consumer = h.subscribe("sub1", initial=EARLIEST_SUB)
    assert pairs(consumer.receive_all()) == [("1", "19")]


@pytest.mark.parametrize("batching", [True, False])
def test_testReadUnCompacted(make: MakeHarness, batching: bool) -> None:
    """§6.1 #30 testReadUnCompacted[batching]: compacted 9 then raw 10..19; tombstone+compact → nothing; then 20..29 only."""
    h = make()
    h.publish(*_grouped(batching, [("1", str(i).encode()) for i in range(10)], 2))
    h.compact()
    h.publish(*_grouped(batching, [("1", str(i).encode()) for i in range(10, 20)], 2))
    sub1 = h.subscribe("sub1", initial=EARLIEST_SUB)
    got = []
    while (m := sub1.receive()) is not None:
        got.append(m.text)
        sub1.acknowledge(m)
    assert got == [str(i) for i in range(9, 20)]

    h.publish(message("1", b""))
    h.compact()
    assert h.subscribe("sub2", initial=EARLIEST_SUB).receive() is None

    h.publish(*_grouped(batching, [("1", str(i).encode()) for i in range(20, 30)], 2))
    sub3 = h.subscribe("sub3", initial=EARLIEST_SUB)
    assert [m.text for m in sub3.receive_all()] == [str(i) for i in range(20, 30)]


# -- 32..41: markers, permits, deletion, TTL, reconnection, rollover ---------------------


def test_testCompactionWithMarker(make: MakeHarness) -> None:
    """§6.1 #32 testCompactionWithMarker: msg, ~100 random server markers, msg → compaction completes with a ledger."""
    h = make()
    h.subscribe("test-compaction-sub")
    rng = random.Random(0)
    h.publish(message(None, b"msg-1"))
    kinds = [TXN_COMMIT, TXN_ABORT, REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST]
    h.publish(*(marker(rng.choice(kinds), f"marker-{i}".encode()) for i in range(100)))
    h.publish(message(None, b"msg-2"))
    figures = h.compact()
    assert figures.ledger_id != -1 and h.compacted_ledger_id == figures.ledger_id


def test_testReceiverQueueSize(make: MakeHarness) -> None:
    """§6.1 #33 testReceiverQueueSize: 10 msgs over keys 0/1, compacted; RC with receiverQueueSize=1 buffers exactly 1."""
    h = make()
    h.publish(*(message(str(i % 2), str(i).encode()) for i in range(10)))
    h.compact()
    consumer = h.subscribe("my-sub", initial=EARLIEST_SUB, receiver_queue=1)
    assert len(consumer.dispatch()) == 1
    assert consumer.buffered() == 1


def test_testCompactionDuplicate(make: MakeHarness) -> None:
    """§6.1 #35 testCompactionDuplicate: 1000 msgs over 800 keys → compacted entries == #keys, RC gets each latest once."""
    h = make()
    assert h.compact().ledger_id == -1  # creates the __compaction cursor
    h.subscribe("sub1")
    rng = random.Random(0)
    expected: dict[str, bytes] = {}
    entries = []
    for j in range(1000):
        key = f"key{rng.randrange(800)}"
        data = f"my-message-{key}-{j}".encode()
        entries.append(message(key, data))
        expected[key] = data
    h.publish(*entries)
    h.compact()
    assert len(h.compacted_entries()) == len(expected)
    got = h.subscribe("sub1").receive_all()
    assert len(got) == len(expected) and {m.key: m.value for m in got} == expected


def test_testDeleteCompactedLedger(make: MakeHarness) -> None:
    """§6.1 #36 testDeleteCompactedLedger: deleting __compaction deletes its ledger; recompaction; topic delete deletes it too."""
    h = make()
    h.subscribe("my-sub")
    h.publish(*(message(str(i % 2), str(i).encode()) for i in range(10)))
    h.compact()
    first = h.compacted_ledger_id
    assert first != -1 and len(h.compacted_entries()) == 2

    h.topic.drop_view()  # admin deleteSubscription(topic, "__compaction")
    assert h.compacted_ledger_id == -1
    assert not h.ledger_exists(first)

    h.compact()
    second = h.compacted_ledger_id
    assert second != -1 and len(h.compacted_entries()) == 2

    delete_topic(h)
    assert not h.ledger_exists(second)
    assert h.store.list() == []


def test_testDeleteCompactedLedgerWithSlowAck(make: MakeHarness) -> None:
    """§6.1 #37 testDeleteCompactedLedgerWithSlowAck: the topic is force-deleted while the compaction ack is slow → no leak."""
    h = make(ledger_config=ManagedLedgerConfig(retention_time_ms=-1, retention_size_bytes=-1))
    h.publish(message("0", b"0"))
    h.compact()  # creates __compaction
    h.publish(*(message(str(i % 2), str(i).encode()) for i in range(10)))

    acked = threading.Event()
    acked_ledger: list[int] = []

    def slow_save(record: CursorRecord) -> None:  # the ack persists, then returns 500 ms late
        if record.name == "__compaction" and "CompactedTopicLedger" in record.properties:
            acked_ledger.append(record.properties["CompactedTopicLedger"])
            acked.set()
            time.sleep(0.5)

    h.metadata.database.fault_points["cursor.save.after"] = slow_save
    with ThreadPoolExecutor(max_workers=1) as pool:
        run = pool.submit(h.compact)
        assert acked.wait(timeout=9)
        delete_topic(h)
        wait([run], timeout=10)  # it may fail: the topic is gone under it
        assert run.done()
    assert acked_ledger and not h.ledger_exists(acked_ledger[0])
    assert h.store.list() == []


def test_testCompactionWithTTL(make: MakeHarness) -> None:
    """§6.1 #38 testCompactionWithTTL: expiry of user subs + unload keeps uncompacted K1:V3,K2:V4 → RC gets V3, V4, V5."""
    h = make()
    sub = h.subscribe("sub")
    h.publish(message("K1", b"V1"), message("K2", b"V2"))
    h.compact()
    h.publish(message("K1", b"V3"), message("K2", b"V4"))
    # expireMessagesForAllSubscriptions: the user subscription jumps to the end; message
    # expiry never applies to __compaction (#20982). No TTL monitor exists yet: this is its effect.
    sub.cursor.mark_delete(h.ml.last_confirmed_position())
    h.unload()  # trims what every durable cursor consumed
    assert h.ml.number_of_entries == 4
    h.publish(message("K3", b"V5"))
    h.compact()
    consumer = h.subscribe("sub-2", initial=EARLIEST_SUB)
    assert [m.text for m in consumer.receive_all()] == ["V3", "V4", "V5"]


def test_testAcknowledgeWithReconnection(make: MakeHarness) -> None:
    """§6.1 #39 testAcknowledgeWithReconnection: raw trimmed; read+ack 5, reconnect, read the other 5; then K:V; MD == LAC."""
    h = make()
    h.publish(*(message(str(i), str(i).encode()) for i in range(10)))
    h.compact()
    h.unload()
    assert h.ml.number_of_entries == 0

    consumer = h.subscribe("my-sub", initial=EARLIEST_SUB, receiver_queue=1)
    results = []
    for _ in range(5):
        m = consumer.receive()
        assert m is not None
        results.append(m.text)
        consumer.acknowledge(m)
    assert consumer.cursor.backlog_entries() == 0

    h.unload()
    consumer.reconnect()
    for _ in range(5):
        m = consumer.receive()
        if m is None:
            break
        results.append(m.text)
        consumer.acknowledge(m)
    assert results == [str(i) for i in range(10)]
    assert consumer.receive() is None

    h.unload()
    consumer.reconnect()
    h.publish(message("K", b"V"))
    m = consumer.receive()
    assert m is not None and m.text == "V"
    consumer.acknowledge(m)
    assert consumer.cursor.mark_delete_position == h.ml.last_confirmed_position()


def test_testConcurrentCompactionAndTopicDelete(make: MakeHarness) -> None:
    """§6.1 #40 testConcurrentCompactionAndTopicDelete: force-delete while compaction reads are held → deletion completes."""
    h = make(record=True)
    store = h.store
    assert isinstance(store, RecordingStore)
    h.publish(*(message(str(i), str(i).encode()) for i in range(2000)))
    h.subscribe("s1", initial=EARLIEST_SUB)
    release = store.hold_reads()
    in_flight = threading.Event()

    def progress(_phase: str, _done: int, _total: int) -> None:
        in_flight.set()  # called as phase one starts reading, and only then
    with ThreadPoolExecutor(max_workers=2) as pool:
        run = pool.submit(h.compactor.compact, h.topic, progress=progress)
        assert in_flight.wait(15)  # the run is in flight: it holds its cursor, its reads are held
        deletion = pool.submit(delete_topic, h)
        assert deletion.result(timeout=15) is None  # the deletion does not wait for the run
        assert not run.done()  # still held at a read while the topic is deleted
        release.set()
        wait([run], timeout=15)  # the run fails: the topic is deleted under it
        assert run.done() and run.exception() is not None
    assert h.store.list() == []  # nothing of the topic left behind
    assert h.topic.view is None
    assert h.cursors.load(h.ml.name, COMPACTION_SUBSCRIPTION) is None  # not brought back


def test_testEarliestSubsAfterRollover(make: MakeHarness) -> None:
    """§6.1 #41 testEarliestSubsAfterRollover: compacted 0..9, raw trimmed, K:V in a new ledger → RC earliest gets 0..9, V."""
    h = make()
    h.publish(*(message(str(i), str(i).encode()) for i in range(10)))
    h.compact()
    h.unload()
    assert h.ml.number_of_entries == 0
    h.publish(message("K", b"V"))
    consumer = h.subscribe("my-sub", initial=EARLIEST_SUB, receiver_queue=1)
    results = []
    while (m := consumer.receive()) is not None:
        results.append(m.text)
        consumer.acknowledge(m)
    assert results == [str(i) for i in range(10)] + ["V"]
