"""The columnar key index of a sealed ledger: what compaction needs of every message, parsed once.

Both phases need the same few facts of every message (its position, its key's hash,
whether it is a tombstone), and reading them means parsing protobuf and decompressing
payloads in Python, the run's main cost. A sealed ledger never changes, so those facts are
read once and kept beside it in ``<ledger file>.kidx``, a Parquet file (pyarrow), one row
per slot of a batch and one row for every other entry, in stream order:

==============  =======  ==============================================================
column          type     meaning
==============  =======  ==============================================================
stored          uint32   the entry's index in the ledger file (its entry id in a raw
                         ledger; its sequence number in a compacted one)
ledger_id       uint64   the message's position: a compacted ledger's entries keep the
entry_id        uint64   positions they had in the raw topic
batch_index     int32    -1 for a non-batched entry, else the slot
batch_size      int32    slots of the batch (``compacted_out`` ones included); 0 otherwise
hash_high       uint64   the 128-bit BLAKE2b hash of the key (``compactor.local.keymap.key_hash``)
hash_low        uint64   0 and 0 for a row with no key
flags           uint8    ``FLAG_*`` below
publish_time    int64    the entry's publish time (ms)
slot_end        uint32   where the slot ends in the decompressed batch body (0 otherwise)
entry_bytes     uint32   the size of the entry's data (a compacted entry's inner data)
entry_offset    uint64   where the entry's record starts in the ledger file, and the
stored_bytes    uint32   size of what it stores (``ledger.storage.sealed_file`` reads it
                         there, with no scan of the file; 0 and 0 for an open ledger)
==============  =======  ==============================================================

An entry is either read whole from the index or not at all: ``build_index`` gives, per
entry, exactly what ``compactor.local.scan.scan_entry`` reads of it, so the index path and the
reference reader cannot disagree (``tests/unit/compactor/test_key_index.py``).

Integrity: the file's key-value metadata records the index's format, the ledger it
describes (id, entry count, size in bytes: a file describing another ledger, or another
state of it, is refused), and a CRC32C of each column's values (a reader may read only the
columns it needs, each checked); Parquet's page checksums are written and verified too. ``read_index`` gives
None for a file that is missing, and raises ``CorruptIndexError`` for one that does not
read back whole and consistent; the caller then parses the ledger instead (and may write a
fresh index). ``write_index`` writes a temporary file, fsyncs it, renames it over the final
name and fsyncs the directory: a crash leaves the old file, the new one, or a temporary
file (``TEMP_SUFFIX``), never half an index under the final name. ``IndexWriter`` writes
the same file part by part, never holding the index whole (the index of a ledger a round is
writing), with the same guarantees.

Where: a ledger's index is read through its store (``LedgerFiles.open_sidecar``: the local
file, else the ledger's ``.kidx`` object in the store's bucket), and kept where the ledger
is (``store_index``): beside its local file, or, for a ledger that lives only in the bucket
(offloaded with its local copy gone; written there by a Spark executor), uploaded as its
sidecar object (an atomic put, read back).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import tempfile
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import crc32c
import numpy as np
import numpy.typing as npt

from compactor.errors import CompactorError
from compactor.local.keymap import key_hash
from compactor.local.scan import scan_entry
from compactor.view.view import decode_compacted_entry
from ledger.storage.file import FileLedgerStore
from ledger.storage.file_io import open_private
from ledger.storage.powers import LedgerFiles
from ledger.storage.sealed_file import SealedFile
from ledger.storage.sealed_writer import ledger_file_name

__all__ = [
    "COLUMNS",
    "FLAGS_NOT_A_MESSAGE",
    "FLAGS_NOT_A_VALUE",
    "FLAG_CHUNK",
    "FLAG_COMPACTED_OUT",
    "FLAG_KEYLESS",
    "FLAG_MARKER",
    "FLAG_OPAQUE",
    "FLAG_TOMBSTONE",
    "INDEX_SUFFIX",
    "TEMP_SUFFIX",
    "CorruptIndexError",
    "IndexWriter",
    "IndexedLedger",
    "KeyIndex",
    "build_index",
    "ensure_index",
    "entry_starts",
    "index_path",
    "ledger_path",
    "read_index",
    "sealed_index",
    "store_index",
    "write_index",
]

log = logging.getLogger(__name__)

# Entries per store read while an index is built.
BUILD_READ_ENTRIES_MAX = 1000

INDEX_SUFFIX = ".kidx"
"""Appended to the ledger file's name."""
TEMP_SUFFIX = ".kidx-tmp"
"""A temporary file being written; never read, removed at the next start."""
FORMAT = "compactd-key-index/3"
ROW_GROUP_ROWS_MIN = 1 << 16
"""``IndexWriter`` gathers smaller parts until they make this many rows (about 4.5 MB)."""

