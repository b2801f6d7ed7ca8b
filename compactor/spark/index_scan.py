"""What an executor makes of one piece through its ledger's key index: array work, no parse.

The Spark engine's tasks read each piece of a run's stream (a ``LedgerRange``) through the
key index of its ledger (``compactor.local.key_index``: a Parquet ``.kidx`` beside each sealed
ledger), as the local engine's indexed rounds do (``compactor.local.indexed``):

* ``PieceIndex`` opens a piece through a read-only store (``rows.open_store``: the ledger
  directory, or, with a bucket, the object store alone — an executor that shares nothing
  with the broker but the bucket): a **sealed** ledger (``LedgerFiles.open_sealed``: its
  local file, else its object) has its index read as Arrow (``open_sidecar``), every column
  read checked against its CRC32C (``key_index.read_index``); a missing or damaged one is
  built by parsing the ledger once and kept for the next runs where the ledger is
  (``key_index.store_index``: beside the file, or as the ledger's sidecar object). An
  **open** ledger (the topic's last) is parsed for the piece's entries alone, and nothing is
  written. The rows are cut to the piece's entries; its entries' stored bytes are read on
  demand at the offsets the index recorded (``entry_offset``, ``stored_bytes``), each
  checked against its CRC32C.
* ``keyed_rows`` gives phase one's keyed rows of a piece (``PHASE_ONE_ROWS``: a key's
  128-bit hash and its place in the stream) from the index columns with numpy, one per
  live keyed message; ``TaskKeyedRows`` holds a task's pieces' rows (up to
  ``ROWS_PENDING_MAX``) and hands Spark each key's last one among them (``latest_rows``);
  ``chunk_batches`` gives a piece's chunk rows, hashed by uuid. Only a chunk's entry is
  read and scanned (its uuid and whether it is the last chunk are not in the index):
  chunks are large messages, few per ledger.
* ``survivors`` is phase two of a piece given its group's decisions (``GroupDecisions``:
  retained positions, dropped chunks, packed into sorted ``uint64`` arrays, 8 bytes each):
  the keep rule of ``rewrite.group_phase_two`` as array work
  (``compactor.local.slot_rule``); an entry all of whose live messages survive is copied as
  stored, a batch that loses slots is rewritten (``compactor.local.indexed``'s batch cut:
  one metadata parse, no slot parse), an entry with no survivor is never read.

Memory: a piece's index columns (the ledger's, for the columns asked, while the piece is
read), a phase-one task's held rows (at most ``ROWS_PENDING_MAX``), and in phase two its
group's decisions; never a key count beyond the group's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from compactor.engine import LedgerRange
from compactor.errors import CompactorError
from compactor.local.indexed import compacted_entries
from compactor.local.key_index import (
    FLAG_CHUNK,
    FLAG_KEYLESS,
    FLAG_MARKER,
    FLAG_OPAQUE,
    FLAGS_NOT_A_MESSAGE,
    FLAGS_NOT_A_VALUE,
    INDEX_SUFFIX,
    KeyIndex,
    build_index,
    entry_starts,
    ledger_path,
    sealed_index,
)
from compactor.local.keymap import key_hash
from compactor.local.scan import scan_entry
from compactor.local.slot_rule import old_tombstones, surviving_rows
from compactor.spark.rows import open_store, read_range
from compactor.view.view import CompactedEntry, decode_compacted_entry
from ledger.storage.bucket import ledger_object_name
from ledger.storage.object_fs import BucketConfig
from ledger.storage.sealed_file import SealedFile

__all__ = [
    "PHASE_ONE_COLUMNS",
    "PHASE_ONE_ROWS_DDL",
    "PHASE_TWO_COLUMNS",
    "GroupDecisions",
    "LastIndex",
    "PieceIndex",
    "TaskKeyedRows",
    "chunk_batches",
    "chunk_rows",
    "ensure_ledger_index",
    "figures",
    "index_file",
    "keyed_batches",
    "keyed_rows",
    "latest_rows",
    "ledger_ids_without_index",
    "survivors",
]

Rows = dict[str, npt.NDArray[Any]]
Mask = npt.NDArray[np.bool_]

# Rows per Arrow record batch handed to Spark (slices of one piece's arrays).
ROWS_PER_BATCH_MAX = 65_536
# Keyed rows a phase-one task holds to drop a key's earlier rows across its pieces.
ROWS_PENDING_MAX = 2_000_000
# Entries with a survivor read at once in phase two.
READ_BATCH_ENTRIES_MAX = 1000
# The index columns each phase reads (``publish_time`` too where tombstones may be young).
PHASE_ONE_COLUMNS = ("flags", "hash_high", "hash_low", "entry_offset", "stored_bytes")
CHUNK_COLUMNS = ("flags", "entry_offset", "stored_bytes")
PHASE_TWO_COLUMNS = ("flags", "ledger_id", "entry_id", "batch_index", "batch_size", "slot_end", "entry_bytes",
                     "entry_offset", "stored_bytes")
_ENTRY_BITS, _BATCH_BITS = 30, 14  # a packed position: ledger ordinal, entry id, batch index + 1


def index_file(ledgers_root: str, ledger_id: int) -> str:
    """Where ledger ``ledger_id``'s key index lives in the ledger directory ``ledgers_root``."""
    return ledger_path(ledgers_root, ledger_id) + INDEX_SUFFIX


