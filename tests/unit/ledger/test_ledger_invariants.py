"""P5 in the ledger layer: positions only grow, nothing is appended to a sealed ledger, a
seal never drops a confirmed entry. Each assertion (in ``ledger.managed_ledger`` and
``ledger.storage.file``) is broken on purpose here, through the internals that keep it,
and must fail with ``AssertionError`` (the suite never runs with ``-O``); the public paths
keep raising their typed errors instead."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest

from ledger.errors import LedgerSealedError
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig, _Ledger
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import FileLedgerStore, LedgerStore, SyncPolicy
from ledger.storage.record import RecordKind, encode_record

TOPIC = "persistent://public/default/invariants"


@pytest.fixture
def managed(store: LedgerStore, metadata: MetadataStore) -> Iterator[ManagedLedger]:
    ledger = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=3))
    yield ledger
    ledger._ledgers[-1].closed_at_ms = 0  # undo what a test broke, so that close works
    ledger.close()


def _append(managed: ManagedLedger, count: int) -> list[Position]:
    return [future.result(10) for future in [managed.append(b"m%d" % i) for i in range(count)]]


def test_a_new_ledger_with_a_smaller_id_fails_the_ledger_id_assertion(managed: ManagedLedger) -> None:
    _append(managed, 3)  # a roll-over: two ledgers
    first = managed._ledgers[0].ledger_id
    with pytest.raises(AssertionError, match="ledger ids only grow"):
        managed._add_current(_Ledger(first, 0, 0, 0, 0))


def test_a_new_ledger_before_the_current_one_is_sealed_fails_its_assertion(managed: ManagedLedger) -> None:
    current = managed._ledgers[-1]
    assert not current.closed_at_ms
    with pytest.raises(AssertionError, match="created before"):
        managed._add_current(_Ledger(current.ledger_id + 100, 0, 0, 0, 0))


def test_an_append_to_a_sealed_ledger_fails_the_managed_ledgers_assertion(managed: ManagedLedger) -> None:
    _append(managed, 1)
    managed._ledgers[-1].closed_at_ms = 1  # sealed, as far as the list knows
    with managed._lock, pytest.raises(AssertionError, match="an append to sealed ledger"):
        managed._write(b"x", Future(), retry=False)


def test_a_seal_dropping_a_confirmed_entry_fails_its_assertion(managed: ManagedLedger) -> None:
    _append(managed, 2)
    current = managed._ledgers[-1]
    current.entries += 1  # one more confirmed than the store holds
    with pytest.raises(AssertionError, match="sealed at 2 entries, 3 confirmed"):
        managed._seal(current)
    current.entries -= 1


def test_a_short_read_back_fails_the_read_assertion(
        managed: ManagedLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    positions = _append(managed, 2)
    assert [entry.position for entry in managed.read_entries(positions[0], 10)] == positions
    read = managed.store.read

    def short(ledger_id: int, first: int, last: int) -> Sequence[bytes]:  # a store bug no real store has
        return read(ledger_id, first, last)[:-1]

    monkeypatch.setattr(managed.store, "read", short)
    with pytest.raises(AssertionError, match="read 1 of 0..1"):
        managed.read_entries(positions[0], 10)


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[FileLedgerStore]:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.ALWAYS)
    yield store
    store.shutdown()


def test_an_entry_id_not_following_the_last_confirmed_fails_the_stores_assertion(
        file_store: FileLedgerStore) -> None:
    ledger_id = file_store.create()
    assert file_store.append(ledger_id, b"a").result(10) == 0
    file_store._ledgers[ledger_id].last_add_confirmed = 5  # as if entries 1..5 were written already
    with pytest.raises(AssertionError, match="entries 1..1 written after 5"):
        file_store.append(ledger_id, b"b")


def test_a_write_to_a_sealed_ledger_fails_the_stores_assertion(file_store: FileLedgerStore) -> None:
    ledger_id = file_store.create()
    file_store.append(ledger_id, b"a").result(10)
    file_store.close(ledger_id)
    with pytest.raises(LedgerSealedError):  # the public path refuses it as an operating error
        file_store.append(ledger_id, b"b")
    ledger = file_store._ledgers[ledger_id]
    with file_store._lock:
        handle = file_store._pin(ledger)
    try:  # past that check, the write itself never lands in a sealed ledger
        with ledger.io_lock, pytest.raises(AssertionError, match="sealed ledger"):
            file_store._write_inline(ledger, handle.fd, encode_record(RecordKind.ENTRY, b"b"), 1)
    finally:
        file_store._unpin(handle)
    assert file_store.read(ledger_id, 0, 0) == [b"a"]
