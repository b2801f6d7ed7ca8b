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
(map, buffer) in stream order, keeping the last update per hash and dropping tombstones.

Packed position (``PositionPacker``): ``ledger ordinal (20 bits) · entry_id (30 bits) ·
batch_index + 1 (14 bits)``. Ordinals are given to ledger ids in ascending order as the
stream meets them, so packed values order exactly as positions do. Positions that do not
fit raise ``KeyMapLimitError`` rather than being truncated.
"""

from __future__ import annotations

import hashlib
from array import array

import numpy as np
import numpy.typing as npt

from compactor.errors import CompactorError
from ledger.position import Position

__all__ = ["BUFFER_UPDATES_MIN", "KeyMap", "KeyMapLimitError", "PositionPacker", "key_hash"]

U64 = npt.NDArray[np.uint64]

# Merging fewer updates than this at a time wastes time on re-sorting the map.
BUFFER_UPDATES_MIN = 1 << 16
_LEDGER_BITS, _ENTRY_BITS, _BATCH_BITS = 20, 30, 14
_TOMBSTONE = (1 << 64) - 1  # ordinal 2**20-1 is never handed out, so no position packs to this


class KeyMapLimitError(CompactorError):
    """A position does not fit the key map's packing (too many ledgers, entries or slots)."""


def key_hash(key: str) -> tuple[int, int]:
    """The 128-bit BLAKE2b hash of ``key`` as two unsigned 64-bit halves."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")


class PositionPacker:
    """Packs positions into ``uint64`` preserving their order; see the module docstring."""

    def __init__(self) -> None:
        self._ordinals: dict[int, int] = {}
        self._ledger_ids: list[int] = []

    def pack(self, position: Position) -> int:
        """Pack ``position``; ledger ids must be met in ascending order."""
        ordinal = self._ordinals.get(position.ledger_id)
        if ordinal is None:
            if self._ledger_ids and position.ledger_id < self._ledger_ids[-1]:
                raise KeyMapLimitError(f"ledger {position.ledger_id} met after {self._ledger_ids[-1]}")
            ordinal = len(self._ledger_ids)
            if ordinal >= (1 << _LEDGER_BITS) - 1:
                raise KeyMapLimitError(f"more than {(1 << _LEDGER_BITS) - 2} ledgers in one run")
            self._ordinals[position.ledger_id] = ordinal
            self._ledger_ids.append(position.ledger_id)
        return self._pack(ordinal, position)

    def pack_known(self, position: Position) -> int | None:
        """Pack ``position`` if its ledger was met by ``pack``, else None."""
        ordinal = self._ordinals.get(position.ledger_id)
        return None if ordinal is None else self._pack(ordinal, position)

    @staticmethod
    def _pack(ordinal: int, position: Position) -> int:
        if not 0 <= position.entry_id < (1 << _ENTRY_BITS):
            raise KeyMapLimitError(f"entry id {position.entry_id} does not fit {_ENTRY_BITS} bits")
        if not -1 <= position.batch_index < (1 << _BATCH_BITS) - 1:
            raise KeyMapLimitError(f"batch index {position.batch_index} does not fit {_BATCH_BITS} bits")
        return (ordinal << (_ENTRY_BITS + _BATCH_BITS)) | (position.entry_id << _BATCH_BITS) | (
            position.batch_index + 1
        )

    def unpack(self, packed: int) -> Position:
        """Inverse of ``pack``."""
        ordinal = packed >> (_ENTRY_BITS + _BATCH_BITS)
        entry_id = (packed >> _BATCH_BITS) & ((1 << _ENTRY_BITS) - 1)
        batch_index = (packed & ((1 << _BATCH_BITS) - 1)) - 1
        return Position(self._ledger_ids[ordinal], entry_id, batch_index)


class KeyMap:
    """Key hash → latest packed position; see the module docstring."""

    def __init__(self) -> None:
        self._high: U64 = np.empty(0, dtype=np.uint64)
        self._low: U64 = np.empty(0, dtype=np.uint64)
        self._packed: U64 = np.empty(0, dtype=np.uint64)
        self._buffer = array("Q")  # high, low, packed triples in stream order
        self.merges = 0

    def put(self, hashed: tuple[int, int], packed: int) -> None:
        """The key hashed to ``hashed`` now has its latest value at ``packed``."""
        assert packed != _TOMBSTONE
        self._buffer.extend((hashed[0], hashed[1], packed))
        self._maybe_merge()

    def delete(self, hashed: tuple[int, int]) -> None:
        """A tombstone: the key hashed to ``hashed`` has no value any more."""
        self._buffer.extend((hashed[0], hashed[1], _TOMBSTONE))
        self._maybe_merge()

    def _maybe_merge(self) -> None:
        if len(self._buffer) // 3 >= max(BUFFER_UPDATES_MIN, len(self._packed) // 4):
            self.merge()

    def merge(self) -> None:
        """Fold the buffered updates into the sorted arrays."""
        if not self._buffer:
            return
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
        last &= packed != np.uint64(_TOMBSTONE)
        self._high, self._low, self._packed = high[last], low[last], packed[last]
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

    def __len__(self) -> int:
        """Number of live keys."""
        self.merge()
        return len(self._packed)

    def sorted_positions(self) -> U64:
        """Every live key's latest packed position, ascending (what phase two keeps)."""
        self.merge()
        return np.sort(self._packed)

    @property
    def nbytes(self) -> int:
        """Bytes held by the map's arrays and buffer."""
        return int(self._high.nbytes + self._low.nbytes + self._packed.nbytes) + (
            self._buffer.itemsize * len(self._buffer)
        )