def ensure_ledger_index(ledgers_root: str | None, ledger_id: int, compacted: bool,
                        bucket: BucketConfig | None = None) -> int:
    """On an executor, before phase one: make sure sealed ledger ``ledger_id`` has a whole
    index (read it, or build and keep it where the ledger is: ``key_index.store_index``);
    its rows, or -1 when the ledger is not sealed. ``rows.open_store``'s arguments."""
    store = open_store(ledgers_root, bucket)
    try:
        sealed = store.open_sealed(ledger_id)
        if sealed is None:
            return -1
        try:
            return len(sealed_index(sealed, store, compacted=compacted, columns=()))
        finally:
            sealed.close()
    finally:
        store.shutdown()


class LastIndex:
    """The key index of the last sealed ledger a task read (its ``columns``), for the
    task's next piece of the same ledger: a ledger cut into several pieces has its index
    read, and checked, once a task, not once a piece. Holds one ledger's index at most."""

    def __init__(self) -> None:
        self._key: tuple[int, bool, tuple[str, ...]] | None = None
        self._index: KeyIndex | None = None

    def get(self, sealed: SealedFile, store: Any, piece: LedgerRange, columns: tuple[str, ...]) -> KeyIndex:
        """``key_index.sealed_index`` of ``piece``'s ledger, read again only for another ledger."""
        key = (piece.ledger_id, piece.compacted, columns)
        if self._key != key or self._index is None:
            self._key, self._index = None, None  # the previous ledger's index is let go first
            self._index = sealed_index(sealed, store, compacted=piece.compacted, columns=columns)
            self._key = key
        return self._index


class PieceIndex:
    """One piece's index rows (``columns`` of them, and ``stored``) and its entries on
    demand; see the module docstring. ``rows.open_store``'s arguments; ``last``: the
    task's ``LastIndex``, if it keeps one. Close it."""

    def __init__(self, ledgers_root: str | None, piece: LedgerRange, columns: tuple[str, ...],
                 bucket: BucketConfig | None = None, last: LastIndex | None = None) -> None:
        self.piece = piece
        self._store: Any = open_store(ledgers_root, bucket)
        self._sealed: SealedFile | None = None
        try:
            self._sealed = self._store.open_sealed(piece.ledger_id)
            if self._sealed is None:
                index = build_index((piece.first_entry_id + offset, entry.position.ledger_id, entry.position.entry_id,
                                     entry.data) for offset, entry in enumerate(read_range(self._store, piece)))
            elif last is not None:
                index = last.get(self._sealed, self._store, piece, columns)
            else:
                index = sealed_index(self._sealed, self._store, compacted=piece.compacted, columns=columns)
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


