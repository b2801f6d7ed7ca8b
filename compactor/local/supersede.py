"""Which positions of a view's older ledgers a backlog superseded: dead marks from key indexes.

An incremental run (``compactor.runs.runner``) compacts only the backlog ``(horizon, stop]``
into one new ledger; what the backlog changes in the view's older ledgers it records as dead
marks (``compactor.view.marks``), found here from key indexes (``compactor.local.key_index``),
never from the older ledgers' values:

1. ``backlog_keys``: the hashes of every key the backlog writes (a value or a tombstone,
   young or not), read from the raw ledgers' indexes, sorted;
2. ``mark_dead``: each older ledger's index rows are decided by the one rule
   (``compactor.local.slot_rule.surviving_rows``) as a full rewrite's clean part is: a keyed
   value survives iff the backlog never wrote its key; a tombstone that is no longer young
   (this run's cut-off), and a key-less message when key-less messages are not retained,
   never. The rows that do not survive, with those already marked, are the ledger's new
   marks; a ledger whose marks did not change keeps its ``LedgerMarks`` object.

So the view (older ledgers less their dead rows, then the new ledger) holds exactly the
messages of a full rewrite of the whole history. A backlog or an older ledger holding a
chunk (``FLAG_CHUNK``), or two keys whose hashes share their high 64 bits, raises
``NeedsRewrite``: the run rewrites the view whole instead (chunked messages need
``compactor.local.chunks``' bookkeeping over the whole stream).

Indexes come from ``Indexes``: over a store with ledger files, each sealed ledger's
``.kidx`` (its local file, else its object in the store's bucket: ``index_source``; built
and written once if missing, as the indexed rounds do); over any other store, built in
memory by parsing the ledger (there the values are read).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from compactor.engine import LedgerRange
from compactor.errors import CompactorError
from compactor.local.index_source import IndexSource
from compactor.local.key_index import (
    FLAG_CHUNK,
    FLAG_KEYLESS,
    FLAG_OPAQUE,
    FLAGS_NOT_A_MESSAGE,
    FLAGS_NOT_A_VALUE,
    KeyIndex,
    build_index,
)
from compactor.local.slot_rule import old_tombstones, surviving_rows
from compactor.view.marks import LedgerMarks
from compactor.view.view import decode_compacted_entry
from ledger.storage.base import LedgerStore, SyncPolicy
from ledger.storage.file import FileLedgerStore

__all__ = ["BacklogKeys", "Indexes", "NeedsRewrite", "backlog_keys", "ledger_counts", "mark_dead"]

U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
Rows = dict[str, npt.NDArray[Any]]

# Entries per store read when an index is built in memory.
READ_ENTRIES_MAX = 1000
# The backlog keys' filter: 2**bits flags (bytes), bits between these.
FILTER_BITS_MIN = 10
FILTER_BITS_MAX = 24


class NeedsRewrite(CompactorError):
    """The backlog cannot be applied as dead marks (a chunk, a hash collision): rewrite."""


class Indexes:
    """The key-index rows of ledger ranges of ``store`` (``load``), charged to ``charge``."""

    def __init__(self, store: LedgerStore, charge: Callable[[int], object] = lambda size: None) -> None:
        self._store, self._charge = store, charge
        files = store.file_powers()
        self._files = None if files is None else FileLedgerStore(files.root, sync=SyncPolicy.NONE, read_only=True,
                                                                 bucket=files.bucket)
        self._source = None if self._files is None else IndexSource(self._files, charge)

    def load(self, whole: LedgerRange, columns: tuple[str, ...]) -> Rows:
        """The rows of ``whole``'s entries (``columns`` and ``stored``)."""
        index = self._source.load(whole, columns) if self._source is not None else self._parsed(whole)
        stored = index["stored"]
        first, last = np.searchsorted(stored, [whole.first_entry_id, whole.last_entry_id + 1])
        return {name: column[first:last] for name, column in index.columns.items()}

    def _parsed(self, whole: LedgerRange) -> KeyIndex:
        """The index of ``whole``'s entries built by parsing them through the store."""
        def entries() -> Any:
            for first in range(whole.first_entry_id, whole.last_entry_id + 1, READ_ENTRIES_MAX):
                last = min(whole.last_entry_id, first + READ_ENTRIES_MAX - 1)
                batch = self._store.read(whole.ledger_id, first, last)
                self._charge(sum(len(data) for data in batch))
                for offset, data in enumerate(batch):
                    if whole.compacted:
                        inner = decode_compacted_entry(data)
                        yield first + offset, inner.position.ledger_id, inner.position.entry_id, inner.data
                    else:
                        yield first + offset, whole.ledger_id, first + offset, data

        return build_index(entries())

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
        if self._files is not None:
            self._files.shutdown()