FLAG_KEYLESS = 1
"""The message has no key (``retain_null_key`` decides)."""
FLAG_TOMBSTONE = 2
"""A keyed message whose value is null or empty."""
FLAG_MARKER = 4
"""A server marker entry (one row): never kept."""
FLAG_OPAQUE = 8
"""An entry that does not decode (one row): always kept whole."""
FLAG_CHUNK = 16
"""A piece of a chunked message (one row): ``compactor.local.chunks`` decides, by parsing."""
FLAG_COMPACTED_OUT = 32
"""A slot a previous compaction emptied: not a message, kept only for ``slot_end``."""
FLAGS_NOT_A_VALUE = FLAG_KEYLESS | FLAG_MARKER | FLAG_OPAQUE | FLAG_COMPACTED_OUT
"""A row with any of these flags is no key's value (compaction keeps or drops it whole)."""
FLAGS_NOT_A_MESSAGE = FLAG_MARKER | FLAG_OPAQUE | FLAG_COMPACTED_OUT
"""A row with any of these flags is not a message (counted apart, or not at all)."""

COLUMNS: tuple[tuple[str, str], ...] = (
    ("stored", "uint32"), ("ledger_id", "uint64"), ("entry_id", "uint64"), ("batch_index", "int32"),
    ("batch_size", "int32"), ("hash_high", "uint64"), ("hash_low", "uint64"), ("flags", "uint8"),
    ("publish_time", "int64"), ("slot_end", "uint32"), ("entry_bytes", "uint32"),
    ("entry_offset", "uint64"), ("stored_bytes", "uint32"),
)


_COLUMNS = COLUMNS  # (name, numpy dtype) of every column, in the file's order; the last two: where entries are stored
_PARQUET_OPTIONS: dict[str, Any] = {"compression": "lz4", "use_dictionary": False, "write_page_checksum": True}
_TYPECODES = {"uint8": "B", "uint32": "I", "int32": "i", "uint64": "Q", "int64": "q"}


class CorruptIndexError(CompactorError):
    """An index file exists but does not read back whole, or describes another ledger."""


@dataclass(frozen=True)
class IndexedLedger:
    """Which ledger (and which state of it) an index describes."""

    ledger_id: int
    entries: int
    size_bytes: int


@dataclass
class KeyIndex:
    """The rows of one ledger's index as numpy arrays (one per column, see the module
    docstring), and the entries it covers."""

    columns: dict[str, npt.NDArray[Any]]
    entries: int

    def __len__(self) -> int:
        return len(self.columns["stored"])

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self.columns[name]


def build_index(
    entries: Iterable[tuple[int, int, int, bytes]], locations: tuple[Sequence[int], Sequence[int]] | None = None,
) -> KeyIndex:
    """The index of ``(stored, ledger_id, entry_id, data)`` entries, in stream order,
    read with ``scan_entry`` (an entry of a compacted ledger: its inner data and original
    position). ``locations``: every stored entry's record offset and stored size, by
    stored index (a sealed file's ``walk``)."""
    rows = {name: array(_TYPECODES[dtype]) for name, dtype in _COLUMNS[:-2]}
    count = 0
    for stored, ledger_id, entry_id, data in entries:
        count += 1
        _add_entry(rows, stored, ledger_id, entry_id, data)
    columns = {name: np.frombuffer(rows[name], dtype=dtype) if len(rows[name]) else np.empty(0, dtype)
               for name, dtype in _COLUMNS[:-2]}
    where = columns["stored"].astype(np.intp)
    if locations is None:
        columns["entry_offset"] = np.zeros(len(where), np.uint64)
        columns["stored_bytes"] = np.zeros(len(where), np.uint32)
    else:
        columns["entry_offset"] = np.asarray(locations[0], dtype=np.uint64)[where]
        columns["stored_bytes"] = np.asarray(locations[1], dtype=np.uint32)[where]
    return KeyIndex(columns, count)