PHASE_ONE_ROWS_DDL = "h1 bigint, h2 bigint, v bigint"
"""A phase-one row: a key's (or a chunk's uuid's) 128-bit hash as two signed halves, and
``v``: the row's place in the stream, ``seq`` (``piece << 32 | row``: the piece's number in
the run, the row's number among the piece's index rows), shifted left by two, with two
flag bits: a keyed row's ``chunk_end`` (bit 1: the last chunk of a chunked message) and
``deletes`` (bit 0: a tombstone that is not young); a chunk row's ``last`` (bit 1) and
``keyless`` (bit 0). The greatest ``v`` of a key is its latest update."""
PHASE_ONE_ROWS = pa.schema([("h1", pa.int64()), ("h2", pa.int64()), ("v", pa.int64())])
ROW_BITS = 32  # a seq's row part
FLAG_BITS = 2  # v's flag bits


def _signed(column: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    return np.ascontiguousarray(column).view(np.int64) if column.dtype == np.uint64 else column.astype(np.int64)


def _v(piece: int, at: npt.NDArray[np.intp], high_flag: Any, low_flag: Any) -> npt.NDArray[np.int64]:
    seq = (np.int64(piece) << np.int64(ROW_BITS)) | at.astype(np.int64)
    return (seq << np.int64(FLAG_BITS)) | (np.asarray(high_flag, np.int64) << 1) | np.asarray(low_flag, np.int64)


def _batches(h1: Any, h2: Any, v: Any) -> Iterator[pa.RecordBatch]:
    batch = pa.RecordBatch.from_arrays([pa.array(h1), pa.array(h2), pa.array(v)], schema=PHASE_ONE_ROWS)
    for start in range(0, len(v), ROWS_PER_BATCH_MAX):
        yield batch.slice(start, ROWS_PER_BATCH_MAX)


def keyed_rows(index: PieceIndex, piece: int,
               keep_tombstones_since_ms: int | None) -> tuple[npt.NDArray[np.int64], ...]:
    """Phase one's keyed rows of the piece ``index`` as arrays ``(h1, h2, v)``
    (``PHASE_ONE_ROWS``), in stream order: one per live keyed message, a keyed last chunk
    included (an earlier chunk is not a value)."""
    rows = index.rows
    flags = rows["flags"]
    chunk = (flags & FLAG_CHUNK) != 0
    valued = (flags & FLAGS_NOT_A_VALUE) == 0
    at = np.flatnonzero(valued & ~chunk)
    deletes = old_tombstones(flags, rows.get("publish_time"), keep_tombstones_since_ms)[at]
    ends = np.flatnonzero(valued & chunk)
    if len(ends):  # a keyed chunk: only a last chunk is a value (compactor.local.chunks)
        ends = ends[_chunk_scans(index, ends)[1]]
        at = np.concatenate([at, ends])
        deletes = np.concatenate([deletes, np.zeros(len(ends), bool)])
        order = np.argsort(at, kind="stable")
        at, deletes = at[order], deletes[order]
        chunk_end = chunk[at]
    else:
        chunk_end = np.zeros(len(at), bool)
    return _signed(rows["hash_high"][at]), _signed(rows["hash_low"][at]), _v(piece, at, chunk_end, deletes)


def latest_rows(h1: npt.NDArray[np.int64], h2: npt.NDArray[np.int64],
                v: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], ...]:
    """Rows ``(h1, h2, v)`` given in stream order (``v`` ascending), less the earlier rows
    of a key that Spark's aggregation would drop anyway: one stable sort on ``h1`` alone
    puts a key's rows next to each other, its last one last; where two keys share ``h1`` a
    row may stay (the aggregation still keeps only the latest)."""
    order = np.argsort(h1, kind="stable")
    h1, h2 = h1[order], h2[order]
    last = np.ones(len(order), bool)
    last[:-1] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
    return h1[last], h2[last], v[order[last]]


