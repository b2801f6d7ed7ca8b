"""What an executor makes of one piece through its ledger's key index: array work, no parse.

The Spark engine's tasks read each piece of a run's stream (a ``LedgerRange``) through the
key index of its ledger (``compactor.key_index``: a Parquet ``.kidx`` beside each sealed
ledger), as the local engine's indexed rounds do (``compactor.indexed``):

* ``PieceIndex`` opens a piece: a **sealed** ledger's index is read as Arrow through a
  ``pyarrow.fs.FileSystem`` (``filesystem``; None: the local one), every column read
  checked against its CRC32C (``key_index.read_index``); a missing or damaged one is built
  by parsing the ledger once and written for the next runs (``key_index.sealed_index``:
  temporary file, fsync, rename). An **open** ledger (the topic's last) is parsed for the
  piece's entries alone, and nothing is written. The rows are cut to the piece's entries;
  its entries' stored bytes are read on demand at the offsets the index recorded
  (``entry_offset``, ``stored_bytes``), each checked against its CRC32C.
* ``phase_one_batches`` gives phase one's rows of a piece (``rows.PHASE_ONE_SCHEMA``, as
  ``rows.phase_one_batches`` gives them by parsing) from the index columns with numpy: one
  keyed row per live keyed message, a figures row per piece. Only a chunk's entry is read
  and scanned (its uuid and whether it is the last chunk are not in the index): chunks
  are large messages, few per ledger.
* ``survivors`` is phase two of a piece given its group's decisions (``GroupDecisions``:
  retained positions, dropped chunks, packed into sorted ``uint64`` arrays, 8 bytes each):
  the keep rule of ``rewrite.group_phase_two`` as array work; an entry all of whose live
  messages survive is copied as stored, a batch that loses slots is rewritten
  (``compactor.indexed``'s batch cut: one metadata parse, no slot parse), an entry with
  no survivor is never read.

Memory: a piece's index columns (the ledger's, for the columns asked, while the piece is
read) and its group's decisions; never a key count beyond the group's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from compactor.algorithm import CompactedEntry
from compactor.engine import LedgerRange
from compactor.errors import CompactorError
from compactor.indexed import _batch as rewritten_batch
from compactor.key_index import (
    FLAG_CHUNK,
    FLAG_COMPACTED_OUT,
    FLAG_KEYLESS,
    FLAG_MARKER,
    FLAG_OPAQUE,
    FLAG_TOMBSTONE,
    INDEX_SUFFIX,
    build_index,
    entry_starts,
    ledger_path,
    sealed_index,
)
from compactor.keymap import key_hash
from compactor.scan import scan_entry
from compactor.spark.rows import PHASE_ONE_SCHEMA, open_store, read_range
from compactor.view import decode_compacted_entry
from ledger.position import Position
from ledger.storage.sealed_file import SealedFile

__all__ = [
    "PHASE_ONE_COLUMNS",
    "PHASE_TWO_COLUMNS",
    "GroupDecisions",
    "PieceIndex",
    "ensure_ledger_index",
    "index_file",
    "phase_one_batches",
    "survivors",
]

Rows = dict[str, npt.NDArray[Any]]
Mask = npt.NDArray[np.bool_]

# Rows per Arrow record batch handed to Spark (slices of one piece's arrays).
ROWS_PER_BATCH_MAX = 65_536
# Entries with a survivor read at once in phase two.
READ_BATCH_ENTRIES_MAX = 1000
# The index columns each phase reads (``publish_time`` too where tombstones may be young).
PHASE_ONE_COLUMNS = ("flags", "hash_high", "hash_low", "ledger_id", "entry_id", "batch_index", "entry_bytes",
                     "entry_offset", "stored_bytes")
PHASE_TWO_COLUMNS = ("flags", "ledger_id", "entry_id", "batch_index", "batch_size", "slot_end", "entry_offset",
                     "stored_bytes")
_NOT_A_VALUE = FLAG_KEYLESS | FLAG_MARKER | FLAG_OPAQUE | FLAG_COMPACTED_OUT
_NOT_A_MESSAGE = FLAG_MARKER | FLAG_OPAQUE | FLAG_COMPACTED_OUT
_ENTRY_BITS, _BATCH_BITS = 30, 14  # a packed position: ledger ordinal, entry id, batch index + 1


def index_file(ledgers_root: str, ledger_id: int) -> str:
    """Where ledger ``ledger_id``'s key index lives."""
    return ledger_path(ledgers_root, ledger_id) + INDEX_SUFFIX