def _add_entry(rows: dict[str, array[int]], stored: int, ledger_id: int, entry_id: int, data: bytes) -> None:
    """Append one entry's rows."""
    scan = scan_entry(data)
    size = len(data)
    columns = [rows[name] for name, _ in _COLUMNS[:-2]]

    def row(batch_index: int, hashed: tuple[int, int], flags: int, slot_end: int = 0) -> None:
        for column, value in zip(columns, (stored, ledger_id, entry_id, batch_index, scan.batch_size, hashed[0],
                                           hashed[1], flags, scan.publish_time, slot_end, size), strict=True):
            column.append(value)

    if scan.kind in ("opaque", "marker"):
        row(-1, (0, 0), FLAG_OPAQUE if scan.kind == "opaque" else FLAG_MARKER)
        return
    chunk = FLAG_CHUNK if scan.chunk is not None else 0
    if scan.batch is None:
        [(_, key, tombstone)] = scan.messages
        row(-1, *_keyed(key, tombstone, chunk))
        return
    live = {batch_index: (key, tombstone) for batch_index, key, tombstone in scan.messages}
    for batch_index, slot_end in enumerate(scan.batch.slot_ends):
        if batch_index in live:
            row(batch_index, *_keyed(*live[batch_index], chunk), slot_end)
        else:
            row(batch_index, (0, 0), FLAG_COMPACTED_OUT | FLAG_KEYLESS, slot_end)


def _keyed(key: str | None, tombstone: bool, flags: int) -> tuple[tuple[int, int], int]:
    """A message's hash and flags."""
    if key is None:
        return (0, 0), flags | FLAG_KEYLESS
    return key_hash(key), flags | (FLAG_TOMBSTONE if tombstone else 0)


