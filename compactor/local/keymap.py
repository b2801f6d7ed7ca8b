"""Phase one's key map: each live key's latest position, in 24 bytes per key.

Pulsar keeps a ``String → MessageId`` hash map whose size grows with the keys' lengths.
compactd keeps, per live key, three ``uint64``: the two halves of a 128-bit BLAKE2b hash
of the key, and the key's latest position packed into 64 bits (``PositionPacker``). Two
keys colliding on 128 bits is as likely as a disk flipping a bit undetected; Kafka's
cleaner accepts the same trade with a 128-bit MD5.

Layout: the merged map is three parallel numpy arrays sorted by hash; updates go to an
append-only buffer (``array('Q')``, 24 bytes per update) that is merged in when it holds
``max(BUFFER_UPDATES_MIN, len(map) / 4)`` updates, so merges cost O(n log n) amortised and
the buffer never holds more than a quarter of the map. A merge is a stable sort by hash of
(map, buffer) in stream order, keeping the last update per hash and dropping tombstones
(``KeyMap(keep_deleted=True)`` keeps them instead, as "deleted" entries: a round of a
bounded run, ``compactor.local.rounds``, must know which keys its part of the stream deleted).

Packed position (``PositionPacker``): ``ledger ordinal (20 bits) · entry_id (30 bits) ·
batch_index + 1 (14 bits)``. Ordinals are given to ledger ids in ascending order as the
stream meets them, so packed values order exactly as positions do. Positions that do not
fit raise ``KeyMapLimitError`` rather than being truncated. Slot ``b`` of an entry packs to
the entry's packed value plus ``b + 1``, so phase one packs each entry once
(``pack_entry``, then ``pack_slot`` per message).

Lookup in phase two (``AscendingLookup``): phase two asks "is this position retained?" in
ascending order, so it walks the sorted retained positions once instead of searching them.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from bisect import bisect_left

import numpy as np
import numpy.typing as npt

from compactor.errors import CompactorError
from ledger.position import Position

__all__ = [
    "BUFFER_UPDATES_MIN",
    "AscendingLookup",
    "KeyMap",
    "KeyMapLimitError",
    "PositionPacker",
    "key_hash",
]

U64 = npt.NDArray[np.uint64]

# Merging fewer updates than this at a time wastes time on re-sorting the map.
BUFFER_UPDATES_MIN = 1 << 16
_LEDGER_BITS, _ENTRY_BITS, _BATCH_BITS = 20, 30, 14
_TOMBSTONE = (1 << 64) - 1  # ordinal 2**20-1 is never handed out, so no position packs to this
_HASH_HALVES = struct.Struct(">QQ")
# Phase two looks positions up in chunks of this many Python ints: about 3 MiB at a time,
# where converting a map of 100 million keys at once would take gigabytes.
_MEMBERSHIP_CHUNK_POSITIONS = 1 << 16


class KeyMapLimitError(CompactorError):
    """A position does not fit the key map's packing (too many ledgers, entries or slots)."""


