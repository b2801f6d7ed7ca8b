"""The input of a round over key indexes: each range's index, and its entries on demand.

``compactor.local.indexed`` asks two things of a round's input ledgers: the index rows of a
range (``load``), and the stored bytes of some of its entries (``read``). This module
answers both for a ``FileLedgerStore``'s directory, in the process running the round:

* a **sealed** ledger (raw or compacted) is opened as a ``ledger.storage.sealed_file``
  through the store's ``LedgerFiles.open_sealed`` (its local file, else its object in the
  store's bucket: an offloaded ledger, a compacted ledger a Spark executor wrote there);
  its index is read, or built and written (``compactor.local.key_index.sealed_index``); its
  entries are read at the offsets the index recorded, each checked against its CRC32C,
  with no scan of the ledger file;
* an **open** ledger (the topic's last) is read through the store, and parsed up to its
  last confirmed entry for an index that is never written (once per ``IndexSource``).

Every byte read (index files, entries) is charged to the round's throttle. The sealed
files stay open until ``close``; the entries' locations (16 bytes an entry) are read from
the index when phase two first reads a ledger, and kept for that ledger only.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np

from compactor.engine import LedgerRange
from compactor.local.key_index import KeyIndex, ensure_index, entry_starts, sealed_index
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_file import SealedFile

__all__ = ["IndexSource"]


class IndexSource:
    """``load`` and ``read`` of ``compactor.local.indexed.IndexedRound`` over ``store``'s files."""

    def __init__(self, store: FileLedgerStore, charge: Callable[[int], object]) -> None:
        self._store = store
        self._charge = charge
        self._sealed: dict[tuple[bool, int], SealedFile | None] = {}  # None: an open ledger
        self._located: tuple[tuple[bool, int], array[int], array[int]] | None = None  # the last one read
        self._parsed: dict[tuple[bool, int], KeyIndex] = {}  # open ledgers' indexes, parsed once

    def load(self, whole: LedgerRange, columns: tuple[str, ...]) -> KeyIndex:
        """The index of ``whole``'s ledger (at least ``columns`` of it)."""
        sealed = self._open(whole)
        if sealed is None:  # parsed once: both phases ask (its confirmed entries then cover every range asked)
            key = (whole.compacted, whole.ledger_id)
            if key not in self._parsed:
                self._parsed[key] = ensure_index(self._store, whole.ledger_id, compacted=whole.compacted,
                                                 charge=self._charge)
            return self._parsed[key]
        return sealed_index(sealed, self._store, compacted=whole.compacted, charge=self._charge, columns=columns)

    def read(self, whole: LedgerRange, stored: list[int]) -> list[bytes]:
        """The stored bytes of ``whole``'s entries ``stored`` (ascending indexes)."""
        if not stored:
            return []
        sealed = self._open(whole)
        if sealed is None:
            span = self._store.read(whole.ledger_id, stored[0], stored[-1])
            batch = [span[at - stored[0]] for at in stored]
        else:
            offsets, lengths = self._locations(whole, sealed)
            batch = sealed.read(stored, [offsets[at] for at in stored], [lengths[at] for at in stored])
        self._charge(sum(len(data) for data in batch))
        return batch

    def _open(self, whole: LedgerRange) -> SealedFile | None:
        """``whole``'s ledger file, when it is sealed (opened once)."""
        key = (whole.compacted, whole.ledger_id)
        if key not in self._sealed:
            self._sealed[key] = self._store.open_sealed(whole.ledger_id)
        return self._sealed[key]

    def _locations(self, whole: LedgerRange, sealed: SealedFile) -> tuple[array[int], array[int]]:
        """Each entry's record offset and stored size (from the index; kept for the ledger
        read last only: phase two reads the ledgers one after the other)."""
        key = (whole.compacted, whole.ledger_id)
        if self._located is None or self._located[0] != key:
            index = sealed_index(sealed, self._store, compacted=whole.compacted, charge=self._charge,
                                 columns=("entry_offset", "stored_bytes"))
            stored = index["stored"]
            starts = entry_starts(stored)
            self._located = (key, array("q", index["entry_offset"][starts].astype(np.int64).tobytes()),
                             array("q", index["stored_bytes"][starts].astype(np.int64).tobytes()))
        return self._located[1], self._located[2]

    def close(self) -> None:
        """Close the sealed files."""
        for sealed in self._sealed.values():
            if sealed is not None:
                sealed.close()
        self._sealed.clear()
        self._located = None
        self._parsed.clear()
