"""The per-acknowledgement work of a deferred cursor is small, and still exact.

A subscription acknowledged one message per ACK command (a client with ack grouping off)
changes its cursor tens of thousands of times a second. What keeps that cheap, and what
must stay true:

* a deferred persist queues a *snapshot* (``CursorStore.save_later_from``): the record is
  built when it is written, from the state the cursor had at its latest acknowledgement;
  many acks between two writes build one record, and what is written is the newest state;
* the mark-delete position moves over acknowledged runs without asking the managed ledger
  inside a ledger (``AckedRanges.run_at`` / ``any_after``), with the same result as
  asking it, across ledgers too (checked against a set model);
* acknowledged runs recovered beyond the entries the ledgers hold (a tail lost without
  fsync) are cut at open, so that the short path never walks into entries that do not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursor import InitialPosition, ManagedCursor
from cursor.ranges import AckedRanges
from cursor.store import CursorRecord, CursorStore
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import MemoryLedgerStore

TOPIC = "persistent://public/default/hot-acks"
SUB = "sub"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def metadata(tmp_path: Path) -> Iterator[MetadataStore]:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    yield metadata
    metadata.close()


def _ledger(metadata: MetadataStore, entries: int, per_ledger: int = 7) -> tuple[ManagedLedger, list[Position]]:
    ml = ManagedLedger.open(TOPIC, MemoryLedgerStore(), metadata,
                            ManagedLedgerConfig(max_entries_per_ledger=per_ledger))
    positions = [f.result(timeout=10) for f in [ml.append(b"m%d" % i) for i in range(entries)]]
    return ml, positions


def test_many_acks_between_two_writes_build_one_record_of_the_newest_state(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 40)
    clock = Clock()
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    records_built = 0

    def cursor_clock() -> float:  # read once per record built (its last_active_ms)
        nonlocal records_built
        records_built += 1
        return 1_700_000_000.0

    cursor = ManagedCursor.open_durable(ml, SUB, InitialPosition.EARLIEST, store=store, deferred=True,
                                        clock=cursor_clock)
    records_built = 0  # the creation's own record
    for position in positions[:30]:
        if position.entry_id != 3:  # leave a gap in every ledger: runs to persist
            cursor.delete([position])
    assert records_built == 0  # nothing built per acknowledgement
    clock.now += 1.0  # one interval after the creation's write
    assert store.write_due() == 1
    assert records_built == 1
    persisted = store.load_persisted(TOPIC, SUB)
    assert persisted is not None
    assert (persisted.mark_delete_position, persisted.individually_deleted) == (
        cursor.mark_delete_position, tuple(cursor.acked_ranges.runs()))


def test_a_snapshot_keeps_the_state_of_its_acknowledgement_not_a_later_one(metadata: MetadataStore) -> None:
    """The record a queued snapshot builds is the cursor state of the ack that queued it;
    a later ack queues its own (the newest wins): a write never mixes two states."""
    ml, positions = _ledger(metadata, 10)
    store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=Clock(), background=False)
    cursor = ManagedCursor.open_durable(ml, SUB, InitialPosition.EARLIEST, store=store, deferred=True)
    cursor.delete([positions[2]])
    queued = store.load(TOPIC, SUB)
    cursor.delete([positions[0]])
    assert queued is not None and queued.individually_deleted == ((positions[2].ledger_id, 2, 2),)
    newest = store.load(TOPIC, SUB)
    assert newest is not None and newest.mark_delete_position == positions[0]
    assert newest.individually_deleted == ((positions[2].ledger_id, 2, 2),)


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(list(range(30))), per_ledger=st.integers(min_value=1, max_value=9))
def test_mark_delete_follows_individual_acks_exactly_as_a_set_model(order: list[int], per_ledger: int) -> None:
    """Individual acks in any order, across ledger boundaries: MD is always the last entry
    of the acknowledged prefix, and the runs are what is acknowledged after it."""
    metadata = MetadataStore(":memory:")
    try:
        ml, positions = _ledger(metadata, 30, per_ledger)
        store = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=Clock(), background=False)
        cursor = ManagedCursor.open_durable(ml, SUB, InitialPosition.EARLIEST, store=store, deferred=True)
        acked: set[int] = set()
        for index in order:
            cursor.delete([positions[index]])
            acked.add(index)
            prefix = next(i for i in range(31) if i not in acked)  # first unacknowledged index
            expected_md = positions[prefix - 1] if prefix else ml.first_position()
            assert cursor.mark_delete_position == expected_md
            after = {positions[i] for i in acked if i >= prefix}
            assert {p for p in positions if p in cursor.acked_ranges} == after
            assert cursor.backlog_entries() == 30 - len(acked)
    finally:
        metadata.close()


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 20)), max_size=30),
       st.integers(0, 5), st.integers(-1, 22))
def test_run_at_and_any_after_agree_with_a_set(added: list[tuple[int, int]], ledger_id: int, entry_id: int) -> None:
    ranges = AckedRanges()
    for lid, eid in added:
        ranges.add(Position(lid, eid))
    members = set(added)
    run = ranges.run_at(ledger_id, entry_id)
    assert (run is not None) == ((ledger_id, entry_id) in members)
    if run is not None:
        assert all((ledger_id, e) in members for e in range(run[0], run[1] + 1))
    assert ranges.any_after(Position(ledger_id, entry_id)) == any(m > (ledger_id, entry_id) for m in members)


def test_recovered_runs_past_the_held_entries_are_cut_at_open(metadata: MetadataStore) -> None:
    ml, positions = _ledger(metadata, 5, per_ledger=100)
    ledger_id = positions[0].ledger_id
    store = CursorStore(metadata.database, mark_delete_rate_limit=0)
    store.save(CursorRecord(TOPIC, SUB, Position(ledger_id, 0), ((ledger_id, 2, 9),)))  # entries 5..9 never held
    cursor = ManagedCursor.open_durable(ml, SUB, store=store)
    assert list(cursor.acked_ranges.runs()) == [(ledger_id, 2, 4)]
    cursor.delete([positions[1]])
    assert cursor.mark_delete_position == positions[4]  # over the held entries only