def key_hash(key: str) -> tuple[int, int]:
    """The 128-bit BLAKE2b hash of ``key`` as two unsigned 64-bit halves (big-endian)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).digest()
    halves: tuple[int, int] = _HASH_HALVES.unpack(digest)
    return halves


class PositionPacker:
    """Packs positions into ``uint64`` preserving their order; see the module docstring."""

    def __init__(self) -> None:
        self._ordinals: dict[int, int] = {}
        self._ledger_ids: list[int] = []

    def pack(self, position: Position) -> int:
        """Pack ``position``; ledger ids must be met in ascending order."""
        return self._pack(self._ordinal(position.ledger_id), position)

    def pack_known(self, position: Position) -> int | None:
        """Pack ``position`` if its ledger was met by ``pack``, else None."""
        ordinal = self._ordinals.get(position.ledger_id)
        return None if ordinal is None else self._pack(ordinal, position)

    def pack_entry(self, position: Position) -> int:
        """Pack ``position`` as a whole entry (its batch_index ignored), as ``pack`` would.

        ``pack(p) == pack_slot(pack_entry(p), p.batch_index)``, with the same checks and
        errors: a caller packing many slots of one entry packs the entry once.
        """
        ordinal = self._ordinals.get(position.ledger_id)
        if ordinal is None:  # only the first entry of each ledger pays for the call
            ordinal = self._ordinal(position.ledger_id)
        return self._pack_entry(ordinal, position.entry_id)

    def pack_entry_known(self, position: Position) -> int | None:
        """``pack_entry(position)`` if its ledger was met by ``pack``, else None."""
        ordinal = self._ordinals.get(position.ledger_id)
        return None if ordinal is None else self._pack_entry(ordinal, position.entry_id)

    @staticmethod
    def slots_end(packed_entry: int) -> int:
        """Above the packed position of every slot of the entry packed to ``packed_entry``
        (and below the next entry's)."""
        return packed_entry + (1 << _BATCH_BITS)

    @staticmethod
    def pack_slot(packed_entry: int, batch_index: int) -> int:
        """The packed position of slot ``batch_index`` of the entry packed to ``packed_entry``."""
        if not -1 <= batch_index < (1 << _BATCH_BITS) - 1:
            raise KeyMapLimitError(f"batch index {batch_index} does not fit {_BATCH_BITS} bits")
        return packed_entry + batch_index + 1

    def _ordinal(self, ledger_id: int) -> int:
        """The ordinal of ``ledger_id``, handed out on first sight."""
        ordinal = self._ordinals.get(ledger_id)
        if ordinal is None:
            if self._ledger_ids and ledger_id < self._ledger_ids[-1]:
                raise KeyMapLimitError(f"ledger {ledger_id} met after {self._ledger_ids[-1]}")
            ordinal = len(self._ledger_ids)
            if ordinal >= (1 << _LEDGER_BITS) - 1:
                raise KeyMapLimitError(f"more than {(1 << _LEDGER_BITS) - 2} ledgers in one run")
            self._ordinals[ledger_id] = ordinal
            self._ledger_ids.append(ledger_id)
        return ordinal

    @staticmethod
    def _pack(ordinal: int, position: Position) -> int:
        packed_entry = PositionPacker._pack_entry(ordinal, position.entry_id)
        return PositionPacker.pack_slot(packed_entry, position.batch_index)

    @staticmethod
    def _pack_entry(ordinal: int, entry_id: int) -> int:
        if not 0 <= entry_id < (1 << _ENTRY_BITS):
            raise KeyMapLimitError(f"entry id {entry_id} does not fit {_ENTRY_BITS} bits")
        return (ordinal << (_ENTRY_BITS + _BATCH_BITS)) | (entry_id << _BATCH_BITS)

    def pack_many(self, ledger_ids: U64, entry_ids: U64, batch_indexes: npt.NDArray[np.int64]) -> U64:
        """``pack`` of many positions at once (numpy arrays of one length), in any order.

        Their ledger ids, ascending, must all be after the ledgers met so far. This is how a
        phase one computed elsewhere (the Spark engine) hands its retained positions over.
        """
        for ledger_id in np.unique(ledger_ids).tolist():
            self._ordinal(int(ledger_id))
        if len(entry_ids) and int(entry_ids.max()) >= 1 << _ENTRY_BITS:
            raise KeyMapLimitError(f"entry id {int(entry_ids.max())} does not fit {_ENTRY_BITS} bits")
        if len(batch_indexes) and not (
            -1 <= int(batch_indexes.min()) and int(batch_indexes.max()) < (1 << _BATCH_BITS) - 1
        ):
            raise KeyMapLimitError(f"a batch index does not fit {_BATCH_BITS} bits")
        known = np.array(self._ledger_ids, dtype=np.uint64)
        ordinals = np.searchsorted(known, ledger_ids).astype(np.uint64)
        slots = (batch_indexes + 1).astype(np.uint64)
        packed: U64 = (
            (ordinals << np.uint64(_ENTRY_BITS + _BATCH_BITS))
            | (entry_ids.astype(np.uint64) << np.uint64(_BATCH_BITS))
        ) + slots
        return packed

    def unpack(self, packed: int) -> Position:
        """Inverse of ``pack``."""
        ordinal = packed >> (_ENTRY_BITS + _BATCH_BITS)
        entry_id = (packed >> _BATCH_BITS) & ((1 << _ENTRY_BITS) - 1)
        batch_index = (packed & ((1 << _BATCH_BITS) - 1)) - 1
        return Position(self._ledger_ids[ordinal], entry_id, batch_index)


class KeyMap:
    """Key hash → latest packed position; see the module docstring."""

    def __init__(self, *, keep_deleted: bool = False) -> None:
        """``keep_deleted``: a tombstone stays in the map as its key's "deleted" entry
        (counted by ``len``, found by ``holds``, never among ``sorted_positions``)."""
        self._keep_deleted = keep_deleted
        self._high: U64 = np.empty(0, dtype=np.uint64)
        self._low: U64 = np.empty(0, dtype=np.uint64)
        self._packed: U64 = np.empty(0, dtype=np.uint64)
        self._buffer = array("Q")  # high, low, packed triples in stream order
        self._buffer_items_max = self._merge_threshold()
        self.merges = 0
        self._nbytes_max = 0  # nbytes before the fullest merge so far

    @classmethod
    def from_latest(cls, high: U64, low: U64, packed: U64) -> KeyMap:
        """A merged map of distinct key hashes (halves ``high``, ``low``) and their latest
        packed positions, as a phase one computed elsewhere (the Spark engine) found them."""
        assert len(high) == len(low) == len(packed)
        key_map = cls()
        order = np.lexsort((low, high))
        key_map._high, key_map._low, key_map._packed = high[order], low[order], packed[order]
        assert not np.any((key_map._high[1:] == key_map._high[:-1]) & (key_map._low[1:] == key_map._low[:-1]))
        assert not np.any(key_map._packed == np.uint64(_TOMBSTONE))
        key_map._buffer_items_max = key_map._merge_threshold()
        return key_map

    def put(self, hashed: tuple[int, int], packed: int) -> None:
        """The key hashed to ``hashed`` now has its latest value at ``packed``."""
        assert packed != _TOMBSTONE
        self._buffer.extend(hashed)
        self._buffer.append(packed)
        if len(self._buffer) >= self._buffer_items_max:
            self.merge()

    def delete(self, hashed: tuple[int, int]) -> None:
        """A tombstone: the key hashed to ``hashed`` has no value any more."""
        self._buffer.extend(hashed)
        self._buffer.append(_TOMBSTONE)
        if len(self._buffer) >= self._buffer_items_max:
            self.merge()

    def _merge_threshold(self) -> int:
        """Buffer length (3 items per update) that triggers a merge; the map's size decides,
        so it changes only when a merge does."""
        return 3 * max(BUFFER_UPDATES_MIN, len(self._packed) // 4)

    def merge(self) -> None:
        """Fold the buffered updates into the sorted arrays."""
        if not self._buffer:
            return
        self._nbytes_max = max(self._nbytes_max, self.nbytes)
        updates = np.frombuffer(self._buffer, dtype=np.uint64).reshape(-1, 3)
        high = np.concatenate((self._high, updates[:, 0]))
        low = np.concatenate((self._low, updates[:, 1]))
        packed = np.concatenate((self._packed, updates[:, 2]))
        del updates
        self._buffer = array("Q")
        order = np.lexsort((low, high))  # stable: among equal hashes, stream order is kept
        high, low, packed = high[order], low[order], packed[order]
        del order
        last = np.ones(len(high), dtype=bool)
        last[:-1] = (high[1:] != high[:-1]) | (low[1:] != low[:-1])
        if not self._keep_deleted:
            last &= packed != np.uint64(_TOMBSTONE)
        self._high, self._low, self._packed = high[last], low[last], packed[last]
        self._buffer_items_max = self._merge_threshold()
        self.merges += 1

    def get(self, hashed: tuple[int, int]) -> int | None:
        """The latest packed position of the key hashed to ``hashed``, or None."""
        self.merge()
        start = int(np.searchsorted(self._high, np.uint64(hashed[0]), side="left"))
        stop = int(np.searchsorted(self._high, np.uint64(hashed[0]), side="right"))
        for index in range(start, stop):
            if int(self._low[index]) == hashed[1]:
                return int(self._packed[index])
        return None

    def holds(self, hashed: tuple[int, int]) -> bool:
        """The key hashed to ``hashed`` has an entry: a value, or (``keep_deleted``) a delete."""
        return self.get(hashed) is not None

    def __len__(self) -> int:
        """Number of live keys (and, with ``keep_deleted``, of deleted ones)."""
        self.merge()
        return len(self._packed)

    @property
    def keys_bound(self) -> int:
        """At most this many keys after the next merge (merged ones plus buffered updates),
        known without merging: the map's ``nbytes`` is 24 bytes times this."""
        return len(self._packed) + len(self._buffer) // 3

    def live_keys(self) -> int:
        """Number of keys with a value (deleted ones not counted)."""
        self.merge()
        return int(np.count_nonzero(self._packed != np.uint64(_TOMBSTONE)))

    def sorted_positions(self) -> U64:
        """Every live key's latest packed position, ascending (what phase two keeps)."""
        self.merge()
        if self._keep_deleted:
            return np.sort(self._packed[self._packed != np.uint64(_TOMBSTONE)])
        return np.sort(self._packed)

    @property
    def nbytes(self) -> int:
        """Bytes held by the map's arrays and buffer."""
        return int(self._high.nbytes + self._low.nbytes + self._packed.nbytes) + (
            self._buffer.itemsize * len(self._buffer)
        )

    @property
    def nbytes_max(self) -> int:
        """The most bytes the map's arrays and buffer have held at once (before a merge,
        or now); a merge's transient copies not counted."""
        return max(self._nbytes_max, self.nbytes)


class AscendingLookup:
    """Membership in a sorted array of packed positions, asked in ascending order.

    Phase two meets messages in position order, so instead of a binary search of the
    whole array per message it walks the array once: each question resumes where the
    previous one stopped (a bisection within the current chunk), and at most
    ``_MEMBERSHIP_CHUNK_POSITIONS`` positions are Python ints at a time. Asking about a
    smaller position than the previous question is a programmer error (assertion).
    """

    def __init__(self, sorted_positions: U64) -> None:
        self._positions = sorted_positions
        self._chunk: list[int] = []
        self._chunk_end = 0  # index in ``_positions`` after the current chunk
        self._index = 0  # index in ``_chunk`` of the first position not below the last question
        self._last_question = -1

    def contains(self, packed: int) -> bool:
        """``packed`` is one of the positions; ``packed`` must not decrease between calls."""
        found = self._first_from(packed)
        return found is not None and found == packed

    def any_in(self, start: int, stop: int) -> bool:
        """Some position ``p`` has ``start <= p < stop``; ``start`` is a question as for
        ``contains`` (it must not decrease between calls of either)."""
        found = self._first_from(start)
        return found is not None and found < stop

    def _first_from(self, packed: int) -> int | None:
        """The smallest position not below ``packed`` (None: none is); moves the walk there."""
        assert packed >= self._last_question, f"{packed} asked after {self._last_question}"
        self._last_question = packed
        index = bisect_left(self._chunk, packed, self._index)
        while index == len(self._chunk) and self._next_chunk():
            index = bisect_left(self._chunk, packed)
        self._index = index
        return self._chunk[index] if index < len(self._chunk) else None

    def _next_chunk(self) -> bool:
        """Load the next chunk; False when the array is exhausted."""
        start = self._chunk_end
        if start >= len(self._positions):
            return False
        self._chunk_end = min(start + _MEMBERSHIP_CHUNK_POSITIONS, len(self._positions))
        self._chunk = self._positions[start : self._chunk_end].tolist()
        return True
