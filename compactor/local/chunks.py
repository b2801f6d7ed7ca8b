"""Chunked messages in compaction: a chunked value is kept or dropped whole.

A producer with chunking on stores a message larger than the broker's maximum as several
entries, its chunks (``message.entry.Chunk``: the message's ``uuid``, ``chunk_id``
0..n-1), in order but possibly interleaved with other producers' entries. A reader gets
every chunk and the client puts the value together by ``uuid``. Compaction must therefore
keep all the chunks of a value or none of them. The rules (``compactor.local.algorithm``):

* A chunked message is its key's value **at the position of its last chunk** (``chunk_id
  = n-1``), keyed by that chunk's key: only there does it enter the key map, as a
  non-chunked message would. A chunk that is not last never counts as a value.
* A chunked message *instance* is the chunks of one ``uuid`` after that uuid's previous
  last chunk (if any) up to and including its next one: a producer that sends a message
  again after a reconnect (de-duplication off) stores a second instance, and a reader of
  the raw topic sees both; compaction treats them as two values, as they are.
* A completed instance survives whole iff its last chunk is its key's latest value (or,
  key-less, iff ``retain_null_key``): then all its chunks are written, verbatim, at their
  original positions; otherwise none is.
* **Pending** chunks — an instance whose last chunk is not in the run's input (it
  straddles the stop marker, or it never completes) — are always kept and change nothing
  in the key map: the key's earlier value stays its value. A read-compacted reader gets
  them from the compacted view and the rest from the raw tail after the horizon; the next
  run, which reads both, sees the instance complete and decides on it whole. So
  compacting A, then the result plus B, still equals compacting A+B.
* A chunked message that never completes (its producer died mid-message) stays pending:
  its chunks are kept by every run, bytes that compaction never reclaims. Dropping them
  would need a rule for "will never complete" that a slow producer could break, and
  nothing acknowledged may be lost; the clients themselves drop such a message after
  ``expireTimeOfIncompleteChunkedMessage``.

``ChunkedMessages`` is what phase one learns for this, and it is kept per chunked
message, never per key: one row of four ``uint64`` (32 bytes) per completed instance — its
uuid's 128-bit hash and its last chunk's ledger and entry id — and one byte saying whether
it is key-less. Phase two sorts the rows once (by uuid, then position) and asks, for each
chunk, where its instance completes (``end_of``: a bisection) and keeps it iff it does not
yet, or that completion is retained (``retained``: one flag per row).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from compactor.local.keymap import U64, PositionPacker
from ledger.position import Position

__all__ = ["ChunkedMessages", "EntryAt", "Retained", "UuidHash"]

EntryAt = tuple[int, int]
"""An entry's ``(ledger_id, entry_id)``: ordered as positions are, and packer-free, so that
every engine builds the same ``ChunkedMessages``."""
UuidHash = tuple[int, int]
"""The 128-bit hash of a chunked message's uuid (``compactor.local.keymap.key_hash``)."""
Retained = npt.NDArray[np.bool_]
"""One flag per completion, in ``ChunkedMessages``'s sorted order: its instance survives."""


class ChunkedMessages:
    """Where every chunked message instance of a stream completes (module docstring)."""

    def __init__(self) -> None:
        self._rows = array("Q")  # uuid high, uuid low, ledger id, entry id: per completion, stream order
        self._keyless = array("B")
        self._sorted: tuple[U64, npt.NDArray[np.uint8]] | None = None

    @classmethod
    def from_ends(cls, ends: Iterable[tuple[UuidHash, EntryAt, bool]]) -> ChunkedMessages:
        """The completions ``(uuid hash, last chunk's entry, key-less)`` found elsewhere
        (the Spark engine), in any order."""
        chunked = cls()
        for uuid_hash, at, keyless in sorted(ends, key=lambda end: end[1]):
            chunked.complete(uuid_hash, at, keyless=keyless)
        return chunked

    def complete(self, uuid_hash: UuidHash, at: EntryAt, *, keyless: bool) -> None:
        """The last chunk of an instance of ``uuid_hash`` is at ``at`` (met in stream order)."""
        assert not self._rows or (self._rows[-2], self._rows[-1]) < at, "out of order"
        self._rows.extend((*uuid_hash, *at))
        self._keyless.append(keyless)
        self._sorted = None

    def completions(self) -> Iterator[tuple[UuidHash, EntryAt, bool]]:
        """Every completion ``(uuid hash, last chunk's entry, key-less)``, in stream order."""
        rows = self._rows
        for index, keyless in enumerate(self._keyless):
            high, low, ledger_id, entry_id = rows[4 * index : 4 * index + 4]
            yield (high, low), (ledger_id, entry_id), bool(keyless)

    def _table(self) -> tuple[U64, npt.NDArray[np.uint8]]:
        """The rows sorted by uuid hash, then position, and their key-less flags."""
        if self._sorted is None:
            rows = np.frombuffer(self._rows, dtype=np.uint64).reshape(-1, 4)
            order = np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0]))
            self._sorted = rows[order], np.frombuffer(self._keyless, dtype=np.uint8)[order]
        return self._sorted

    def end_of(self, uuid_hash: UuidHash, at: EntryAt) -> int | None:
        """The row (sorted order) where the instance holding the chunk at ``at`` completes:
        the first completion of its uuid at or after it; None: pending."""
        rows, _ = self._table()
        high, low = uuid_hash
        first = int(np.searchsorted(rows[:, 0], np.uint64(high), side="left"))
        last = int(np.searchsorted(rows[:, 0], np.uint64(high), side="right"))
        for index in range(first, last):  # a uuid's few instances (and 64-bit neighbours)
            row = rows[index].tolist()
            if row[1] == low and (row[2], row[3]) >= at:
                return index
        return None

    def retained(self, sorted_positions: U64, packer: PositionPacker, retain_null_key: bool) -> Retained:
        """Per completion (sorted order), whether its instance survives: a keyed one iff its
        last chunk is its key's latest (``sorted_positions``, packed by ``packer``), a
        key-less one iff ``retain_null_key``."""
        rows, keyless = self._table()
        kept = keyless.astype(bool) if retain_null_key else np.zeros(len(rows), dtype=bool)
        for index, (ledger_id, entry_id) in enumerate(rows[:, 2:].tolist()):
            packed = None if keyless[index] else packer.pack_known(Position(ledger_id, entry_id))
            if packed is not None and len(sorted_positions):  # a ledger never put into holds no latest
                found = int(np.searchsorted(sorted_positions, np.uint64(packed)))
                kept[index] = found < len(sorted_positions) and int(sorted_positions[found]) == packed
        return kept

    def survives(self, uuid_hash: UuidHash, at: EntryAt, retained: Retained) -> bool:
        """The chunk at ``at`` is written: its instance is pending or retained."""
        end = self.end_of(uuid_hash, at)
        return end is None or bool(retained[end])

    def __len__(self) -> int:
        """Completed instances."""
        return len(self._keyless)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChunkedMessages):
            return NotImplemented
        return self._rows == other._rows and self._keyless == other._keyless

    __hash__ = None  # type: ignore[assignment]  # mutable

    @property
    def nbytes(self) -> int:
        """Bytes the completions take: 33 per chunked message instance, nothing per key."""
        return self._rows.itemsize * len(self._rows) + len(self._keyless)
