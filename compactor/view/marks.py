"""Dead marks: which positions of a compacted ledger later data superseded.

An incremental run (``compactor.runs.runner``) does not rewrite the older ledgers of a view:
it writes the backlog's survivors as one new ledger and records, per older ledger, the
entries and batch slots that the backlog superseded (Delta Lake's deletion vectors,
Iceberg's position deletes). ``LedgerMarks`` is that record for one ledger, an immutable
value with a compact encoding:

* ``dead_entries``: one bit per stored entry of the ledger (``numpy.packbits``), set for an
  entry none of whose messages is left;
* ``dead_slots``: the dead batch slots of the entries that still have a live one, as sorted
  int64 ``stored << 32 | batch_index``;
* the counts that decide a merge: ``messages`` and ``keys`` (keyed messages) the ledger
  held when written, and how many of them are dead (``dead_ratio``: Kafka's dirty ratio).

Memory follows the ledger's entry count (a bit each) and its partly dead batches, never
the number of keys. ``compactor.view.manifest`` stores the marks of every ledger of a view
in the publish transaction; ``compactor.view.view.CompactedView`` applies them, so every
reader skips dead slots in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LedgerMarks", "slot_keys"]

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


def slot_keys(stored: npt.NDArray[Any], batch_index: npt.NDArray[Any]) -> I64:
    """The ``dead_slots`` key of each (stored entry, batch index) pair (a non-batched
    entry's row has batch index -1: it never names a dead slot, its entry is dead whole)."""
    return (stored.astype(np.int64) << 32) | (batch_index.astype(np.int64) & 0xFFFFFFFF)


@dataclass(frozen=True, eq=False)
class LedgerMarks:
    """The dead marks of one compacted ledger (see the module docstring)."""

    entries: int
    messages: int
    keys: int
    dead_entries: Mask = field(repr=False)
    dead_slots: I64 = field(repr=False)
    dead_messages: int = 0
    dead_keys: int = 0

    @classmethod
    def none(cls, entries: int, messages: int, keys: int) -> LedgerMarks:
        """A ledger nothing of which is dead."""
        return cls(entries, messages, keys, np.zeros(entries, dtype=bool), np.empty(0, np.int64))

    @classmethod
    def from_rows(
        cls, marks: LedgerMarks, stored: npt.NDArray[Any], batch_index: npt.NDArray[Any], message: Mask,
        keyed: Mask, dead: Mask,
    ) -> LedgerMarks:
        """The marks of the ledger whose index rows are ``stored``/``batch_index`` (all of
        them, in order), ``message`` (a row is a message), ``keyed`` (a keyed one) and
        ``dead`` (the rows dead now, those already marked included); counts of ``marks``."""
        stored = stored.astype(np.int64)
        dead = dead & message
        live_per_entry = np.bincount(stored[message & ~dead], minlength=marks.entries)
        had_message = np.bincount(stored[message], minlength=marks.entries) > 0
        dead_entries = had_message & (live_per_entry == 0)
        partial = dead & ~dead_entries[stored]
        return cls(marks.entries, marks.messages, marks.keys, dead_entries,
                   np.sort(slot_keys(stored[partial], batch_index[partial])),
                   int(np.count_nonzero(dead)), int(np.count_nonzero(dead & keyed)))

    @property
    def any_dead(self) -> bool:
        return self.dead_messages > 0

    @property
    def dead_ratio(self) -> float:
        """Dead messages / messages written (0 for a ledger of none)."""
        return self.dead_messages / self.messages if self.messages else 0.0

    @property
    def live_keys(self) -> int:
        return self.keys - self.dead_keys

    def dead_rows(self, stored: npt.NDArray[Any], batch_index: npt.NDArray[Any]) -> Mask:
        """Which index rows (``stored``, ``batch_index``) are marked dead."""
        dead: Mask = self.dead_entries[stored.astype(np.intp)] if len(stored) else np.zeros(0, dtype=bool)
        if len(self.dead_slots):
            keys = slot_keys(stored, batch_index)
            at = np.minimum(np.searchsorted(self.dead_slots, keys), len(self.dead_slots) - 1)
            dead = dead | (self.dead_slots[at] == keys)
        return dead

    def live_stored(self) -> npt.NDArray[np.integer[Any]] | None:
        """The stored indexes of the entries with a live message, ascending (4 bytes each);
        None: all."""
        if not self.dead_entries.any():
            return None
        return np.flatnonzero(~self.dead_entries).astype(np.uint32 if self.entries < 1 << 32 else np.int64)

    def dead_slots_of(self, stored: int) -> frozenset[int]:
        """The dead batch slots of stored entry ``stored`` (not a wholly dead one)."""
        if not len(self.dead_slots):
            return frozenset()
        low, high = np.searchsorted(self.dead_slots, [stored << 32, (stored + 1) << 32])
        return frozenset(int(key) & 0xFFFFFFFF for key in self.dead_slots[low:high])

    # -- the stored form ----------------------------------------------------------------

    def encode(self) -> tuple[int, int, int, int, int, bytes, bytes]:
        """(entries, messages, keys, dead_messages, dead_keys, dead entries bits, dead slots)."""
        return (self.entries, self.messages, self.keys, self.dead_messages, self.dead_keys,
                np.packbits(self.dead_entries).tobytes(), self.dead_slots.astype("<i8").tobytes())

    @classmethod
    def decode(cls, entries: int, messages: int, keys: int, dead_messages: int, dead_keys: int,
               bits: bytes, slots: bytes) -> LedgerMarks:
        """Inverse of ``encode``; ``ValueError`` when the blobs do not fit ``entries``."""
        if len(bits) != (entries + 7) // 8 or len(slots) % 8:
            raise ValueError(f"dead marks of {entries} entries: {len(bits)} bytes of bits, {len(slots)} of slots")
        dead_entries = np.unpackbits(np.frombuffer(bits, np.uint8), count=entries).astype(bool)
        return cls(entries, messages, keys, dead_entries, np.frombuffer(slots, "<i8").astype(np.int64),
                   dead_messages, dead_keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LedgerMarks) and self.encode() == other.encode()

    def __hash__(self) -> int:
        return hash(self.encode())
