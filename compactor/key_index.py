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
hash_high       uint64   the 128-bit BLAKE2b hash of the key (``compactor.keymap.key_hash``)
hash_low        uint64   0 and 0 for a row with no key
flags           uint8    ``FLAG_*`` below
publish_time    int64    the entry's publish time (ms)
slot_end        uint32   where the slot ends in the decompressed batch body (0 otherwise)
entry_bytes     uint32   the size of the entry's data (a compacted entry's inner data)
==============  =======  ==============================================================

An entry is either read whole from the index or not at all: ``build_index`` gives, per
entry, exactly what ``compactor.scan.scan_entry`` reads of it, so the index path and the
reference reader cannot disagree (``tests/unit/compactor/test_key_index.py``).

Integrity: the file's key-value metadata records the index's format, the ledger it
describes (id, entry count, size in bytes: a file describing another ledger, or another
state of it, is refused), and a CRC32C over every column's values. ``read_index`` gives
None for a file that is missing, and raises ``CorruptIndexError`` for one that does not
read back whole and consistent; the caller then parses the ledger instead (and may write a
fresh index). ``write_index`` writes a temporary file, fsyncs it, renames it over the final
name and fsyncs the directory: a crash leaves the old file, the new one, or a temporary
file (``TEMP_SUFFIX``), never half an index under the final name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

import crc32c
import numpy as np
import numpy.typing as npt

from compactor.errors import CompactorError
from compactor.keymap import key_hash
from compactor.scan import scan_entry
from compactor.view import decode_compacted_entry
from ledger.storage.base import LedgerState
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_writer import ledger_file_name

__all__ = [
    "FLAG_CHUNK",
    "FLAG_COMPACTED_OUT",
    "FLAG_KEYLESS",
    "FLAG_MARKER",
    "FLAG_OPAQUE",
    "FLAG_TOMBSTONE",
    "INDEX_SUFFIX",
    "TEMP_SUFFIX",
    "CorruptIndexError",
    "IndexedLedger",
    "KeyIndex",
    "build_index",
    "ensure_index",
    "index_path",
    "read_index",
    "write_index",
]

log = logging.getLogger(__name__)

# Entries per store read while an index is built.
BUILD_READ_ENTRIES_MAX = 1000

INDEX_SUFFIX = ".kidx"
"""Appended to the ledger file's name."""
TEMP_SUFFIX = ".kidx-tmp"
"""A temporary file being written; never read, removed at the next start."""
FORMAT = "compactd-key-index/1"

FLAG_KEYLESS = 1
"""The message has no key (``retain_null_key`` decides)."""
FLAG_TOMBSTONE = 2
"""A keyed message whose value is null or empty."""
FLAG_MARKER = 4
"""A server marker entry (one row): never kept."""
FLAG_OPAQUE = 8
"""An entry that does not decode (one row): always kept whole."""
FLAG_CHUNK = 16
"""A piece of a chunked message (one row): ``compactor.chunks`` decides, by parsing."""
FLAG_COMPACTED_OUT = 32
"""A slot a previous compaction emptied: not a message, kept only for ``slot_end``."""

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("stored", "uint32"), ("ledger_id", "uint64"), ("entry_id", "uint64"), ("batch_index", "int32"),
    ("batch_size", "int32"), ("hash_high", "uint64"), ("hash_low", "uint64"), ("flags", "uint8"),
    ("publish_time", "int64"), ("slot_end", "uint32"), ("entry_bytes", "uint32"),
)


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

    columns: dict[str, npt.NDArray[np.generic]]
    entries: int

    def __len__(self) -> int:
        return len(self.columns["stored"])

    def __getitem__(self, name: str) -> npt.NDArray[np.generic]:
        return self.columns[name]


def build_index(entries: Iterable[tuple[int, int, int, bytes]]) -> KeyIndex:
    """The index of ``(stored, ledger_id, entry_id, data)`` entries, in stream order,
    read with ``scan_entry`` (an entry of a compacted ledger: its inner data and original
    position)."""
    rows: dict[str, list[int]] = {name: [] for name, _ in _COLUMNS}
    count = 0
    for stored, ledger_id, entry_id, data in entries:
        count += 1
        _add_entry(rows, stored, ledger_id, entry_id, data)
    columns = {name: np.array(rows[name], dtype=dtype) for name, dtype in _COLUMNS}
    return KeyIndex(columns, count)