def keyed_batches(index: PieceIndex, piece: int, keep_tombstones_since_ms: int | None) -> Iterator[pa.RecordBatch]:
    """Phase one's keyed rows of the piece ``index`` (``PHASE_ONE_ROWS``), each key's last
    one in the piece (``keyed_rows`` less ``latest_rows``'s drops)."""
    yield from _batches(*latest_rows(*keyed_rows(index, piece, keep_tombstones_since_ms)))


class TaskKeyedRows:
    """A task's keyed rows over a run of pieces, in stream order, handed on as record
    batches less the rows ``latest_rows`` drops across the pieces: held until
    ``ROWS_PENDING_MAX`` rows (then, or at ``flush``, deduplicated and given out), so a
    task's memory is bounded whatever its pieces (about 100 bytes a held row at a flush:
    the rows, their sort order and the kept copies). ``add`` and ``flush`` are generators:
    iterate them."""

    def __init__(self, rows_max: int = 0) -> None:
        self._rows_max = rows_max or ROWS_PENDING_MAX
        self._parts: list[tuple[npt.NDArray[np.int64], ...]] = []
        self._held = 0
        self._last_v: int | None = None

    def add(self, h1: npt.NDArray[np.int64], h2: npt.NDArray[np.int64],
            v: npt.NDArray[np.int64]) -> Iterator[pa.RecordBatch]:
        """Hold a piece's rows (``keyed_rows``); the batches due, if any."""
        if not len(v):
            return
        if self._last_v is not None and int(v[0]) <= self._last_v:  # not after the held: no merge across
            yield from self.flush()
        self._parts.append((h1, h2, v))
        self._held += len(v)
        self._last_v = int(v[-1])
        if self._held >= self._rows_max:
            yield from self.flush()

    def flush(self) -> Iterator[pa.RecordBatch]:
        """The held rows, deduplicated, as batches; nothing is held after."""
        if not self._parts:
            return
        parts, self._parts, self._held, self._last_v = self._parts, [], 0, None
        columns = parts[0] if len(parts) == 1 else tuple(
            np.concatenate([part[column] for part in parts]) for column in range(3))
        del parts
        kept = latest_rows(*columns)
        del columns
        yield from _batches(*kept)


def chunk_rows(index: PieceIndex) -> int:
    """How many of the piece ``index``'s rows are chunks (of a chunked message)."""
    return int(np.count_nonzero(index.rows["flags"] & FLAG_CHUNK))


def chunk_batches(index: PieceIndex, piece: int) -> Iterator[pa.RecordBatch]:
    """Phase one's chunk rows of the piece ``index``: one per chunk, hashed by its uuid
    (``PHASE_ONE_ROWS``); each chunk's entry is read and scanned for it."""
    at = np.flatnonzero((index.rows["flags"] & FLAG_CHUNK) != 0)
    if not len(at):
        return
    uuids, last = _chunk_scans(index, at)
    keyless = (index.rows["flags"][at] & FLAG_KEYLESS) != 0
    yield from _batches(_signed(uuids[0]), _signed(uuids[1]), _v(piece, at, last, keyless))


def _chunk_scans(index: PieceIndex, at: npt.NDArray[np.intp]) -> tuple[tuple[npt.NDArray[np.uint64], ...], Mask]:
    """The uuid hashes (high, low) of the chunks at rows ``at``, and which are last chunks."""
    highs, lows, lasts = [], [], []
    stored = index.rows["stored"][at].tolist()
    for first in range(0, len(stored), READ_BATCH_ENTRIES_MAX):
        for data in index.read(stored[first:first + READ_BATCH_ENTRIES_MAX]):
            if index.piece.compacted:
                data = decode_compacted_entry(data).data
            scan = scan_entry(data)
            if scan.chunk is None:
                raise CompactorError(f"ledger {index.piece.ledger_id}: the index says chunk, the entry does not")
            high, low = key_hash(scan.chunk.uuid)
            highs.append(high)
            lows.append(low)
            lasts.append(scan.chunk.is_last)
    return (np.array(highs, np.uint64), np.array(lows, np.uint64)), np.array(lasts, dtype=bool)


