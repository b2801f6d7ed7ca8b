"""Pulsar's ``CompactorTest`` scenarios (reference ``pulsar-compaction.md`` §6.2), library level.

These inspect the compacted ledger directly, as Pulsar's tests open it with BookKeeper.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from compactor.errors import CompactionTimeoutError
from compactor.runs.runner import CompactionConfig, Compactor
from message.entry import iter_messages, parse_entry
from tests.unit.compactor.scenarios.support import (
    Harness,
    MakeHarness,
    RecordingStore,
    batch,
    message,
)


def compact_and_verify(h: Harness, expected: dict[str, bytes]) -> list[str]:
    """Pulsar's ``compactAndVerify``: one compacted entry per key holding its latest value;
    returns the keys in compacted-ledger order."""
    figures = h.compact()
    assert figures.ledger_id != -1 and h.holds(figures.ledger_id)
    entries = h.compacted_entries()
    assert len(entries) == len(expected), "should have as many entries as there are keys"
    remaining = dict(expected)
    keys = []
    for entry in entries:
        (m,) = list(iter_messages(parse_entry(entry.data)))
        assert m.key is not None
        keys.append(m.key)
        assert m.payload == remaining.pop(m.key), "compacted version should match expected version"
    assert not remaining
    return keys


def test_testCompaction(make: MakeHarness) -> None:
    """§6.2 #42 testCompaction: 1000 msgs over 10 keys → 10 entries, latest per key; removed ≥ 1, success time set, no failure."""
    h = make()
    rng = random.Random(0)
    expected: dict[str, bytes] = {}
    entries = []
    for j in range(1000):
        key = f"key{rng.randrange(10)}"
        data = f"my-message-{key}-{j}".encode()
        entries.append(message(key, data))
        expected[key] = data
    h.publish(*entries)
    compact_and_verify(h, expected)
    record = h.topic.record
    assert record.last_removed_events >= 1
    assert record.last_success_ms >= 1
    assert record.last_duration_ms >= 0
    assert record.last_failure_ms == 0


def test_testAllCompactedOut(make: MakeHarness) -> None:
    """§6.2 #43 testAllCompactedOut: retainNullKey; [K1:V1, K2:V2, K2:∅], then K1:∅ → every hasMessageAvailable yields a message."""
    h = make(compaction_config=CompactionConfig(retain_null_key=True))
    h.publish(batch([("K1", b"V1"), ("K2", b"V2"), ("K2", None)]))
    h.compact()
    h.publish(message("K1", None))
    h.compact()
    reader = h.reader(name="reader-test")
    while reader.has_message_available():
        assert reader.receive() is not None
    assert reader.receive() is None  # and nothing was hidden behind a false "no message"


def test_testCompactAddCompact(make: MakeHarness) -> None:
    """§6.2 #44 testCompactAddCompact: a:A1, b:B1, a:A2 → {a:A2, b:B1}; then b:B2 → {a:A2, b:B2}."""
    h = make()
    h.publish(message("a", b"A_1"), message("b", b"B_1"), message("a", b"A_2"))
    compact_and_verify(h, {"a": b"A_2", "b": b"B_1"})
    h.publish(message("b", b"B_2"))
    compact_and_verify(h, {"a": b"A_2", "b": b"B_2"})


def test_testCompactedInOrder(make: MakeHarness) -> None:
    """§6.2 #45 testCompactedInOrder: c:C1, a:A1, b:B1, a:A2 → compacted key order c, b, a."""
    h = make()
    h.publish(message("c", b"C_1"), message("a", b"A_1"), message("b", b"B_1"), message("a", b"A_2"))
    assert compact_and_verify(h, {"a": b"A_2", "b": b"B_1", "c": b"C_1"}) == ["c", "b", "a"]


def test_testCompactEmptyTopic(make: MakeHarness) -> None:
    """§6.2 #46 testCompactEmptyTopic: compacting a created, empty topic completes."""
    h = make()
    h.subscribe("sub1", read_compacted=False)  # creates the topic on the server side
    figures = h.compact()
    assert figures.ledger_id == -1
    assert h.topic.record.successes == 1 and h.topic.record.failures == 0


def test_testPhaseOneLoopTimeConfiguration(make: MakeHarness) -> None:
    """§6.2 #47 testPhaseOneLoopTimeConfiguration: the configured phase-one read timeout (60 s) is the compactor's."""
    assert Compactor(CompactionConfig(phase_one_read_timeout_s=60)).config.phase_one_read_timeout_s == 60
    # ... and it is the limit a stuck phase-one read runs into.
    h = make(record=True, compaction_config=CompactionConfig(phase_one_read_timeout_s=0.2))
    store = h.store
    assert isinstance(store, RecordingStore)
    h.publish(message("a", b"1"))
    release = store.hold_reads()
    backstop = threading.Timer(3.0, release.set)  # the held read returns after 3 s at worst
    backstop.start()
    started = time.monotonic()
    with pytest.raises(CompactionTimeoutError):
        h.compact()
    assert time.monotonic() - started < 2.0  # the run fails at the timeout, not when the read returns
    release.set()
    backstop.cancel()
    assert h.topic.view is None and h.topic.record.failures == 1


def test_testCompactedWithConcurrentSend(make: MakeHarness) -> None:
    """§6.2 #48 testCompactedWithConcurrentSend: compact repeatedly while 100 keys are sent → the view is the returned ledger, horizon ≥ last compacted entry."""
    h = make()

    def send() -> None:
        for i in range(100):
            h.publish(message(str(i), str(i).encode()))

    producer = threading.Thread(target=send)
    producer.start()
    published = -1
    while producer.is_alive() or published == -1:
        ledger_id = h.compact().ledger_id
        if ledger_id != -1:
            published = ledger_id
        if published != -1:
            assert h.holds(published)
    producer.join()
    view = h.topic.view
    assert view is not None and h.holds(published)
    last = h.compacted_entries()[-1]
    assert view.horizon >= last.position
