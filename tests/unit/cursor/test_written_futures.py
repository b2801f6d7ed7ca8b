"""Futures of durability for deferred cursors (``CursorStore.when_written``, ``delete_later``).

A deferred cursor's creation, reset and deletion are queued for the store's thread, due
now; ``when_written()`` resolves only once the commit is done, fails with the write's error
(the state stays queued and is retried), and what the store reads back (``load``,
``list``) is the newest state even while a write that took it is in flight. The writer is
held inside its transaction through the database's fault point ``cursor.save_batch.before``
(it runs on the writer's thread, after the states are taken).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.errors import MetadataError
from ledger.managed_ledger import ManagedLedger
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import MemoryLedgerStore

TOPIC = "persistent://public/default/written"
SUB = "sub"
BOUND_S = 10.0


class Gate:
    """Holds the writer thread at ``cursor.save_batch.before`` until opened."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.reached = threading.Event()
        self.open = threading.Event()
        metadata.database.fault_points["cursor.save_batch.before"] = self

    def __call__(self, **details: object) -> None:
        self.reached.set()
        assert self.open.wait(BOUND_S)


@pytest.fixture
def metadata(tmp_path: Path) -> Iterator[MetadataStore]:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    yield metadata
    metadata.close()


def _ledger(metadata: MetadataStore, entries: int) -> tuple[ManagedLedger, list[Position]]:
    ml = ManagedLedger.open(TOPIC, MemoryLedgerStore(), metadata)
    return ml, [ml.append(b"m%d" % i).result(timeout=10) for i in range(entries)]


def _cursor(ml: ManagedLedger, store: CursorStore) -> ManagedCursor:
    return ManagedCursor.open_durable(ml, SUB, InitialPosition.EARLIEST, store=store, deferred=True)


def test_a_new_cursor_is_written_by_the_thread_and_its_future_resolves_after_the_commit(
        metadata: MetadataStore) -> None:
    ml, _ = _ledger(metadata, 3)
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0)
    gate = Gate(metadata)
    cursor = _cursor(ml, store)  # queued, due now: the caller's thread commits nothing
    written = cursor.when_written()
    assert gate.reached.wait(BOUND_S)
    assert not written.done() and store.load_persisted(TOPIC, SUB) is None
    assert store.load(TOPIC, SUB) is not None and store.list(TOPIC) == [SUB]  # the newest state, in flight
    gate.open.set()
    written.result(timeout=BOUND_S)
    record = store.load_persisted(TOPIC, SUB)
    assert record is not None and record.mark_delete_position == ml.first_position()
    store.close()


def test_a_reset_is_due_at_once_whatever_the_schedule(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    store = CursorStore(metadata.database, mark_delete_rate_limit=0.01)  # one write per 100 s
    cursor = _cursor(ml, store)
    cursor.when_written().result(timeout=BOUND_S)
    cursor.delete(positions[:5])  # queued for 100 s from now
    cursor.reset(positions[7])
    started = time.monotonic()
    cursor.when_written().result(timeout=BOUND_S)
    assert time.monotonic() - started < BOUND_S
    record = store.load_persisted(TOPIC, SUB)
    assert record is not None and (record.mark_delete_position, record.individually_deleted) == (positions[6], ())
    store.close()


def test_a_failed_write_fails_the_future_and_the_state_is_written_later(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    store = CursorStore(metadata.database, mark_delete_rate_limit=20.0)  # retried 50 ms later
    cursor = _cursor(ml, store)
    cursor.when_written().result(timeout=BOUND_S)
    failures = [MetadataError("injected: disk full")]

    def fail_once(**_: object) -> None:
        if failures:
            raise failures.pop()

    metadata.database.fault_points["cursor.save_batch.before"] = fail_once
    cursor.reset(positions[4])
    with pytest.raises(MetadataError, match="disk full"):
        cursor.when_written().result(timeout=BOUND_S)
    deadline = time.monotonic() + BOUND_S
    while (record := store.load_persisted(TOPIC, SUB)) is None or record.mark_delete_position != positions[3]:
        assert time.monotonic() < deadline, "the failed reset was never retried"
        time.sleep(0.01)
    assert cursor.when_written().result(timeout=BOUND_S) is None
    store.close()


def test_a_queued_deletion_hides_the_cursor_before_during_and_after_its_write(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 5)
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0)
    cursor = _cursor(ml, store)
    cursor.when_written().result(timeout=BOUND_S)
    cursor.delete(positions[:2])
    gate = Gate(metadata)
    cursor.delete_durable()
    deleted = cursor.when_written()
    assert store.load(TOPIC, SUB) is None and store.list(TOPIC) == []
    assert gate.reached.wait(BOUND_S)  # taken by the writer, not yet committed
    assert store.load_persisted(TOPIC, SUB) is not None
    assert store.load(TOPIC, SUB) is None and store.list(TOPIC) == [] and not deleted.done()
    gate.open.set()
    deleted.result(timeout=BOUND_S)
    assert store.load_persisted(TOPIC, SUB) is None and store.list(TOPIC) == []
    again = _cursor(ml, store)  # a new cursor of the same name starts afresh, not from the deleted one
    again.when_written().result(timeout=BOUND_S)
    record = store.load_persisted(TOPIC, SUB)
    assert record is not None and record.mark_delete_position == ml.first_position()
    assert record.individually_deleted == ()
    store.close()


def test_flush_later_resolves_once_every_cursor_of_the_topic_is_written(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 10)
    store = CursorStore(metadata.database, mark_delete_rate_limit=0.01)
    cursors = [ManagedCursor.open_durable(ml, f"s{i}", InitialPosition.EARLIEST, store=store, deferred=True)
               for i in range(3)]
    for i, cursor in enumerate(cursors):
        cursor.when_written().result(timeout=BOUND_S)
        cursor.delete(positions[: i + 2])  # queued for 100 s from now
    assert store.queued_count() == 3
    store.flush_later(TOPIC).result(timeout=BOUND_S)
    assert store.queued_count() == 0
    for i, cursor in enumerate(cursors):
        record = store.load_persisted(TOPIC, f"s{i}")
        assert record is not None and record.mark_delete_position == cursor.mark_delete_position == positions[i + 1]
    store.close()
