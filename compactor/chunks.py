"""Chunked messages in compaction: a chunked value is kept or dropped whole.

A producer with chunking on stores a message larger than the broker's maximum as several
entries, its chunks (``compactor.message.Chunk``: the message's ``uuid``, ``chunk_id``
0..n-1), in order but possibly interleaved with other producers' entries. A reader gets
every chunk and the client puts the value together by ``uuid``. Compaction must therefore
keep all the chunks of a value or none of them. The rules (``compactor.algorithm``):

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
message, never per key: for each uuid (its 128-bit hash), where its instances complete,
plus which completions are key-less. Phase two asks, for each chunk, where its instance
completes (``end_of``) and keeps it iff it does not yet, or that completion is retained
(``retained``).
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from compactor.keymap import U64, PositionPacker
from ledger.position import Position

__all__ = ["ChunkedMessages", "EntryAt", "UuidHash"]

EntryAt = tuple[int, int]
"""An entry's ``(ledger_id, entry_id)``: ordered as positions are, and packer-free, so that
every engine builds the same ``ChunkedMessages``."""
UuidHash = tuple[int, int]
"""The 128-bit hash of a chunked message's uuid (``compactor.keymap.key_hash``)."""


@dataclass
class ChunkedMessages:
    """Where every chunked message instance of a stream completes (module docstring).

    Attributes:
        ends: uuid hash → the entries of its last chunks, ascending.
        keyless: the last chunks among them that carry no key.
    """

    ends: dict[UuidHash, list[EntryAt]] = field(default_factory=dict)
    keyless: set[EntryAt] = field(default_factory=set)

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
        ends = self.ends.setdefault(uuid_hash, [])
        assert not ends or ends[-1] < at, "out of order"
        ends.append(at)
        if keyless:
            self.keyless.add(at)

    def end_of(self, uuid_hash: UuidHash, at: EntryAt) -> EntryAt | None:
        """Where the instance holding the chunk at ``at`` completes, or None: pending."""
        ends = self.ends.get(uuid_hash)
        if ends is None:
            return None
        index = bisect_left(ends, at)
        return ends[index] if index < len(ends) else None

    def retained(self, sorted_positions: U64, packer: PositionPacker, retain_null_key: bool) -> set[EntryAt]:
        """The completions whose instance survives: a keyed one whose last chunk is its
        key's latest (``sorted_positions``, packed by ``packer``), a key-less one iff
        ``retain_null_key``."""
        kept = set(self.keyless) if retain_null_key else set()
        keyed: list[EntryAt] = []
        packed: list[int] = []
        for ends in self.ends.values():
            for at in ends:
                value = None if at in self.keyless else packer.pack_known(Position(*at))
                if value is not None:  # a ledger phase one never put into holds no latest value
                    keyed.append(at)
                    packed.append(value)
        if keyed and len(sorted_positions):
            wanted = np.array(packed, dtype=np.uint64)
            index = np.minimum(np.searchsorted(sorted_positions, wanted), len(sorted_positions) - 1)
            found = sorted_positions[index] == wanted
            kept.update(at for at, hit in zip(keyed, found.tolist(), strict=True) if hit)
        return kept

    def survives(self, uuid_hash: UuidHash, at: EntryAt, retained: set[EntryAt]) -> bool:
        """The chunk at ``at`` is written: its instance is pending or retained."""
        end = self.end_of(uuid_hash, at)
        return end is None or end in retained

    def __len__(self) -> int:
        """Completed instances."""
        return sum(len(ends) for ends in self.ends.values())

    @property
    def nbytes(self) -> int:
        """About what the instances take in memory (objects included): tens of bytes per
        instance and uuid, nothing per key."""
        total = sys.getsizeof(self.ends) + sys.getsizeof(self.keyless)
        for uuid_hash, ends in self.ends.items():
            total += sys.getsizeof(uuid_hash) + sum(map(sys.getsizeof, uuid_hash)) + sys.getsizeof(ends)
            total += sum(sys.getsizeof(at) + sys.getsizeof(at[0]) + sys.getsizeof(at[1]) for at in ends)
        return total