class BacklogKeys:
    """The keys a backlog writes: high halves sorted and distinct, low halves beside them,
    and a filter on the high halves' top bits (a table of ``2**bits`` flags, about 16 per
    key, at most ``FILTER_BITS_MAX``), so that looking up an older ledger's rows searches
    only those whose top bits some backlog key has."""

    def __init__(self, high: U64, low: U64) -> None:
        order = np.argsort(high, kind="stable")
        high, low = high[order], low[order]
        same = high[1:] == high[:-1]
        if np.any(same & (low[1:] != low[:-1])):
            raise NeedsRewrite("two keys' hashes share their high 64 bits")
        first = np.ones(len(high), dtype=bool)
        first[1:] = ~same
        self.high, self.low = high[first], low[first]
        bits = min(FILTER_BITS_MAX, max(FILTER_BITS_MIN, len(self.high).bit_length() + 4))
        self._shift = np.uint64(64 - bits)
        self._filter = np.zeros(1 << bits, dtype=bool)
        self._filter[self.high >> self._shift] = True

    def __len__(self) -> int:
        return len(self.high)

    def holds(self, high: U64, low: U64) -> Mask:
        """Which of the keys ``(high, low)`` the backlog writes."""
        found: Mask = np.zeros(len(high), dtype=bool)
        if not len(self.high):
            return found
        maybe = np.flatnonzero(self._filter[high >> self._shift])
        candidates = high[maybe]
        at = np.minimum(np.searchsorted(self.high, candidates), len(self.high) - 1)
        hit = self.high[at] == candidates
        if np.any(hit & (self.low[at] != low[maybe])):
            raise NeedsRewrite("two keys' hashes share their high 64 bits")
        found[maybe[hit]] = True
        return found


def backlog_keys(indexes: Indexes, ranges: Sequence[LedgerRange]) -> BacklogKeys:
    """The keys the raw ``ranges`` write (values and tombstones)."""
    highs, lows = [], []
    for whole in ranges:
        rows = indexes.load(whole, ("flags", "hash_high", "hash_low"))
        flags = rows["flags"]
        if np.any(flags & FLAG_CHUNK):
            raise NeedsRewrite(f"ledger {whole.ledger_id} holds a chunked message")
        keyed = (flags & FLAGS_NOT_A_VALUE) == 0
        highs.append(rows["hash_high"][keyed])
        lows.append(rows["hash_low"][keyed])
    if not highs:
        return BacklogKeys(np.empty(0, np.uint64), np.empty(0, np.uint64))
    return BacklogKeys(np.concatenate(highs), np.concatenate(lows))


def ledger_counts(flags: npt.NDArray[np.uint8]) -> tuple[int, int]:
    """(messages, keyed messages) of a compacted ledger's index rows ``flags``; an entry kept
    whole as undecodable counts as one message, as the run's figures count it."""
    message = (flags & FLAGS_NOT_A_MESSAGE) == 0
    return (int(np.count_nonzero(message)) + int(np.count_nonzero(flags & FLAG_OPAQUE)),
            int(np.count_nonzero(message & ((flags & FLAG_KEYLESS) == 0))))


def _not_written(keys: BacklogKeys, high: U64, low: U64, asked: Mask) -> Mask:
    """``slot_rule.LatestRows`` of an older ledger: a keyed value stays its key's latest iff
    the backlog never wrote the key."""
    return ~keys.holds(high[asked], low[asked])


def mark_dead(
    indexes: Indexes, older: Sequence[tuple[LedgerRange, LedgerMarks | None]], keys: BacklogKeys, *,
    keep_tombstones_since_ms: int | None, retain_null_key: bool,
) -> tuple[dict[int, LedgerMarks], int]:
    """The marks of the ``older`` ledgers (each whole range with its current marks, None:
    none yet) after a backlog writing ``keys``: ledger id → marks for every ledger whose
    marks changed or had none, and the messages newly marked dead (module docstring)."""
    columns = ("batch_index", "flags", "hash_high", "hash_low") + (
        () if keep_tombstones_since_ms is None else ("publish_time",))
    changed: dict[int, LedgerMarks] = {}
    newly_dead = 0
    for whole, marks in older:
        rows = indexes.load(whole, columns)
        flags = rows["flags"]
        if np.any(flags & FLAG_CHUNK):
            raise NeedsRewrite(f"compacted ledger {whole.ledger_id} holds a chunked message")
        stored, batch_index = rows["stored"], rows["batch_index"]
        high, low = rows["hash_high"], rows["hash_low"]
        old = old_tombstones(flags, rows.get("publish_time"), keep_tombstones_since_ms)
        keep = surviving_rows(flags, old=old, retain_null_key=retain_null_key,
                              latest=functools.partial(_not_written, keys, high, low))
        message = (flags & FLAGS_NOT_A_MESSAGE) == 0
        keyed = message & ((flags & FLAG_KEYLESS) == 0)
        base = marks if marks is not None else LedgerMarks.none(whole.last_entry_id + 1, *ledger_counts(flags))
        dead = (message & ~keep) | base.dead_rows(stored, batch_index)
        dead_messages = int(np.count_nonzero(dead & message))
        if marks is not None and dead_messages == marks.dead_messages:
            continue
        changed[whole.ledger_id] = LedgerMarks.from_rows(base, stored, batch_index, message, keyed, dead)
        newly_dead += dead_messages - base.dead_messages
    return changed, newly_dead
