"""Pulsar's ``CompactedTopicTest`` scenarios (reference ``pulsar-compaction.md`` §6.3 #49-#54)."""

from __future__ import annotations

import random

import pytest

from compactor.view.view import CompactedEntry, CompactedView, encode_compacted_entry
from ledger.position import Position
from ledger.storage import MemoryLedgerStore
from tests.unit.compactor.scenarios.support import MakeHarness, batch, message

LONG_MAX = 2**63 - 1


def build_compacted_ledger(
    store: MemoryLedgerStore, count: int, rng: random.Random
) -> tuple[int, list[tuple[Position, int]], list[tuple[Position, int]]]:
    """Pulsar's ``buildCompactedLedger``: ``count`` ids with random gaps, some across ledgers.

    Returns the ledger id, ``(id, index)`` of every stored entry, and ``(gap id, index of
    the entry that should be found for it)``.
    """
    ledger_id = store.create({"component": "compacted-ledger"})
    positions: list[tuple[Position, int]] = []
    ids_in_gaps: list[tuple[Position, int]] = []
    current_ledger, current_entry = 10, 0
    for index in range(count):
        gap_ids = []
        if rng.randrange(10) == 1:
            delta = rng.randrange(10) + 1
            gap_ids.append(Position(current_ledger, current_entry + 1))
            current_ledger += delta
            current_entry = 0
        delta = rng.randrange(5)
        if delta != 0:
            gap_ids.append(Position(current_ledger, current_entry + 1))
        current_entry += delta + 1
        position = Position(current_ledger, current_entry)
        stored = store.append(ledger_id, encode_compacted_entry(CompactedEntry(position, b""))).result()
        assert stored == index
        positions.append((position, index))
        ids_in_gaps.extend((gap, index) for gap in gap_ids)
    store.close(ledger_id)
    return ledger_id, positions, ids_in_gaps


def test_testEntryLookup() -> None:
    """§6.3 #49 testEntryLookup: 500 ids with random gaps → (0,0)→0, (MAX,0)/after last→NEWER, each id→its index, each gap→next."""
    rng = random.Random(0)
    store = MemoryLedgerStore()
    ledger_id, positions, ids_in_gaps = build_compacted_ledger(store, 500, rng)
    first, last = positions[0][0], positions[-1][0]
    view = CompactedView(store, ledger_id, last)

    assert view.find_start(Position(0, 0)) == 0
    assert view.find_start(Position(LONG_MAX, 0)) is None  # NEWER_THAN_COMPACTED
    assert view.find_start(Position(first.ledger_id, 0)) == 0  # entry 0 is never stored
    assert view.find_start(Position(last.ledger_id, last.entry_id + 1)) is None

    rng.shuffle(positions)  # make the id cache work hard
    rng.shuffle(ids_in_gaps)
    for position, index in positions:
        assert view.find_start(position) == index
    assert ids_in_gaps
    for gap, index in ids_in_gaps:
        assert view.find_start(gap) == index


def test_testCleanupOldCompactedTopicLedger(make: MakeHarness) -> None:
    """§6.3 #50 testCleanupOldCompactedTopicLedger: publishing a new compacted ledger deletes the old one; the new one stays readable.
    (Pulsar's runs are full rewrites; an incremental run keeps the old ledger in the view.)"""
    h = make()
    h.publish(message("a", b"1"))
    h.compact()
    old = h.compacted_ledger_id
    assert h.ledger_exists(old)
    h.publish(message("b", b"1"))
    h.compact(rewrite=True)
    new = h.compacted_ledger_id
    assert new != old
    assert not h.ledger_exists(old)
    assert h.ledger_exists(new) and len(h.compacted_entries()) == 2


@pytest.mark.parametrize("batch_enabled", [False, True])
def test_testCompactWithEmptyMessage(make: MakeHarness, batch_enabled: bool) -> None:
    """§6.3 #51 testCompactWithEmptyMessage[batch]: 10 × key "1" empty → compaction succeeds; 10 more → succeeds again."""
    h = make(name="persistent://my-property/use/my-ns/testCompactWithEmptyMessage-partition-0")

    def send_ten() -> None:
        if batch_enabled:  # batchingMaxMessages = messages / 2
            h.publish(*(batch([("1", b"")] * 5) for _ in range(2)))
        else:
            h.publish(*(message("1", b"") for _ in range(10)))

    send_ten()
    h.compact()
    assert h.topic.record.successes == 1 and h.topic.record.failures == 0
    send_ten()
    h.compact()
    assert h.topic.record.successes == 2 and h.topic.record.failures == 0
    assert h.compacted_entries() == []


def test_testReadMessageFromCompactedLedger(make: MakeHarness) -> None:
    """§6.3 #52 testReadMessageFromCompactedLedger: 10 × key1 compacted, then 10 × key2 → RC reader: 1 key1 + 10 key2."""
    h = make()
    h.publish(*(message("1", b"test compaction msg") for _ in range(10)))
    h.compact()
    h.publish(*(message("2", b"test compaction msg v2") for _ in range(10)))
    reader = h.reader(name="test")
    compacted = uncompacted = 0
    while reader.has_message_available():
        m = reader.receive()
        assert m is not None
        if (m.key, m.text) == ("1", "test compaction msg"):
            compacted += 1
        elif (m.key, m.text) == ("2", "test compaction msg v2"):
            uncompacted += 1
    assert compacted == 1
    assert uncompacted == 10


def test_testLastMessageIdForCompactedLedger(make: MakeHarness) -> None:
    """§6.3 #53 testLastMessageIdForCompactedLedger: raw trimmed → RC reader has 1 message, last id == its id, then none; again after another unload."""
    h = make()
    h.publish(*(message("1", b"test compaction msg") for _ in range(10)))
    h.compact()
    h.unload()  # ledger rollover; every raw entry is compacted, so the raw ledger is trimmed
    assert len(h.ml.ledger_list()) == 1 and h.ml.number_of_entries == 0

    reader = h.reader(name="test")
    assert reader.has_message_available()
    received = reader.receive()
    assert received is not None and received.text == "test compaction msg"
    assert reader.last_message_id() == received.message_id
    assert not reader.has_message_available()

    h.unload()  # the last confirmed entry is now "ledger:-1"
    assert h.ml.last_confirmed_position().entry_id == -1 and h.compacted_ledger_id > 0
    reader = h.reader(name="test")
    assert reader.has_message_available()
    assert reader.receive() is not None
    assert not reader.has_message_available()


def test_testDoNotLossTheLastCompactedLedgerData(make: MakeHarness) -> None:
    """§6.3 #54 testDoNotLossTheLastCompactedLedgerData: 2000 msgs/200 keys → 200; unload twice; a new key → 201 entries."""
    h = make()
    h.publish(*(message(str(i % 200), b"Test") for i in range(2000)))
    h.compact()
    assert h.compacted_ledger_id != -1 and len(h.compacted_entries()) == 200
    h.unload()
    assert len(h.ml.ledger_list()) == 1
    h.unload()
    h.publish(message("200", b"Test"))
    h.compact()
    assert len(h.compacted_entries()) == 201
