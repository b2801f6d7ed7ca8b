"""A store names its powers beyond ``LedgerStore`` (``ledger.storage.powers``), and a managed
ledger answers a planner's questions in one snapshot (``ManagedLedger.snapshot``).

* ``file_powers()``: a file store answers with itself (its directory, reserved ids, adopting,
  confirmed lengths, delete all work through the answer); a memory store and a faulty wrapper
  answer ``None`` (a faulty store's operations must all pass its fault points).
* ``snapshot()`` agrees with the ledger's separate answers when nothing moves, stays as taken
  while the ledger grows, and is consistent in itself while appends race it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from pathlib import Path

import pytest

from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import FaultyLedgerStore, FileLedgerStore, MemoryLedgerStore, SyncPolicy
from ledger.storage.sealed_writer import write_sealed_ledger

TOPIC = "persistent://public/default/snapshot"
BOUND_S = 10


def test_a_file_store_is_its_own_ledger_files(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.NONE)
    try:
        files = store.file_powers()
        assert files is store
        assert files.root == os.path.abspath(tmp_path / "ledgers")
        created = store.create()
        store.append(created, b"abc").result(timeout=BOUND_S)
        assert files.confirmed_length(created)[0] == 1
        reserved = files.reserve_ids(2)
        assert len(reserved) == 2 and min(reserved) > created
        assert store.create() > max(reserved)  # reserved ids never come out again
        files.delete(created)
        assert created not in store.list()
    finally:
        store.shutdown()


def test_a_ledger_written_elsewhere_is_adopted_through_the_powers(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.NONE)
    try:
        files = store.file_powers()
        assert files is not None
        [ledger_id] = files.reserve_ids(1)
        written = write_sealed_ledger(files.root, ledger_id, {"component": "test"}, iter([b"one", b"two"]),
                                      created_at_ms=1)
        assert files.adopt_sealed(ledger_id, written.entry_offsets, written.entry_lengths)
        assert not files.adopt_sealed(ledger_id, written.entry_offsets, written.entry_lengths)  # loaded already
        assert list(store.read(ledger_id, 0, 1)) == [b"one", b"two"]
    finally:
        store.shutdown()


def test_memory_and_faulty_stores_have_no_file_powers(tmp_path: Path) -> None:
    assert MemoryLedgerStore().file_powers() is None
    backend = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.NONE)
    try:
        assert backend.file_powers() is backend
        assert FaultyLedgerStore(backend).file_powers() is None  # its faults would be gone round
    finally:
        backend.shutdown()


@pytest.fixture
def ledger(tmp_path: Path) -> ManagedLedger:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    return ManagedLedger.open(TOPIC, MemoryLedgerStore(), metadata, ManagedLedgerConfig(max_entries_per_ledger=3))


def _positions(ledger: ManagedLedger) -> list[Position]:
    """Every position worth asking about: each ledger's -1, its entries and one past them."""
    return [Position(record.ledger_id, entry_id) for record in ledger.ledger_list()
            for entry_id in range(-1, record.entries + 1)]


def test_a_snapshot_agrees_with_the_ledgers_separate_answers(ledger: ManagedLedger) -> None:
    empty = ledger.snapshot()
    assert empty.last_confirmed == ledger.last_confirmed_position() == Position(ledger.current_ledger_id, -1)
    for index in range(10):
        ledger.append(b"entry-%d" % index).result(timeout=BOUND_S)
    snapshot = ledger.snapshot()
    assert snapshot.ledgers == tuple(ledger.ledger_list())
    assert len(snapshot.ledgers) >= 4  # rolled over: the questions span ledgers
    assert snapshot.last_confirmed == ledger.last_confirmed_position()
    positions = _positions(ledger)
    for after, upto in itertools.product(positions, positions):
        assert snapshot.entries_between(after, upto) == ledger.entries_between(after, upto), (after, upto)
    first = ledger.first_position()
    assert snapshot.entries_between(first, snapshot.last_confirmed) == 10


def test_a_snapshot_stays_as_taken_while_the_ledger_grows(ledger: ManagedLedger) -> None:
    for index in range(4):
        ledger.append(b"entry-%d" % index).result(timeout=BOUND_S)
    snapshot = ledger.snapshot()
    taken = (snapshot.ledgers, snapshot.last_confirmed)
    for index in range(5):
        ledger.append(b"more-%d" % index).result(timeout=BOUND_S)
    assert (snapshot.ledgers, snapshot.last_confirmed) == taken
    assert ledger.last_confirmed_position() > snapshot.last_confirmed
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.last_confirmed = ledger.last_confirmed_position()  # type: ignore[misc]


def test_a_deleted_ledgers_snapshot_is_empty(ledger: ManagedLedger) -> None:
    ledger.append(b"x").result(timeout=BOUND_S)
    ledger.delete()
    snapshot = ledger.snapshot()
    assert snapshot.ledgers == ()
    assert snapshot.last_confirmed == ledger.last_confirmed_position() == Position(-1, -1)


def test_snapshots_taken_while_appends_race_them_agree_with_themselves(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    ledger = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=7))
    appended, burst = 200, 10  # bursts: the flusher confirms several at once, while snapshots are taken
    done = threading.Event()

    def append() -> None:
        try:
            for first in range(0, appended, burst):
                for future in [ledger.append(b"%d" % index) for index in range(first, first + burst)]:
                    future.result(timeout=BOUND_S)
        finally:
            done.set()

    writer = threading.Thread(target=append)
    writer.start()
    seen = 0
    try:
        while not done.is_set() or seen == 0:
            snapshot = ledger.snapshot()
            non_empty = [record for record in snapshot.ledgers if record.entries]
            total = sum(record.entries for record in snapshot.ledgers)
            if non_empty:
                assert snapshot.last_confirmed == Position(non_empty[-1].ledger_id, non_empty[-1].entries - 1)
            else:
                assert snapshot.last_confirmed.entry_id == -1
            assert snapshot.entries_between(Position(snapshot.ledgers[0].ledger_id, -1),
                                            snapshot.last_confirmed) == total
            seen += 1
    finally:
        writer.join(BOUND_S)
        ledger.close()
        store.shutdown()
        metadata.close()
    assert not writer.is_alive()
    final = sum(record.entries for record in ledger.snapshot().ledgers)
    assert final == appended