def ensure_ledger_index(ledgers_root: str, ledger_id: int, compacted: bool) -> int:
    """On an executor, before phase one: make sure sealed ledger ``ledger_id`` has a whole
    index (read it, or build and write it); its rows, or -1 when the ledger is not sealed."""
    sealed = SealedFile.open(ledger_path(ledgers_root, ledger_id), ledger_id)
    if sealed is None:
        return -1
    try:
        return len(sealed_index(sealed, compacted=compacted, columns=()))
    finally:
        sealed.close()


class PieceIndex:
    """One piece's index rows (``columns`` of them, and ``stored``) and its entries on
    demand; see the module docstring. Close it."""

    def __init__(self, ledgers_root: str, piece: LedgerRange, columns: tuple[str, ...], filesystem: Any = None) -> None:
        self.piece = piece
        self._store: Any = None
        self._sealed = SealedFile.open(ledger_path(ledgers_root, piece.ledger_id), piece.ledger_id)
        try:
            if self._sealed is None:
                self._store = open_store(ledgers_root)
                index = build_index((piece.first_entry_id + offset, entry.position.ledger_id, entry.position.entry_id,
                                     entry.data) for offset, entry in enumerate(read_range(self._store, piece)))
            else:
                index = sealed_index(self._sealed, compacted=piece.compacted, columns=columns, filesystem=filesystem)
        except BaseException:
            self.close()
            raise
        stored = index["stored"]
        first, last = np.searchsorted(stored, [piece.first_entry_id, piece.last_entry_id + 1])
        self.rows: Rows = {name: column[first:last] for name, column in index.columns.items()}

    def read(self, stored: list[int]) -> list[bytes]:
        """The stored bytes of the piece's entries ``stored`` (ascending)."""
        if not stored:
            return []
        if self._sealed is None:
            span = self._store.read(self.piece.ledger_id, stored[0], stored[-1])
            return [span[at - stored[0]] for at in stored]
        first_rows = np.searchsorted(self.rows["stored"], stored)
        return self._sealed.read(stored, self.rows["entry_offset"][first_rows].tolist(),
                                 self.rows["stored_bytes"][first_rows].tolist())

    def close(self) -> None:
        if self._sealed is not None:
            self._sealed.close()
            self._sealed = None
        if self._store is not None:
            self._store.shutdown()
            self._store = None


