"""Managed ledger: roll-over, restart, reads across ledgers, positions, trimming."""

from __future__ import annotations

from pathlib import Path

import pytest

from cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import FileLedgerStore, LedgerStore, MemoryLedgerStore, SyncPolicy

TOPIC = "persistent://public/default/t"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _open(store: LedgerStore, metadata: MetadataStore, clock: Clock | None = None, **config: int) -> ManagedLedger:
    return ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(**config), clock=clock or Clock())


def _append(ml: ManagedLedger, count: int, size: int = 10) -> list[Position]:
    futures = [ml.append(b"%0*d" % (size, i)) for i in range(count)]
    return [f.result(timeout=10) for f in futures]


def test_roll_over_by_entry_count_seals_full_ledgers(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=4)
    positions = _append(ml, 10)
    ledgers = ml.ledger_list()
    assert [r.entries for r in ledgers] == [4, 4, 2]
    assert all(store.info(r.ledger_id).sealed for r in ledgers[:2])
    assert not store.info(ledgers[2].ledger_id).sealed
    assert positions[3] == Position(ledgers[0].ledger_id, 3)  # the filling entry is the last one
    assert positions[4] == Position(ledgers[1].ledger_id, 0)


def test_roll_over_by_bytes(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_size_per_ledger_bytes=25)
    _append(ml, 7, size=10)
    assert [r.entries for r in ml.ledger_list()] == [3, 3, 1]
    assert [r.size_bytes for r in ml.ledger_list()] == [30, 30, 10]


def test_min_rollover_time_gates_roll_over(store: LedgerStore, metadata: MetadataStore) -> None:
    clock = Clock()
    ml = _open(store, metadata, clock, max_entries_per_ledger=2, min_rollover_time_ms=60_000)
    _append(ml, 5)
    assert [r.entries for r in ml.ledger_list()] == [5]
    clock.now += 61
    _append(ml, 1)
    assert [r.entries for r in ml.ledger_list()] == [6, 0]


def test_size_accounting_total_and_per_ledger(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=3)
    _append(ml, 7, size=5)
    assert ml.number_of_entries == 7
    assert ml.total_size == 35
    assert sum(r.size_bytes for r in ml.ledger_list()) == 35


def test_reads_cross_ledgers_from_any_position(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=3)
    positions = _append(ml, 8)
    for start in range(len(positions)):
        entries = ml.read_entries(positions[start], 100)
        assert [e.position for e in entries] == positions[start:]
        assert [e.data for e in entries] == [b"%010d" % i for i in range(start, 8)]
    assert [e.position for e in ml.read_entries(positions[1], 4)] == positions[1:5]
    assert [e.position for e in ml.read_entries(positions[0], 100, end=positions[5])] == positions[:6]
    assert ml.read_entries(ml.next_valid_position(positions[-1]), 10) == []


def test_last_confirmed_and_position_navigation(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=2)
    first_ledger = ml.current_ledger_id
    assert ml.last_confirmed_position() == Position(first_ledger, -1)
    positions = _append(ml, 4)  # two full ledgers, then an empty current one
    assert ml.last_confirmed_position() == positions[-1]
    assert ml.next_valid_position(positions[1]) == positions[2]
    assert ml.previous_position(positions[2]) == positions[1]
    assert ml.next_valid_position(positions[-1]) == Position(ml.current_ledger_id, 0)
    assert ml.previous_position(Position(first_ledger, 0)) == Position(first_ledger, -1)
    assert ml.entries_between(positions[0], positions[3]) == 3
    assert ml.is_valid_position(positions[2])
    assert not ml.is_valid_position(Position(positions[0].ledger_id, 2))
    assert ml.is_valid_position(Position(ml.current_ledger_id, 0))


def test_restart_seals_last_ledger_drops_empty_ones_and_opens_a_new_one(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "m.db"))
    ml = _open(store, metadata, max_entries_per_ledger=100)
    positions = _append(ml, 5)
    written = ml.current_ledger_id
    store.shutdown()  # a crash: the managed ledger is never closed
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.GROUP)
    ml = _open(store, metadata, max_entries_per_ledger=100)
    assert store.info(written).sealed
    assert [r.ledger_id for r in ml.ledger_list()] == [written, ml.current_ledger_id]
    assert ml.current_ledger_id > written
    assert ml.last_confirmed_position() == positions[-1]
    empty = ml.current_ledger_id
    store.shutdown()
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.GROUP)
    ml = _open(store, metadata, max_entries_per_ledger=100)
    assert empty not in [r.ledger_id for r in ml.ledger_list()]
    assert empty not in store.list()
    assert ml.current_ledger_id > empty
    assert [e.data for e in ml.read_entries(positions[0], 10)] == [b"%010d" % i for i in range(5)]
    store.shutdown()
    metadata.close()


