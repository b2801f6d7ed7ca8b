"""Pulsar's ``CompactedTopicImplTest`` scenarios (reference ``pulsar-compaction.md`` §6.3 #55-#56).

Pulsar tests ``findStartPointLoop`` over an index range of a mocked id cache; compactd's
``CompactedView.find_start`` searches a whole compacted ledger, so each case builds a
ledger holding exactly that index range and the expected index is shifted by ``start``.
"""

from __future__ import annotations

import bisect
import math

import pytest

from compactor.view.view import CompactedEntry, CompactedView, encode_compacted_entry
from ledger.position import Position
from ledger.storage import FaultyLedgerStore, MemoryLedgerStore

LEDGER = 1
LONG_MAX = 2**63 - 1
# Pulsar's ORIGIN_SPARSE_LEDGER: entry index → message id, read with "ceiling" (several
# indexes share an id, so the search must find the smallest index holding it).
SPARSE = {0: 0, 1: 1, 2: 1001, 3: 1002, 4: 1003, 10: 1010, 20: 1020, 50: 1050, LONG_MAX: LONG_MAX}


def sparse_ids(start: int, end: int) -> list[int]:
    """The id at every index ``start..end`` of Pulsar's mocked range."""
    keys = sorted(k for k in SPARSE if start <= k <= end) + [LONG_MAX]
    return [SPARSE[keys[bisect.bisect_left(keys, index)]] for index in range(start, end + 1)]


def ledger_of(store: FaultyLedgerStore | MemoryLedgerStore, ids: list[int]) -> CompactedView:
    ledger_id = store.create({"component": "compacted-ledger"})
    for entry_id in ids:
        store.append(ledger_id, encode_compacted_entry(CompactedEntry(Position(LEDGER, entry_id), b"")))
    store.close(ledger_id)
    return CompactedView(store, ledger_id, Position(LEDGER, ids[-1]))


@pytest.mark.parametrize(
    ("start", "end", "target"),
    [
        (0, 100, 0),      # first value
        (0, 100, 1),      # second value
        (0, 100, 1003),   # not first value
        (0, 100, 1015),   # value not exists
        (3, 40, 50),      # less than first value & find in a range
        (3, 40, 1002),    # first value & find in a range
        (3, 40, 1003),    # second value & find in a range
        (3, 40, 1010),    # not first value & find in a range
        (3, 40, 1015),    # value not exists & find in a range
    ],
)
def test_testFindStartPointLoop(start: int, end: int, target: int) -> None:
    """§6.3 #55 testFindStartPointLoop[9 cases]: the smallest index whose id ≥ target, duplicates and absent ids included."""
    ids = sparse_ids(start, end)
    bingo = next(index for index, entry_id in enumerate(ids) if entry_id >= target)
    view = ledger_of(MemoryLedgerStore(), ids)
    assert view.find_start(Position(LEDGER, target)) == bingo


def test_testRecursionNumberOfFindStartPointLoop() -> None:
    """§6.3 #56 testRecursionNumberOfFindStartPointLoop: a target near the front of 0..100 takes a logarithmic number of probes."""
    store = FaultyLedgerStore(MemoryLedgerStore())
    view = ledger_of(store, sparse_ids(0, 100))
    before = store.calls.get("read", 0)
    assert view.find_start(Position(LEDGER, 1)) == 1
    probes = store.calls["read"] - before
    # Pulsar pins its three-probe recursion to 2 steps (6 cache reads, #17976); compactd's
    # plain binary search reads one id per step: at most ceil(log2(101)) + 1 of them.
    assert probes <= math.ceil(math.log2(101)) + 1