def _add_entry(rows: dict[str, list[int]], stored: int, ledger_id: int, entry_id: int, data: bytes) -> None:
    """Append one entry's rows."""
    scan = scan_entry(data)
    size = len(data)

    def row(batch_index: int, hashed: tuple[int, int], flags: int, slot_end: int = 0) -> None:
        for name, value in (("stored", stored), ("ledger_id", ledger_id), ("entry_id", entry_id),
                            ("batch_index", batch_index), ("batch_size", scan.batch_size),
                            ("hash_high", hashed[0]), ("hash_low", hashed[1]), ("flags", flags),
                            ("publish_time", scan.publish_time), ("slot_end", slot_end), ("entry_bytes", size)):
            rows[name].append(value)

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


def index_path(ledger_file: str) -> str:
    """Where the index of the ledger stored in ``ledger_file`` lives."""
    return ledger_file + INDEX_SUFFIX


def _checksum(columns: dict[str, npt.NDArray[np.generic]]) -> int:
    value = 0
    for name, _ in _COLUMNS:
        value = crc32c.crc32c(np.ascontiguousarray(columns[name]).tobytes(), value)
    return value


def write_index(path: str, index: KeyIndex, ledger: IndexedLedger) -> None:
    """Write ``index`` of ``ledger`` to ``path`` atomically and durably (module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    metadata = {
        "format": FORMAT, "ledger_id": str(ledger.ledger_id), "entries": str(ledger.entries),
        "size_bytes": str(ledger.size_bytes), "crc32c": str(_checksum(index.columns)),
    }
    table = pa.table({name: index.columns[name] for name, _ in _COLUMNS}).replace_schema_metadata(metadata)
    temporary = f"{path}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    try:
        pq.write_table(table, temporary, compression="zstd", write_page_checksum=True)
        fd = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_index(path: str, ledger: IndexedLedger) -> KeyIndex | None:
    """The index at ``path`` if it describes ``ledger`` exactly; None when there is no file.

    Raises ``CorruptIndexError`` when the file does not read back whole (a damaged page, a
    checksum that does not match, a column missing) or describes another ledger or another
    state of it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException, ValueError) as error:
        raise CorruptIndexError(f"key index {path} does not read: {error}") from None
    metadata = {key.decode(errors="replace"): value.decode(errors="replace")  # a damaged byte: a mismatch below
                for key, value in (table.schema.metadata or {}).items()}
    expected = {"format": FORMAT, "ledger_id": str(ledger.ledger_id), "entries": str(ledger.entries),
                "size_bytes": str(ledger.size_bytes)}
    for key, value in expected.items():
        if metadata.get(key) != value:
            raise CorruptIndexError(f"key index {path}: {key} is {metadata.get(key)!r}, expected {value!r}")
    try:
        columns = {name: table.column(name).to_numpy().astype(dtype, copy=False) for name, dtype in _COLUMNS}
    except (KeyError, pa.ArrowException) as error:
        raise CorruptIndexError(f"key index {path}: {error}") from None
    if str(_checksum(columns)) != metadata.get("crc32c"):
        raise CorruptIndexError(f"key index {path}: the columns' checksum does not match")
    index = KeyIndex(columns, ledger.entries)
    _check_shape(path, index)
    return index


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


def ensure_index(store: FileLedgerStore, ledger_id: int, *, compacted: bool, write: bool = True) -> KeyIndex:
    """The index of ledger ``ledger_id`` of ``store`` (a compacted ledger when ``compacted``).

    A sealed ledger's index is read from its file; when the file is missing, or corrupt
    (logged), the ledger is parsed and, with ``write``, the index is written for next
    time. An open ledger is parsed up to its last confirmed entry and nothing is written
    (its index would describe one state of it only).
    """
    info = store.info(ledger_id)
    ledger = IndexedLedger(ledger_id, info.entries, info.size_bytes)
    sealed = info.state is LedgerState.CLOSED
    path = index_path(os.path.join(store.root, ledger_file_name(ledger_id)))
    if sealed:
        try:
            index = read_index(path, ledger)
        except CorruptIndexError as error:
            log.warning("%s; parsing the ledger and writing it again", error)
            index = None
        if index is not None:
            return index
    index = build_index(_stored_entries(store, ledger_id, info.entries, compacted))
    if sealed and write:
        write_index(path, index, ledger)
    return index


def _stored_entries(
    store: FileLedgerStore, ledger_id: int, entries: int, compacted: bool,
) -> Iterable[tuple[int, int, int, bytes]]:
    """Every entry of the ledger as ``build_index`` takes them."""
    for first in range(0, entries, BUILD_READ_ENTRIES_MAX):
        batch = store.read(ledger_id, first, min(entries, first + BUILD_READ_ENTRIES_MAX) - 1)
        for offset, data in enumerate(batch):
            if compacted:
                inner = decode_compacted_entry(data)
                yield first + offset, inner.position.ledger_id, inner.position.entry_id, inner.data
            else:
                yield first + offset, ledger_id, first + offset, data