def _signed(column: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    return np.ascontiguousarray(column).view(np.int64) if column.dtype == np.uint64 else column.astype(np.int64)


def phase_one_batches(index: PieceIndex, group: int, keep_tombstones_since_ms: int | None) -> Iterator[pa.RecordBatch]:
    """Phase one's rows of the piece ``index`` of group ``group`` (module docstring)."""
    rows = index.rows
    flags = rows["flags"]
    chunk = (flags & FLAG_CHUNK) != 0
    keyed = np.flatnonzero(((flags & _NOT_A_VALUE) == 0) & ~chunk)
    deletes = (flags[keyed] & FLAG_TOMBSTONE) != 0
    if keep_tombstones_since_ms is not None:
        deletes &= rows["publish_time"][keyed] < keep_tombstones_since_ms
    count = len(keyed)
    keyed_batch = _keyed_rows(group, rows, keyed, deletes, pa.nulls(count, pa.int64()), pa.nulls(count, pa.int64()),
                              pa.nulls(count, pa.bool_()), pa.nulls(count, pa.bool_()))
    for start in range(0, count, ROWS_PER_BATCH_MAX):
        yield keyed_batch.slice(start, ROWS_PER_BATCH_MAX)
    if np.any(chunk):
        yield from _chunk_rows(index, group, np.flatnonzero(chunk))
    yield _figures_row(group, rows)


def _keyed_rows(group: int, rows: Rows, at: npt.NDArray[np.intp], deletes: Any, uuid_high: Any, uuid_low: Any,
                chunk_last: Any, keyless: Any, *, hashed: bool = True) -> pa.RecordBatch:
    count = len(at)
    nulls = pa.nulls(count, pa.int64())
    hash_high = _signed(rows["hash_high"][at]) if hashed else nulls
    hash_low = _signed(rows["hash_low"][at]) if hashed else nulls
    columns = [pa.array(np.full(count, group, np.int32)), pa.array(hash_high), pa.array(hash_low),
               pa.array(_signed(rows["ledger_id"][at])), pa.array(_signed(rows["entry_id"][at])),
               pa.array(rows["batch_index"][at].astype(np.int32)), deletes,
               uuid_high, uuid_low, chunk_last, keyless, *[nulls] * 5]
    return pa.RecordBatch.from_arrays([column if isinstance(column, pa.Array) else pa.array(column)
                                       for column in columns], schema=PHASE_ONE_SCHEMA)


def _chunk_rows(index: PieceIndex, group: int, at: npt.NDArray[np.intp]) -> Iterator[pa.RecordBatch]:
    """The chunk rows (and the keyed rows of last chunks) of the chunks at rows ``at``:
    each chunk's entry is read and scanned for its uuid (``compactor.chunks``)."""
    rows = index.rows
    for first in range(0, len(at), READ_BATCH_ENTRIES_MAX):
        part = at[first:first + READ_BATCH_ENTRIES_MAX]
        highs, lows, lasts = [], [], []
        for data in index.read(rows["stored"][part].tolist()):
            if index.piece.compacted:
                data = decode_compacted_entry(data).data
            scan = scan_entry(data)
            if scan.chunk is None:
                raise CompactorError(f"ledger {index.piece.ledger_id}: the index says chunk, the entry does not")
            high, low = key_hash(scan.chunk.uuid)
            highs.append(high)
            lows.append(low)
            lasts.append(scan.chunk.is_last)
        last = np.array(lasts, dtype=bool)
        keyless = (rows["flags"][part] & FLAG_KEYLESS) != 0
        yield _keyed_rows(group, rows, part, pa.nulls(len(part), pa.bool_()),
                          pa.array(_signed(np.array(highs, np.uint64))), pa.array(_signed(np.array(lows, np.uint64))),
                          pa.array(last), pa.array(keyless), hashed=False)
        ends = part[last & ~keyless]  # a keyed last chunk is its key's value, at batch index -1
        if len(ends):
            yield _keyed_rows(group, rows, ends, np.zeros(len(ends), bool), pa.nulls(len(ends), pa.int64()),
                              pa.nulls(len(ends), pa.int64()), pa.array(np.ones(len(ends), bool)),
                              pa.nulls(len(ends), pa.bool_()))


def _figures_row(group: int, rows: Rows) -> pa.RecordBatch:
    """The piece's figures: entries, messages, entry bytes, markers, opaque entries."""
    flags = rows["flags"]
    starts = entry_starts(rows["stored"])
    figures = [len(starts), int(np.count_nonzero((flags & _NOT_A_MESSAGE) == 0)),
               int(rows["entry_bytes"][starts].astype(np.int64).sum()),
               int(np.count_nonzero(flags & FLAG_MARKER)), int(np.count_nonzero(flags & FLAG_OPAQUE))]
    values = [group, *[None] * 10, *figures]
    return pa.RecordBatch.from_arrays([pa.array([value], field.type) for value, field in zip(values, PHASE_ONE_SCHEMA,
                                                                                             strict=True)],
                                      schema=PHASE_ONE_SCHEMA)


class GroupDecisions:
    """A group's share of phase one's decisions: the retained positions ``(ledger_id,
    entry_id, batch_index)`` and the dropped chunks' entries ``(ledger_id, entry_id)``,
    each packed (ledger ordinal, entry id, batch index) into one sorted ``uint64`` array."""

    def __init__(self, retained: tuple[npt.NDArray[Any], ...], dropped: tuple[npt.NDArray[Any], ...]) -> None:
        self._ledgers = np.unique(np.concatenate([np.asarray(retained[0], np.int64), np.asarray(dropped[0], np.int64)]))
        self._retained = np.sort(self._pack(*retained)[1])
        self._dropped = np.sort(self._pack(dropped[0], dropped[1], np.full(len(dropped[0]), -1))[1])

    def __len__(self) -> int:
        """Retained positions (the group's live keys)."""
        return len(self._retained)

    def _pack(self, ledger_ids: Any, entry_ids: Any, batch_indexes: Any) -> tuple[Mask, npt.NDArray[np.uint64]]:
        ledger_ids = np.asarray(ledger_ids, np.int64)
        entry_ids = np.asarray(entry_ids, np.int64)
        batch_indexes = np.asarray(batch_indexes, np.int64)
        if len(entry_ids) and (entry_ids.max() >= 1 << _ENTRY_BITS or batch_indexes.max() >= (1 << _BATCH_BITS) - 1):
            raise CompactorError("a position's entry id or batch index is beyond what a group's decisions pack")
        ordinal = np.searchsorted(self._ledgers, ledger_ids)
        known = np.zeros(len(ledger_ids), dtype=bool)
        inside = ordinal < len(self._ledgers)
        known[inside] = self._ledgers[ordinal[inside]] == ledger_ids[inside]
        packed = ((ordinal.astype(np.uint64) << np.uint64(_ENTRY_BITS + _BATCH_BITS))
                  | (entry_ids.astype(np.uint64) << np.uint64(_BATCH_BITS))) + (batch_indexes + 1).astype(np.uint64)
        return known, packed

    @staticmethod
    def _member(known: Mask, packed: npt.NDArray[np.uint64], sorted_packed: npt.NDArray[np.uint64]) -> Mask:
        if not len(sorted_packed):
            return np.zeros(len(packed), dtype=bool)
        at = np.minimum(np.searchsorted(sorted_packed, packed), len(sorted_packed) - 1)
        return known & (sorted_packed[at] == packed)

    def retained(self, rows: Rows, at: npt.NDArray[np.intp]) -> Mask:
        """Which of the rows ``at`` are retained positions."""
        known, packed = self._pack(rows["ledger_id"][at], rows["entry_id"][at], rows["batch_index"][at])
        return self._member(known, packed, self._retained)

    def dropped(self, rows: Rows, at: npt.NDArray[np.intp]) -> Mask:
        """Which of the rows ``at`` (chunks) are dropped with their chunked message."""
        known, packed = self._pack(rows["ledger_id"][at], rows["entry_id"][at], np.full(len(at), -1))
        return self._member(known, packed, self._dropped)


def survivors(index: PieceIndex, decisions: GroupDecisions, *, retain_null_key: bool,
              keep_tombstones_since_ms: int | None) -> Iterator[CompactedEntry]:
    """Phase two of the piece ``index``: its surviving entries, in order (module docstring)."""
    rows = index.rows
    flags = rows["flags"]
    keep = (flags & FLAG_OPAQUE) != 0  # undecodable entries survive whole
    chunk = np.flatnonzero((flags & FLAG_CHUNK) != 0)
    keep[chunk] = ~decisions.dropped(rows, chunk)
    message = (flags & (_NOT_A_MESSAGE | FLAG_CHUNK)) == 0
    keyless = (flags & FLAG_KEYLESS) != 0
    if retain_null_key:
        keep |= message & keyless
    keyed = np.flatnonzero(message & ~keyless)
    alive = decisions.retained(rows, keyed)
    old = (flags[keyed] & FLAG_TOMBSTONE) != 0
    if keep_tombstones_since_ms is not None:
        old &= rows["publish_time"][keyed] < keep_tombstones_since_ms
    keep[keyed] = alive & ~old
    yield from _entries(index, keep)


def _entries(index: PieceIndex, keep: Mask) -> Iterator[CompactedEntry]:
    """The compacted entries of the piece, reading only entries with a survivor."""
    rows = index.rows
    stored = rows["stored"]
    if not len(stored):
        return
    starts = entry_starts(stored)
    kept = np.add.reduceat(keep.astype(np.int64), starts)
    messages = np.add.reduceat(((rows["flags"] & _NOT_A_MESSAGE) == 0).astype(np.int64), starts)
    ends = np.append(starts[1:], len(stored))
    wanted = np.flatnonzero(kept).tolist()
    starts_of, ends_of, whole_of = starts.tolist(), ends.tolist(), (kept == messages).tolist()
    stored_of = stored[starts].tolist()
    ledger_of, entry_of = rows["ledger_id"][starts].tolist(), rows["entry_id"][starts].tolist()
    batched_of = ((rows["batch_size"][starts] > 0) & ((rows["flags"][starts] & FLAG_OPAQUE) == 0)).tolist()
    for first in range(0, len(wanted), READ_BATCH_ENTRIES_MAX):
        entries = wanted[first:first + READ_BATCH_ENTRIES_MAX]
        for entry, data in zip(entries, index.read([stored_of[entry] for entry in entries]), strict=True):
            if index.piece.compacted:
                data = decode_compacted_entry(data).data
            position = Position(ledger_of[entry], entry_of[entry])
            if not batched_of[entry]:  # one message, or an entry kept whole as it is
                yield CompactedEntry(position, data)
            else:
                start, end = starts_of[entry], ends_of[entry]
                yield rewritten_batch(position, rows, start, end, keep[start:end], whole_of[entry], data)


def ledger_ids_without_index(ledgers_root: str, ledger_ids: list[int], filesystem: Any = None) -> list[int]:
    """Those of ``ledger_ids`` whose index file is not there (one listing call)."""
    if filesystem is None:
        return [ledger_id for ledger_id in ledger_ids if not os.path.exists(index_file(ledgers_root, ledger_id))]
    from pyarrow import fs

    infos = filesystem.get_file_info([index_file(ledgers_root, ledger_id) for ledger_id in ledger_ids])
    return [ledger_id for ledger_id, info in zip(ledger_ids, infos, strict=True) if info.type == fs.FileType.NotFound]
