"""The LedgerStore contract, run against every backend (fixture ``store``)."""

from __future__ import annotations

import pytest

from ledger.errors import LedgerNotFoundError, LedgerSealedError, PositionOutOfRangeError
from ledger.storage import LedgerState, LedgerStore


def test_ids_are_unique_increasing_and_never_reused(store: LedgerStore) -> None:
    first = store.create()
    second = store.create()
    store.delete(second)
    third = store.create()
    assert first < second < third


def test_append_assigns_dense_entry_ids_and_reads_back(store: LedgerStore) -> None:
    ledger_id = store.create({"component": "managed-ledger"})
    futures = [store.append(ledger_id, bytes([i]) * i) for i in range(20)]
    assert [f.result(timeout=10) for f in futures] == list(range(20))
    assert store.last_add_confirmed(ledger_id) == 19
    assert list(store.read(ledger_id, 3, 5)) == [b"\x03" * 3, b"\x04" * 4, b"\x05" * 5]
    info = store.info(ledger_id)
    assert info.state is LedgerState.OPEN
    assert info.entries == 20
    assert info.size_bytes == sum(range(20))
    assert dict(info.metadata) == {"component": "managed-ledger"}


def test_empty_ledger_has_lac_minus_one(store: LedgerStore) -> None:
    ledger_id = store.create()
    assert store.last_add_confirmed(ledger_id) == -1
    with pytest.raises(PositionOutOfRangeError):
        store.read(ledger_id, 0, 0)


def test_sealed_ledger_refuses_appends_and_stays_readable(store: LedgerStore) -> None:
    ledger_id = store.create()
    store.append(ledger_id, b"a").result(timeout=10)
    store.close(ledger_id)
    store.close(ledger_id)  # idempotent
    with pytest.raises(LedgerSealedError):
        store.append(ledger_id, b"b")
    assert list(store.read(ledger_id, 0, 0)) == [b"a"]
    assert store.info(ledger_id).sealed


@pytest.mark.parametrize("first,last", [(-1, 0), (0, 3), (2, 1), (5, 5)])
def test_reads_outside_confirmed_range_are_refused(store: LedgerStore, first: int, last: int) -> None:
    ledger_id = store.create()
    for data in (b"a", b"b", b"c"):
        store.append(ledger_id, data).result(timeout=10)
    with pytest.raises(PositionOutOfRangeError):
        store.read(ledger_id, first, last)


def test_unknown_and_deleted_ledgers(store: LedgerStore) -> None:
    ledger_id = store.create()
    store.delete(ledger_id)
    store.delete(ledger_id)  # deleting a missing ledger is a no-op
    assert ledger_id not in store.list()
    for call in (lambda: store.info(ledger_id), lambda: store.append(ledger_id, b"x"),
                 lambda: store.last_add_confirmed(ledger_id)):
        with pytest.raises(LedgerNotFoundError):
            call()