def figures(rows: Rows) -> list[int]:
    """A piece's phase-one figures (``rewrite.FIGURES``): entries, messages, entry bytes,
    markers, opaque entries."""
    flags = rows["flags"]
    starts = entry_starts(rows["stored"])
    return [len(starts), int(np.count_nonzero((flags & FLAGS_NOT_A_MESSAGE) == 0)),
            int(rows["entry_bytes"][starts].astype(np.int64).sum()),
            int(np.count_nonzero(flags & FLAG_MARKER)), int(np.count_nonzero(flags & FLAG_OPAQUE))]


class GroupDecisions:
    """A group's share of phase one's decisions, as stream places (``seq``, see
    ``PHASE_ONE_ROWS_DDL``), sorted, 8 bytes each: the retained rows (some key's latest)
    and the dropped chunks (dropped with their chunked message)."""

    def __init__(self, retained: npt.NDArray[np.int64], dropped: npt.NDArray[np.int64]) -> None:
        self._retained = np.sort(np.asarray(retained, np.int64))
        self._dropped = np.sort(np.asarray(dropped, np.int64))

    def __len__(self) -> int:
        """Retained rows (the group's live keys)."""
        return len(self._retained)

    @staticmethod
    def _rows(places: npt.NDArray[np.int64], piece: int, count: int) -> Mask:
        first, last = np.searchsorted(places, [np.int64(piece) << np.int64(ROW_BITS),
                                               np.int64(piece + 1) << np.int64(ROW_BITS)])
        mask = np.zeros(count, dtype=bool)
        mask[(places[first:last] & np.int64((1 << ROW_BITS) - 1)).astype(np.intp)] = True
        return mask

    def retained(self, piece: int, count: int) -> Mask:
        """Which of piece ``piece``'s ``count`` rows are retained."""
        return self._rows(self._retained, piece, count)

    def dropped(self, piece: int, count: int) -> Mask:
        """Which of piece ``piece``'s ``count`` rows are chunks dropped with their message."""
        return self._rows(self._dropped, piece, count)


def survivors(index: PieceIndex, piece: int, decisions: GroupDecisions, *, retain_null_key: bool,
              keep_tombstones_since_ms: int | None) -> Iterator[CompactedEntry]:
    """Phase two of the piece ``index``, number ``piece`` of the run: its surviving entries,
    in order (module docstring): the rule is ``compactor.local.slot_rule.surviving_rows``, a
    keyed message its key's latest iff the group's decisions retain its row."""
    rows = index.rows
    flags = rows["flags"]
    count = len(flags)
    retained = decisions.retained(piece, count)
    dropped = decisions.dropped(piece, count)
    keep = surviving_rows(flags, old=old_tombstones(flags, rows.get("publish_time"), keep_tombstones_since_ms),
                          retain_null_key=retain_null_key, latest=lambda asked: retained[asked],
                          chunk_survives=lambda asked: ~dropped[asked])
    yield from compacted_entries(index.rows, keep, index.read, compacted=index.piece.compacted)


def ledger_ids_without_index(ledgers_root: str, ledger_ids: list[int], bucket: BucketConfig | None = None) -> list[
        int]:
    """Those of ``ledger_ids`` whose key index is not there: no file in ``ledgers_root``,
    or, with ``bucket`` (where the run's input all is), no sidecar object there (one
    listing call)."""
    if bucket is None:
        return [ledger_id for ledger_id in ledger_ids if not os.path.exists(index_file(ledgers_root, ledger_id))]
    from pyarrow import fs

    filesystem = bucket.open()
    infos = filesystem.get_file_info([f"{bucket.base}/{ledger_object_name(ledger_id, INDEX_SUFFIX)}"
                                      for ledger_id in ledger_ids])
    return [ledger_id for ledger_id, info in zip(ledger_ids, infos, strict=True) if info.type == fs.FileType.NotFound]
