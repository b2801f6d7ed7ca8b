"""The input of a round over key indexes: each range's index, and its entries on demand.

``compactor.indexed`` asks two things of a round's input ledgers: the index rows of a
range (``load``), and the stored bytes of some of its entries (``read``). This module
answers both for a ``FileLedgerStore``'s directory, in the process running the round:

* a **sealed** ledger (raw or compacted) is opened as a ``ledger.storage.sealed_file``;
  its index is read, or built and written (``compactor.key_index.sealed_index``); its
  entries are read at the offsets the index recorded, each checked against its CRC32C,
  with no scan of the ledger file;
* an **open** ledger (the topic's last) is read through the store, and parsed up to its
  last confirmed entry for an index that is never written.

Every byte read (index files, entries) is charged to the round's throttle. The sealed
files stay open until ``close``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from compactor.engine import LedgerRange
from compactor.key_index import KeyIndex, ensure_index, ledger_path, sealed_index
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_file import SealedFile

__all__ = ["IndexSource"]


class IndexSource:
    """``load`` and ``read`` of ``compactor.indexed.IndexedRound`` over ``store``'s files."""

    def __init__(self, store: FileLedgerStore, charge: Callable[[int], object]) -> None:
        self._store = store
        self._charge = charge
        self._sealed: dict[tuple[bool, int], tuple[SealedFile, list[int], list[int]]] = {}
        self._open: set[tuple[bool, int]] = set()

    def load(self, whole: LedgerRange, columns: tuple[str, ...]) -> KeyIndex:
        """The index of ``whole``'s ledger (at least ``columns`` of it)."""
        key = (whole.compacted, whole.ledger_id)
        known = self._sealed.get(key)
        if known is not None:
            return sealed_index(known[0], compacted=whole.compacted, charge=self._charge, columns=columns)
        sealed = SealedFile.open(ledger_path(self._store.root, whole.ledger_id), whole.ledger_id)
        if sealed is None:
            self._open.add(key)
            return ensure_index(self._store, whole.ledger_id, compacted=whole.compacted, charge=self._charge)
        index = sealed_index(sealed, compacted=whole.compacted, charge=self._charge,
                             columns=(*columns, "entry_offset", "stored_bytes"))
        stored = index["stored"]
        starts = np.flatnonzero(np.concatenate(([True], stored[1:] != stored[:-1]))[: len(stored)])
        self._sealed[key] = (sealed, index["entry_offset"][starts].tolist(), index["stored_bytes"][starts].tolist())
        return index

    def read(self, whole: LedgerRange, stored: list[int]) -> list[bytes]:
        """The stored bytes of ``whole``'s entries ``stored`` (ascending indexes)."""
        known = self._sealed.get((whole.compacted, whole.ledger_id))
        if not stored:
            return []
        if known is None:
            span = self._store.read(whole.ledger_id, stored[0], stored[-1])
            batch = [span[at - stored[0]] for at in stored]
        else:
            sealed, offsets, lengths = known
            batch = sealed.read(stored, [offsets[at] for at in stored], [lengths[at] for at in stored])
        self._charge(sum(len(data) for data in batch))
        return batch

    def close(self) -> None:
        """Close the sealed files."""
        for sealed, _, _ in self._sealed.values():
            sealed.close()
        self._sealed.clear()