def entry_starts(stored: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """Where each entry's rows start, given the ``stored`` column of some rows (an entry's
    rows are adjacent)."""
    return np.flatnonzero(np.concatenate(([True], stored[1:] != stored[:-1]))[: len(stored)])


def index_path(ledger_file: str) -> str:
    """Where the index of the ledger stored in ``ledger_file`` lives."""
    return ledger_file + INDEX_SUFFIX


def _checksum(column: npt.NDArray[Any]) -> str:
    return str(crc32c.crc32c(np.ascontiguousarray(column).data))


def _metadata(ledger: IndexedLedger, checksums: Mapping[str, int]) -> dict[str, str]:
    """The file's key-value metadata (module docstring): ``checksums`` is each column's CRC32C."""
    return {
        "format": FORMAT, "ledger_id": str(ledger.ledger_id), "entries": str(ledger.entries),
        "size_bytes": str(ledger.size_bytes),
        **{f"crc32c.{name}": str(checksums[name]) for name, _ in _COLUMNS},
    }


def _temporary(path: str) -> tuple[str, BinaryIO]:
    """A fresh temporary file beside ``path``, owner-only (it holds message keys), and its name."""
    temporary = f"{path}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    return temporary, open_private(temporary, exclusive=True)


def _replace_durably(temporary: str, path: str) -> None:
    """Rename the synced ``temporary`` over ``path`` and sync the directory."""
    os.replace(temporary, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_index(path: str, index: KeyIndex, ledger: IndexedLedger) -> None:
    """Write ``index`` of ``ledger`` to ``path`` atomically and durably (module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    checksums = {name: crc32c.crc32c(np.ascontiguousarray(index.columns[name]).data) for name, _ in _COLUMNS}
    table = pa.table({name: index.columns[name] for name, _ in _COLUMNS}).replace_schema_metadata(
        _metadata(ledger, checksums))
    temporary, sink = _temporary(path)
    try:
        with sink:
            pq.write_table(table, sink, **_PARQUET_OPTIONS)
            sink.flush()
            os.fsync(sink.fileno())
        _replace_durably(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class IndexWriter:
    """An index written part by part, never held whole (the key index of a ledger being
    written: ``compactor.local.worker``): ``write`` each part's rows in stream order, then
    ``commit`` the ledger the rows describe. The file reads back with ``read_index``
    exactly as ``write_index``'s would (the same columns, types, key-value metadata and
    checksums: each column's CRC32C runs on across the parts). Parts under
    ``row_group_rows_min`` rows wait for the next ones (one row group of many small parts,
    not many tiny ones), so the writer holds fewer rows than that besides the part it is
    given. Atomic and durable as ``write_index``: the rows go to a temporary file
    (``TEMP_SUFFIX``) that ``commit`` syncs and renames over ``path``; ``abort``, or a
    ``write`` or ``commit`` that fails, removes it."""

    def __init__(self, path: str, *, row_group_rows_min: int = ROW_GROUP_ROWS_MIN) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = path
        self.row_group_rows_min = row_group_rows_min
        self.rows = 0
        self.waiting_rows = 0
        self._schema = pa.schema([(name, pa.from_numpy_dtype(np.dtype(dtype))) for name, dtype in _COLUMNS])
        self._checksums = {name: 0 for name, _ in _COLUMNS}
        self._waiting: list[Any] = []  # pyarrow tables, each over a part's arrays
        self._temporary, self._sink = _temporary(path)
        try:
            self._writer: Any = pq.ParquetWriter(self._sink, self._schema, **_PARQUET_OPTIONS)
        except BaseException:
            self.abort()
            raise

    def write(self, columns: Mapping[str, npt.NDArray[Any]]) -> None:
        """Append rows: every column of ``COLUMNS``, of its type, all of the same length
        (``ValueError`` otherwise)."""
        import pyarrow as pa

        try:
            arrays = [np.ascontiguousarray(columns[name]) for name, _ in _COLUMNS]
            if len({len(array) for array in arrays}) != 1:
                raise ValueError("the columns of a part differ in length")
            for (name, dtype), array in zip(_COLUMNS, arrays, strict=True):
                if array.dtype != np.dtype(dtype) or array.ndim != 1:
                    raise ValueError(f"column {name} of a part holds {array.dtype}, not {dtype}")
            for (name, _), array in zip(_COLUMNS, arrays, strict=True):
                self._checksums[name] = crc32c.crc32c(array.data, self._checksums[name])
            self._waiting.append(pa.Table.from_arrays(arrays, schema=self._schema))
            self.rows += len(arrays[0])
            self.waiting_rows += len(arrays[0])
            if self.waiting_rows >= self.row_group_rows_min:
                self._write_waiting()
        except BaseException:
            self.abort()
            raise

    def commit(self, ledger: IndexedLedger) -> None:
        """Finish the file as the index of ``ledger`` and rename it over ``path``."""
        try:
            self._write_waiting()
            self._writer.add_key_value_metadata(_metadata(ledger, self._checksums))
            self._writer.close()
            self._sink.flush()
            os.fsync(self._sink.fileno())
            self._sink.close()
            _replace_durably(self._temporary, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Give the file up: the temporary file is removed (idempotent; nothing after a ``commit``)."""
        self._waiting, self.waiting_rows = [], 0
        with contextlib.suppress(Exception):
            if hasattr(self, "_writer"):
                self._writer.close()
        with contextlib.suppress(OSError):
            self._sink.close()
        with contextlib.suppress(OSError):
            os.unlink(self._temporary)

    def _write_waiting(self) -> None:
        import pyarrow as pa

        if self._waiting:
            waiting = self._waiting[0] if len(self._waiting) == 1 else pa.concat_tables(self._waiting)
            self._waiting, self.waiting_rows = [], 0
            self._writer.write_table(waiting)


def read_index(
    source: str | Any | None, ledger: IndexedLedger, columns: Sequence[str] | None = None, *, name: str = "",
) -> KeyIndex | None:
    """The index in ``source`` (a local path, or an open random-access file such as
    ``LedgerFiles.open_sidecar`` gives, which this closes) if it describes ``ledger``
    exactly; None when there is none (no file, or ``source`` None). ``columns``: only
    those (and ``stored``), each checked; None: all of them. ``name`` names it in errors.

    Raises ``CorruptIndexError`` when the file does not read back whole (a damaged page, a
    checksum that does not match, a column missing) or describes another ledger or another
    state of it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if source is None:
        return None
    path = name or (source if isinstance(source, str) else "key index")
    wanted = [column for column, _ in _COLUMNS if columns is None or column == "stored" or column in columns]
    try:
        with pq.ParquetFile(source, page_checksum_verification=True) as parquet:  # (read_table imports pandas)
            table = parquet.read(columns=wanted, use_threads=False, use_pandas_metadata=False)  # a run takes one core
        metadata = {key.decode(): value.decode() for key, value in (table.schema.metadata or {}).items()}
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException, ValueError) as error:  # UnicodeDecodeError is a ValueError
        raise CorruptIndexError(f"key index {path} does not read: {error}") from None
    finally:
        if not isinstance(source, str):
            source.close()
    expected = {"format": FORMAT, "ledger_id": str(ledger.ledger_id), "entries": str(ledger.entries),
                "size_bytes": str(ledger.size_bytes)}
    for key, value in expected.items():
        if metadata.get(key) != value:
            raise CorruptIndexError(f"key index {path}: {key} is {metadata.get(key)!r}, expected {value!r}")
    dtypes = dict(_COLUMNS)
    try:
        read = {column: _numpy(table.column(column), np.dtype(dtypes[column])) for column in wanted}
    except (KeyError, pa.ArrowException) as error:
        raise CorruptIndexError(f"key index {path}: {error}") from None
    except _WrongColumn as error:
        raise CorruptIndexError(f"key index {path}: {error}") from None
    for column_name, column in read.items():
        if _checksum(column) != metadata.get(f"crc32c.{column_name}"):
            raise CorruptIndexError(f"key index {path}: the checksum of column {column_name} does not match")
    index = KeyIndex(read, ledger.entries)
    _check_shape(path, index)
    return index


class _WrongColumn(Exception):
    """A column is not the plain array of its type the writer wrote."""


def _numpy(column: Any, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """A Parquet column as a numpy array over its buffers (no copy for one chunk).
    ``ChunkedArray.to_numpy`` would import pandas, half a second into a run."""
    parts = []
    for chunk in column.chunks:
        if chunk.null_count or str(chunk.type) != str(dtype):
            raise _WrongColumn(f"a column holds {chunk.type} with {chunk.null_count} nulls, not {dtype}")
        parts.append(np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def _check_shape(path: str, index: KeyIndex) -> None:
    """Every entry has rows, in order: ``stored`` runs 0, 0, 1, ... entries - 1."""
    stored = index["stored"].astype(np.int64)
    if index.entries == 0:
        if len(stored):
            raise CorruptIndexError(f"key index {path}: rows for a ledger with no entries")
        return
    if not len(stored) or stored[0] != 0 or stored[-1] != index.entries - 1 or np.any(np.diff(stored) > 1) \
            or np.any(np.diff(stored) < 0):
        raise CorruptIndexError(f"key index {path}: rows do not cover entries 0..{index.entries - 1} in order")


def ensure_index(
    store: FileLedgerStore, ledger_id: int, *, compacted: bool, write: bool = True,
    charge: Callable[[int], object] = lambda size: None,
) -> KeyIndex:
    """The index of ledger ``ledger_id`` of ``store`` (a compacted ledger when ``compacted``).

    A sealed ledger (a local file, or an object in the store's bucket:
    ``LedgerFiles.open_sealed``) has its index read from its sidecar (local, else the
    bucket's: ``open_sidecar``); when there is none, or it is corrupt (logged), the ledger
    is parsed and, with ``write``, the index is written for next time (``store_index``).
    An open ledger is parsed up to its last confirmed entry and nothing is written (its
    index would describe one state of it only). ``charge`` is given the bytes read (the
    index file's, or each batch of entries parsed), for the caller's I/O throttle.
    """
    sealed = store.open_sealed(ledger_id)
    if sealed is None:
        return _parsed_open_ledger(store, ledger_id, compacted, charge)
    try:
        return sealed_index(sealed, store, compacted=compacted, write=write, charge=charge)
    finally:
        sealed.close()


def ledger_path(root: str, ledger_id: int) -> str:
    """The file of ledger ``ledger_id`` in the ledger directory ``root``."""
    return os.path.join(root, ledger_file_name(ledger_id))


def sealed_index(
    sealed: SealedFile, files: LedgerFiles, *, compacted: bool, write: bool = True,
    charge: Callable[[int], object] = lambda size: None, columns: Sequence[str] | None = None,
) -> KeyIndex:
    """``ensure_index`` of a sealed ledger already open (``files.open_sealed``);
    ``columns`` as for ``read_index`` (an index built now has every column). An index
    built that cannot be kept (a full disk, a bucket refusing the upload) is logged and
    still given: it is a cache, never a reason to fail the caller."""
    ledger = IndexedLedger(sealed.ledger_id, sealed.entries, sealed.size_bytes)
    name = sealed.path + INDEX_SUFFIX
    try:
        source = files.open_sidecar(sealed.ledger_id, INDEX_SUFFIX)
        size = 0 if source is None else source.size()
        index = read_index(source, ledger, columns, name=name)
    except CorruptIndexError as error:
        log.warning("%s; parsing the ledger and writing it again", error)
        index = None
    if index is not None:
        charge(size)
        return index
    offsets, lengths = sealed.walk()
    index = build_index(_sealed_entries(sealed, offsets, lengths, compacted, charge), (offsets, lengths))
    if write:
        try:
            store_index(files, index, ledger)
        except (OSError, ValueError) as error:  # a cache: the caller goes on with the index built
            log.warning("could not keep the key index of ledger %d (built again when next needed): %s",
                        ledger.ledger_id, error)
    return index


def store_index(files: LedgerFiles, index: KeyIndex, ledger: IndexedLedger) -> None:
    """Keep ``index`` of sealed ``ledger`` where its ledger is: beside its local file
    (``write_index``), else, for a ledger that lives in ``files``' bucket only, as the
    ledger's sidecar object there (written to a temporary local file first, then uploaded
    atomically and read back: ``LedgerFiles.upload_sidecar``). A ledger in neither
    place: not kept."""
    local = ledger_path(files.root, ledger.ledger_id)
    if os.path.exists(local):
        write_index(index_path(local), index, ledger)
        return
    if files.bucket is None:
        return
    with tempfile.TemporaryDirectory(prefix="compactd-kidx-") as scratch:
        path = os.path.join(scratch, ledger_file_name(ledger.ledger_id) + INDEX_SUFFIX)
        write_index(path, index, ledger)
        files.upload_sidecar(ledger.ledger_id, INDEX_SUFFIX, path)


def _sealed_entries(
    sealed: SealedFile, offsets: Sequence[int], lengths: Sequence[int], compacted: bool,
    charge: Callable[[int], object],
) -> Iterable[tuple[int, int, int, bytes]]:
    """Every entry of a sealed ledger as ``build_index`` takes them."""
    for first in range(0, sealed.entries, BUILD_READ_ENTRIES_MAX):
        last = min(sealed.entries, first + BUILD_READ_ENTRIES_MAX)
        batch = sealed.read(range(first, last), offsets[first:last], lengths[first:last])
        charge(sum(len(data) for data in batch))
        yield from _as_built(sealed.ledger_id, first, batch, compacted)


def _parsed_open_ledger(
    store: FileLedgerStore, ledger_id: int, compacted: bool, charge: Callable[[int], object],
) -> KeyIndex:
    """The index of an open ledger's confirmed entries, parsed through the store."""
    entries = store.info(ledger_id).entries

    def read() -> Iterable[tuple[int, int, int, bytes]]:
        for first in range(0, entries, BUILD_READ_ENTRIES_MAX):
            batch = store.read(ledger_id, first, min(entries, first + BUILD_READ_ENTRIES_MAX) - 1)
            charge(sum(len(data) for data in batch))
            yield from _as_built(ledger_id, first, batch, compacted)

    return build_index(read())


def _as_built(
    ledger_id: int, first: int, batch: Sequence[bytes], compacted: bool,
) -> Iterable[tuple[int, int, int, bytes]]:
    for offset, data in enumerate(batch):
        if compacted:
            inner = decode_compacted_entry(data)
            yield first + offset, inner.position.ledger_id, inner.position.entry_id, inner.data
        else:
            yield first + offset, ledger_id, first + offset, data