def test_restart_truncates_a_torn_tail_of_the_last_ledger(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.ALWAYS)
    metadata = MetadataStore(str(tmp_path / "m.db"))
    ml = _open(store, metadata)
    positions = _append(ml, 3)
    store.shutdown()
    path = tmp_path / "l" / f"{positions[0].ledger_id:020d}.ledger"
    path.write_bytes(path.read_bytes()[:-4])
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.ALWAYS)
    ml = _open(store, metadata)
    assert ml.last_confirmed_position() == positions[1]
    assert ml.ledger_list()[0].entries == 2
    store.shutdown()
    metadata.close()


def test_trim_without_durable_cursors_deletes_every_closed_ledger(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=2)
    _append(ml, 5)
    closed = [r.ledger_id for r in ml.ledger_list()[:-1]]
    assert ml.trim() == closed
    assert [r.ledger_id for r in ml.ledger_list()] == [ml.current_ledger_id]
    assert not set(closed) & set(store.list())
    assert metadata.topic_ledgers(TOPIC)[0].ledger_id == ml.current_ledger_id


def test_durable_compaction_cursor_holds_data_like_any_durable_cursor(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=2)
    compaction = ManagedCursor.open_durable(ml, "__compaction", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 7)  # ledgers [2, 2, 2, 1(current)]
    assert ml.trim() == []
    compaction.mark_delete(positions[2])  # inside the second ledger
    assert ml.trim() == [positions[0].ledger_id]
    compaction.mark_delete(positions[3])  # last entry of the second ledger: fully consumed
    assert ml.trim() == [positions[2].ledger_id]
    reader = ManagedCursor.open_non_durable(ml, "reader", positions[0])
    assert ml.trim() == []  # a non-durable cursor holds nothing
    assert [e.position for e in reader.read_entries(10)] == positions[4:]


def test_slowest_durable_cursor_bounds_trimming(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=2)
    fast = ManagedCursor.open_durable(ml, "fast", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    slow = ManagedCursor.open_durable(ml, "slow", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 6)
    fast.mark_delete(positions[5])
    slow.mark_delete(positions[1])
    assert ml.trim() == [positions[0].ledger_id]
    slow.mark_delete(positions[5])
    assert ml.trim() == [positions[2].ledger_id, positions[4].ledger_id]


@pytest.mark.parametrize(
    "retention_time_ms,retention_size_bytes,expected_trimmed",
    [(-1, -1, 0), (0, 0, 3), (-1, 20, 1), (60_000, -1, 0)],
)
def test_retention_keeps_consumed_ledgers(
    metadata: MetadataStore, retention_time_ms: int, retention_size_bytes: int, expected_trimmed: int
) -> None:
    clock = Clock()
    ml = _open(MemoryLedgerStore(), metadata, clock, max_entries_per_ledger=1,
               retention_time_ms=retention_time_ms, retention_size_bytes=retention_size_bytes)
    _append(ml, 3)  # three closed ledgers of 10 bytes, empty current one
    clock.now += 1
    before = [r.ledger_id for r in ml.ledger_list()]
    trimmed = ml.trim()
    assert len(trimmed) == expected_trimmed
    assert trimmed == before[: len(trimmed)]  # deletion is always a prefix of the list
    if retention_time_ms > 0:
        clock.now += retention_time_ms / 1000 + 1
        assert len(ml.trim()) == 3


def test_delete_removes_references_then_data(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=2)
    ManagedCursor.open_durable(ml, "sub", store=CursorStore(metadata.database))
    _append(ml, 5)
    ml.delete()
    assert store.list() == []
    assert metadata.list_topics() == []
    assert CursorStore(metadata.database).list(TOPIC) == []


def test_listeners_hear_each_durable_entry(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _open(store, metadata, max_entries_per_ledger=3)
    heard: list[Position] = []
    ml.add_listener(heard.append)
    positions = _append(ml, 7)
    assert sorted(heard) == positions


def test_roll_over_now_seals_the_current_ledger_with_its_entries_and_the_next_takes_appends(tmp_path: Path) -> None:
    from ledger.data_dir import DataDir
    from ledger.storage.base import LedgerState

    data_dir = DataDir.open(str(tmp_path), sync=SyncPolicy.NONE)
    managed = ManagedLedger.open("persistent://public/default/roll-now", data_dir.ledgers, data_dir.metadata)
    try:
        managed.roll_over_now()  # an empty current ledger: nothing to seal
        [only] = managed.ledger_list()
        assert not only.closed_at_ms
        appended = [managed.append(b"e%d" % number) for number in range(3)]  # pending when the roll starts
        managed.roll_over_now()
        assert [future.result(timeout=10) for future in appended] == [
            Position(only.ledger_id, number) for number in range(3)]
        sealed, current = managed.ledger_list()
        assert (sealed.ledger_id, sealed.entries) == (only.ledger_id, 3) and sealed.closed_at_ms
        assert data_dir.ledgers.info(sealed.ledger_id).state is LedgerState.CLOSED
        assert [r.closed_at_ms > 0 for r in data_dir.metadata.topic_ledgers(managed.name)] == [True, False]
        assert managed.append(b"next").result(timeout=10) == Position(current.ledger_id, 0)
    finally:
        managed.close()
        data_dir.close()
