"""The persist schedule of deferred cursors (``CursorStore.save_later``, ``cursor.store``).

A subscription's acknowledgements change its cursor in memory and are written at most
``mark_delete_rate_limit`` times a second per cursor, in the background; a clean close
writes what is queued; a crash (the cursor dropped, the store never flushed) loses at most
the acknowledgements after the last write, which come again; a persisted state never goes
back to an older one. Most tests drive the schedule by hand (``background=False``, a fake
clock, ``write_due``); one runs the real background thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursor import InitialPosition, ManagedCursor
from cursor.store import CursorRecord, CursorStore
from ledger.errors import MetadataError
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import MemoryLedgerStore

TOPIC = "persistent://public/default/schedule"
SUB = "sub"
POLL_S = 0.01
BOUND_S = 10.0


class Clock:
    """Monotonic seconds moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Writes:
    """Counts committed batch writes through the ``cursor.save_batch.after`` fault point."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.count = 0
        metadata.database.fault_points["cursor.save_batch.after"] = self

    def __call__(self, **details: object) -> None:
        self.count += 1


@pytest.fixture
def metadata(tmp_path: Path) -> Iterator[MetadataStore]:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    yield metadata
    metadata.close()


def _ledger(metadata: MetadataStore, entries: int) -> tuple[ManagedLedger, list[Position]]:
    ml = ManagedLedger.open(TOPIC, MemoryLedgerStore(), metadata, ManagedLedgerConfig(max_entries_per_ledger=7))
    positions = [f.result(timeout=10) for f in [ml.append(b"m%d" % i) for i in range(entries)]]
    return ml, positions


def _cursor(ml: ManagedLedger, store: CursorStore) -> ManagedCursor:
    return ManagedCursor.open_durable(ml, SUB, InitialPosition.EARLIEST, store=store, deferred=True)


def _acknowledged(ml: ManagedLedger, record: CursorRecord | None, positions: list[Position]) -> set[Position]:
    """The entries of ``positions`` that ``record`` counts as acknowledged."""
    if record is None:
        return set()
    runs = record.individually_deleted
    return {p for p in positions if p <= record.mark_delete_position
            or any(p.ledger_id == lid and first <= p.entry_id <= last for lid, first, last in runs)}


def _state(cursor: ManagedCursor) -> tuple[Position, tuple[tuple[int, int, int], ...]]:
    return cursor.mark_delete_position, tuple(cursor.acked_ranges.runs())


def _persisted(store: CursorStore) -> tuple[Position, tuple[tuple[int, int, int], ...]] | None:
    record = store.load_persisted(TOPIC, SUB)
    return None if record is None else (record.mark_delete_position, record.individually_deleted)


def test_acks_within_one_interval_are_written_once(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 40)
    clock = Clock()
    store = CursorStore(metadata.database, mark_delete_rate_limit=2.0, clock=clock, background=False)
    cursor = _cursor(ml, store)  # its creation is written at once
    created = _persisted(store)
    writes = Writes(metadata)
    clock.now += 1
    for position in positions[:10]:  # a quiet cursor's first ack is due at once; the rest join it
        cursor.delete([position])
    assert _persisted(store) == created  # nothing written on the caller's thread
    assert store.write_due() == 1
    assert _persisted(store) == _state(cursor) and cursor.mark_delete_position == positions[9]
    for position in positions[10:30]:  # within the next 0.5 s interval
        clock.now += 0.02
        cursor.delete([position])
        assert store.write_due() == 0
        assert _persisted(store) == (positions[9], ())
    clock.now = 101.5
    assert store.write_due() == 1
    assert _persisted(store) == _state(cursor) and cursor.mark_delete_position == positions[29]
    assert writes.count == 2  # thirty acks, two commits


def test_with_no_rate_limit_every_ack_is_persisted_before_the_next(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 5)
    store = CursorStore(metadata.database, mark_delete_rate_limit=0, background=False)
    cursor = _cursor(ml, store)
    writes = Writes(metadata)
    for position in positions[1:4]:
        cursor.delete([position])
        assert _persisted(store) == _state(cursor)
    assert store.queued_count() == 0
    assert writes.count == 0  # each one its own cursor.save transaction, not a batch


def test_an_undeferred_cursor_persists_at_once_under_a_rate_limit(metadata: MetadataStore) -> None:
    """The ``__compaction`` cursor's mark-delete is a run's publish: never queued."""
    ml, positions = _ledger(metadata, 5)
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=Clock(), background=False)
    cursor = ManagedCursor.open_durable(ml, "__compaction", InitialPosition.EARLIEST, store=store)
    cursor.mark_delete(positions[3], {"CompactedTopicLedger": 42})
    record = store.load_persisted(TOPIC, "__compaction")
    assert record is not None and record.mark_delete_position == positions[3]
    assert record.properties == {"CompactedTopicLedger": 42}
    assert store.queued_count() == 0


def test_close_writes_what_is_queued(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=Clock(), background=False)
    cursor = _cursor(ml, store)
    cursor.delete([positions[0], positions[1], positions[5]])
    assert store.queued_count() == 1 and _persisted(store) != _state(cursor)
    cursor.close()
    assert store.queued_count() == 0
    assert _persisted(store) == _state(cursor)
    reopened = CursorStore(metadata.database)
    assert reopened.load(TOPIC, SUB) == store.load_persisted(TOPIC, SUB)


def test_closing_the_store_writes_every_queued_cursor(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0)
    cursors = [ManagedCursor.open_durable(ml, f"s{i}", InitialPosition.EARLIEST, store=store, deferred=True)
               for i in range(3)]
    for i, cursor in enumerate(cursors):
        cursor.delete(positions[: i + 2])
    store.close()
    for i, cursor in enumerate(cursors):
        record = CursorStore(metadata.database).load_persisted(TOPIC, f"s{i}")
        assert record is not None and record.mark_delete_position == positions[i + 1]


def test_a_crash_loses_at_most_the_acks_after_the_last_persist(tmp_path: Path) -> None:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    ml, positions = _ledger(metadata, 30)
    clock = Clock()
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursor = _cursor(ml, store)
    cursor.delete(positions[:5] + [positions[8]])
    clock.now += 1
    store.write_due()
    persisted = _acknowledged(ml, store.load_persisted(TOPIC, SUB), positions)
    cursor.delete(positions[5:8] + positions[10:20])  # acked, queued, never written
    assert persisted == set(positions[:5]) | {positions[8]}
    # the crash: the cursor and its store dropped, nothing flushed; a new process reopens
    recovered = ManagedCursor.open_durable(ml, SUB, store=CursorStore(metadata.database), deferred=True)
    redelivered = {entry.position for entry in recovered.read_entries(100)}
    assert redelivered == set(positions) - persisted  # the window comes again, nothing else is lost
    assert set(positions[5:8] + positions[10:20]) <= redelivered
    metadata.close()


def test_a_synchronous_save_supersedes_what_is_queued(metadata: MetadataStore) -> None:
    """A reset persists at once; the older queued ack must not be written after it."""
    ml, positions = _ledger(metadata, 10)
    clock = Clock()
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursor = _cursor(ml, store)
    store.write_due()
    cursor.delete(positions[:6])  # queued for a second from now
    cursor.reset(positions[2])
    clock.now += 5
    assert store.write_due() == 0
    assert _persisted(store) == (positions[1], ()) == _state(cursor)


def test_a_deleted_cursor_is_not_brought_back_by_its_queued_record(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    clock = Clock()
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursor = _cursor(ml, store)
    store.write_due()
    cursor.delete(positions[:3])
    cursor.delete_durable()
    clock.now += 5
    store.write_due()
    store.flush()
    assert store.load(TOPIC, SUB) is None


def test_a_discarded_topic_gets_no_queued_record_written(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=Clock(), background=False)
    cursor = _cursor(ml, store)
    store.write_due()
    cursor.delete(positions[:3])
    store.discard(TOPIC)
    assert store.flush() == 0
    assert _persisted(store) == (ml.first_position(), ())


def test_a_failed_write_keeps_the_record_queued_and_is_retried(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    clock = Clock()
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursor = _cursor(ml, store)
    store.write_due()
    clock.now += 1
    failures = [MetadataError("injected: disk full")]

    def fail_once(**_: object) -> None:
        if failures:
            raise failures.pop()

    metadata.database.fault_points["cursor.save_batch.before"] = fail_once
    cursor.delete(positions[:4])
    with pytest.raises(MetadataError):
        store.write_due()
    assert store.queued_count() == 1
    assert store.load(TOPIC, SUB) is not None and store.load(TOPIC, SUB).mark_delete_position == positions[3]  # type: ignore[union-attr]
    assert store.write_due() == 0  # retried one interval later, not in a loop
    clock.now += 1
    assert store.write_due() == 1
    assert _persisted(store) == _state(cursor)


def test_the_background_thread_writes_within_the_interval(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 200)
    store = CursorStore(metadata.database, mark_delete_rate_limit=20.0)
    cursor = _cursor(ml, store)
    writes = Writes(metadata)
    started = time.monotonic()
    for position in positions:
        cursor.delete([position])
    deadline = time.monotonic() + BOUND_S
    while _persisted(store) != _state(cursor):
        assert time.monotonic() < deadline, "the background thread never wrote the last ack"
        time.sleep(POLL_S)
    elapsed = time.monotonic() - started
    assert cursor.mark_delete_position == positions[-1]
    assert writes.count <= 2 + elapsed * 20  # rate-limited: not one commit per ack
    store.close()


OPS = st.lists(st.one_of(
    st.tuples(st.just("ack"), st.lists(st.integers(0, 39), min_size=1, max_size=4)),
    st.tuples(st.just("cumulative"), st.integers(0, 39)),
    st.tuples(st.just("tick"), st.floats(0.05, 1.5)),
    st.tuples(st.just("write"), st.none()),
), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_a_persisted_state_never_goes_backwards_and_a_crash_loses_only_the_window(ops: list[tuple[str, object]]) -> None:
    metadata = MetadataStore(":memory:")
    ml, positions = _ledger(metadata, 40)
    clock = Clock()
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursor = _cursor(ml, store)
    persisted = _acknowledged(ml, store.load_persisted(TOPIC, SUB), positions)
    for op, argument in ops:
        if op == "ack":
            cursor.delete([positions[i] for i in argument])  # type: ignore[union-attr]
        elif op == "cumulative" and positions[argument] >= cursor.mark_delete_position:  # type: ignore[index]
            cursor.mark_delete(positions[argument])  # type: ignore[index]
        elif op == "tick":
            clock.now += argument  # type: ignore[operator]
        else:
            store.write_due()
        now_persisted = _acknowledged(ml, store.load_persisted(TOPIC, SUB), positions)
        in_memory = {p for p in positions if cursor.is_acknowledged(p)}
        assert persisted <= now_persisted <= in_memory  # never backwards, never ahead of memory
        persisted = now_persisted
    recovered = ManagedCursor.open_durable(ml, SUB, store=CursorStore(metadata.database), deferred=True)
    assert {p for p in positions if not recovered.is_acknowledged(p)} == set(positions) - persisted
    metadata.close()
