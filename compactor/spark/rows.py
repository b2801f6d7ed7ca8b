"""What an executor makes of one ledger range: Arrow record batches, no PySpark needed.

Both Spark data sources read ledger files directly through a read-only ``FileLedgerStore``
(no lock: the owning broker may be running; with the broker's bucket, an offloaded ledger
is read from the object store) and turn one ``LedgerRange`` into rows:

* ``message_batches`` — one row per message, as a reader of the topic gets it (the
  ``compactd`` data source, ``MESSAGE_SCHEMA``). Raw entries: markers, entries that do not
  decode (opaque) and slots a previous run dropped (``compacted_out``) give no row.
  Compacted entries: the surviving slots only (the ``ack_set`` a read-compacted reader is
  sent), less those the view's dead marks name (a dead entry gives no row). ``key`` is text: a key that is not valid UTF-8 (a producer's raw bytes) has its
  bad bytes replaced there, as Arrow strings must be text; ``key_bytes`` is the key's
  bytes exactly (``Message.key_bytes``: the raw bytes, base64-decoded when the producer
  sent binary key bytes, the flagged text's bytes when that is not valid base64); both are
  null for a key-less message. ``value`` is null for a ``send(None)``. A
  chunked message gives one row per chunk, whose ``value`` is the chunk's piece of the
  compressed whole as stored (the rows are not put back together).
* ``phase_one_batches`` — phase one's view of one piece of the stream
  (``PHASE_ONE_SCHEMA``), exactly what ``compactor.local.algorithm.phase_one`` reads, every row
  tagged with the piece's group (``grp``): one row per keyed live message with its key's
  128-bit hash (two signed int64 halves), its position and whether it deletes the key (an
  old tombstone; a young one counts as a value); for a chunked message, only its last
  chunk gives a keyed row; every chunk gives a *chunk* row (null hash; the hash of its
  uuid, its position, whether it is the last chunk and key-less: ``compactor.local.chunks``); and
  one *figures* row per piece (null hashes) counting entries, messages, bytes, markers
  and opaque entries.

Reads go ``READ_BATCH_ENTRIES_MAX`` entries at a time and rows leave in record batches of
at most ``ROWS_PER_BATCH_MAX``, so an executor's memory stays bounded whatever the ledger.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from compactor.engine import LedgerRange
from compactor.errors import CompactorError
from compactor.local.keymap import key_hash
from compactor.local.scan import scan_entry
from compactor.view.marks import LedgerMarks
from compactor.view.view import CompactedEntry, decode_compacted_entry
from ledger.position import Position
from ledger.storage.base import SyncPolicy
from ledger.storage.file import FileLedgerStore
from ledger.storage.object_fs import BucketConfig
from message.entry import Message, is_marker, iter_messages, parse_entry
from message.errors import MalformedEntryError

__all__ = [
    "MESSAGE_SCHEMA",
    "MESSAGE_SCHEMA_DDL",
    "NO_DATA_DIR",
    "PHASE_ONE_SCHEMA",
    "PHASE_ONE_SCHEMA_DDL",
    "bucket_option",
    "ledgers_root_of",
    "message_batches",
    "open_store",
    "phase_one_batches",
    "read_range",
    "snapshot_ranges",
]

# Entries per store read: a few MiB of entry bytes at typical sizes.
READ_BATCH_ENTRIES_MAX = 2000
# Rows per Arrow record batch handed to Spark.
ROWS_PER_BATCH_MAX = 8192

MESSAGE_SCHEMA_DDL = (
    "key string, value binary, ledger_id bigint, entry_id bigint, batch_index int, "
    "publish_time bigint, event_time bigint, properties map<string,string>, tombstone boolean, "
    "key_bytes binary"
)
MESSAGE_SCHEMA = pa.schema([
    ("key", pa.string()), ("value", pa.binary()), ("ledger_id", pa.int64()),
    ("entry_id", pa.int64()), ("batch_index", pa.int32()), ("publish_time", pa.int64()),
    ("event_time", pa.int64()), ("properties", pa.map_(pa.string(), pa.string())),
    ("tombstone", pa.bool_()), ("key_bytes", pa.binary()),
])
PHASE_ONE_SCHEMA_DDL = (
    "grp int, hash_high bigint, hash_low bigint, ledger_id bigint, entry_id bigint, batch_index int, "
    "deletes boolean, uuid_high bigint, uuid_low bigint, chunk_last boolean, keyless boolean, "
    "entries bigint, messages bigint, entry_bytes bigint, markers bigint, opaque_entries bigint"
)
PHASE_ONE_SCHEMA = pa.schema([
    ("grp", pa.int32()), ("hash_high", pa.int64()), ("hash_low", pa.int64()), ("ledger_id", pa.int64()),
    ("entry_id", pa.int64()), ("batch_index", pa.int32()), ("deletes", pa.bool_()),
    ("uuid_high", pa.int64()), ("uuid_low", pa.int64()), ("chunk_last", pa.bool_()), ("keyless", pa.bool_()),
    ("entries", pa.int64()), ("messages", pa.int64()), ("entry_bytes", pa.int64()),
    ("markers", pa.int64()), ("opaque_entries", pa.int64()),
])
_SIGN = 1 << 63


NO_DATA_DIR = "/nonexistent/compactd-executor/ledgers"
"""The ledger directory an executor given only a bucket opens: one that does not exist, so
that every ledger (and key index) is read from the bucket, and nothing local is touched."""


def open_store(ledgers_root: str | None, bucket: BucketConfig | None = None) -> FileLedgerStore:
    """A read-only view of the ledger files under ``ledgers_root`` (no lock, no writes)
    and, with ``bucket``, of the ledgers in the object store (a ledger with no local file
    is read there, through the store's block cache). ``ledgers_root`` None: the bucket
    alone (``NO_DATA_DIR``)."""
    return FileLedgerStore(NO_DATA_DIR if ledgers_root is None else ledgers_root, sync=SyncPolicy.NONE,
                           read_only=True, bucket=bucket)


def snapshot_ranges(store: FileLedgerStore, ledger_ids: Sequence[int]) -> list[LedgerRange]:
    """The ranges of a compacted view's ledgers (``ledger_ids``, stream order), whole;
    empty ledgers are left out."""
    ranges = []
    for ledger_id in ledger_ids:
        last = store.last_add_confirmed(ledger_id)
        if last >= 0:
            ranges.append(LedgerRange(ledger_id, 0, last, compacted=True))
    return ranges


def read_range(
    store: FileLedgerStore, ledger_range: LedgerRange, marks: LedgerMarks | None = None,
) -> Iterator[CompactedEntry]:
    """The range's entries at their original positions (compacted entries decoded); a
    compacted ledger's dead ``marks`` (``compactor.view.marks``) skip its dead entries and take
    its dead slots off ``surviving``."""
    last = ledger_range.last_entry_id
    dead = marks if marks is not None and marks.any_dead else None
    for first in range(ledger_range.first_entry_id, last + 1, READ_BATCH_ENTRIES_MAX):
        chunk = store.read(ledger_range.ledger_id, first, min(last, first + READ_BATCH_ENTRIES_MAX - 1))
        for offset, data in enumerate(chunk):
            if ledger_range.compacted and dead is not None:
                if not dead.dead_entries[first + offset]:
                    yield decode_compacted_entry(data).without(dead.dead_slots_of(first + offset))
            elif ledger_range.compacted:
                yield decode_compacted_entry(data)
            else:
                yield CompactedEntry(Position(ledger_range.ledger_id, first + offset), data)


def _text(key: str | None) -> str | None:
    """``key`` as valid text (undecodable bytes kept by ``surrogateescape`` replaced)."""
    if key is None:
        return None
    return key.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _key_bytes(message: Message) -> bytes | None:
    """The key's bytes exactly (see the module docstring)."""
    try:
        return message.key_bytes
    except MalformedEntryError:  # flagged base64 that is not: the text as sent
        return None if message.key is None else message.key.encode("utf-8", "surrogateescape")


class _Columns:
    """Rows gathered column by column, cut into record batches of a schema."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.columns: list[list[Any]] = [[] for _ in schema.names]

    def add(self, *row: Any) -> None:
        for column, value in zip(self.columns, row, strict=True):
            column.append(value)

    def full(self) -> bool:
        return len(self.columns[0]) >= ROWS_PER_BATCH_MAX

    def take(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(column, type=field.type) for column, field in zip(self.columns, self.schema, strict=True)],
            schema=self.schema,
        )
        self.columns = [[] for _ in self.schema.names]
        return batch


def message_batches(
    ledgers_root: str | None, ledger_range: LedgerRange, bucket: BucketConfig | None = None,
    marks: LedgerMarks | None = None,
) -> Iterator[pa.RecordBatch]:
    """One row per message of the range (see the module docstring); ``open_store``'s
    arguments; the dead ``marks`` of a compacted ledger applied."""
    store = open_store(ledgers_root, bucket)
    try:
        columns = _Columns(MESSAGE_SCHEMA)
        for entry in read_range(store, ledger_range, marks):
            _add_messages(columns, entry)
            if columns.full():
                yield columns.take()
        if columns.columns[0]:
            yield columns.take()
    finally:
        store.shutdown()


def _add_messages(columns: _Columns, entry: CompactedEntry) -> None:
    """The rows of one entry: none for a marker or an entry that does not decode."""
    try:
        parsed = parse_entry(entry.data)
        if is_marker(parsed.metadata):
            return
        messages = list(iter_messages(parsed))
    except MalformedEntryError:
        return
    surviving = set(entry.surviving) if entry.batch_size else None
    position = entry.position
    publish_time = parsed.metadata.publish_time
    for message in messages:
        if message.compacted_out or (surviving is not None and message.batch_index not in surviving):
            continue
        columns.add(
            _text(message.key), None if message.null_value else message.payload,
            position.ledger_id, position.entry_id, message.batch_index, publish_time,
            message.event_time, [(_text(k), _text(v)) for k, v in message.properties.items()],
            message.is_tombstone, _key_bytes(message),
        )


def phase_one_batches(
    ledgers_root: str | None, ledger_range: LedgerRange, group: int, keep_tombstones_since_ms: int | None,
    bucket: BucketConfig | None = None,
) -> Iterator[pa.RecordBatch]:
    """Phase one's rows of the piece ``ledger_range`` of group ``group`` (see the module
    docstring); ``open_store``'s arguments."""
    store = open_store(ledgers_root, bucket)
    try:
        keys = _KeyColumns(group)
        figures = [0, 0, 0, 0, 0]  # entries, messages, entry bytes, markers, opaque entries
        for entry in read_range(store, ledger_range):
            _add_keys(keys, entry, figures, keep_tombstones_since_ms)
            if len(keys.ledger_ids) >= ROWS_PER_BATCH_MAX:
                yield keys.take()
        if keys.ledger_ids:
            yield keys.take()
        figures_row = _Columns(PHASE_ONE_SCHEMA)
        figures_row.add(group, *[None] * 10, *figures)
        yield figures_row.take()
    finally:
        store.shutdown()


class _KeyColumns:
    """Phase one's keyed and chunk rows, column by column (the figures columns are all
    null; a keyed row has null uuid columns, a chunk row null hash columns)."""

    def __init__(self, group: int) -> None:
        self.group = group
        self.highs: list[int | None] = []
        self.lows: list[int | None] = []
        self.ledger_ids: list[int] = []
        self.entry_ids: list[int] = []
        self.batch_indexes: list[int] = []
        self.deletes: list[bool | None] = []
        self.uuid_highs: list[int | None] = []
        self.uuid_lows: list[int | None] = []
        self.chunk_last: list[bool | None] = []
        self.keyless: list[bool | None] = []

    def _all(self) -> tuple[list[Any], ...]:
        return (self.highs, self.lows, self.ledger_ids, self.entry_ids, self.batch_indexes, self.deletes,
                self.uuid_highs, self.uuid_lows, self.chunk_last, self.keyless)

    def add_key(self, key: str, position: Position, batch_index: int, deletes: bool, *, chunk: bool = False) -> None:
        """A keyed message (every message of a topic: appended column by column);
        ``chunk``: it is the last chunk of a chunked message (``chunk_last`` true)."""
        high, low = key_hash(key)
        self.highs.append(high - (1 << 64) if high >= _SIGN else high)
        self.lows.append(low - (1 << 64) if low >= _SIGN else low)
        self.ledger_ids.append(position.ledger_id)
        self.entry_ids.append(position.entry_id)
        self.batch_indexes.append(batch_index)
        self.deletes.append(deletes)
        self.uuid_highs.append(None)
        self.uuid_lows.append(None)
        self.chunk_last.append(True if chunk else None)
        self.keyless.append(None)

    def add_chunk(self, uuid: str, position: Position, last: bool, keyless: bool) -> None:
        """A chunk of a chunked message (``compactor.local.chunks``)."""
        high, low = key_hash(uuid)
        row = (None, None, position.ledger_id, position.entry_id, -1, None,
               high - (1 << 64) if high >= _SIGN else high, low - (1 << 64) if low >= _SIGN else low, last, keyless)
        for column, value in zip(self._all(), row, strict=True):
            column.append(value)

    def take(self) -> pa.RecordBatch:
        count = len(self.ledger_ids)
        columns = [pa.array([self.group] * count, pa.int32())]
        columns += [
            pa.array(column, field.type)
            for column, field in zip(self._all(), list(PHASE_ONE_SCHEMA)[1:11], strict=True)
        ]
        columns += [pa.nulls(count, pa.int64()) for _ in range(5)]
        for column in self._all():
            column.clear()  # pa.array copied the values: the lists start the next batch
        return pa.RecordBatch.from_arrays(columns, schema=PHASE_ONE_SCHEMA)


def _add_keys(keys: _KeyColumns, entry: CompactedEntry, figures: list[int], cutoff: int | None) -> None:
    """One entry as ``compactor.local.algorithm.phase_one`` reads it."""
    figures[0] += 1
    figures[2] += len(entry.data)
    scan = scan_entry(entry.data)
    if scan.kind == "opaque":
        figures[4] += 1
        return
    if scan.kind == "marker":
        figures[3] += 1
        return
    figures[1] += len(scan.messages)
    if scan.chunk is not None:  # only a last chunk counts as a value, at its position (compactor.local.chunks)
        [(_, key, _)] = scan.messages
        keys.add_chunk(scan.chunk.uuid, entry.position, scan.chunk.is_last, key is None)
        if scan.chunk.is_last and key is not None:
            keys.add_key(key, entry.position, -1, False, chunk=True)
        return
    young = cutoff is not None and scan.publish_time >= cutoff
    for batch_index, key, tombstone in scan.messages:
        if key is not None:
            keys.add_key(key, entry.position, batch_index, tombstone and not young)


def bucket_option(options: dict[str, str]) -> BucketConfig | None:
    """The object store a data source's lower-cased ``options`` name: ``bucket``
    (``s3://bucket/prefix`` or ``file:///dir``, the broker's offload location) with
    ``bucketendpoint`` and ``bucketregion``; None without ``bucket``. Credentials come from
    the executors' own AWS chain, never from an option."""
    url = options.get("bucket")
    if not url:
        return None
    try:
        return BucketConfig.from_url(url, endpoint=options.get("bucketendpoint") or None,
                                     region=options.get("bucketregion") or None)
    except ValueError as error:
        raise CompactorError(f"option bucket: {error}") from None


def ledgers_root_of(data_dir: str) -> str:
    """Where a data dir keeps its ledger files (``ledger.data_dir``'s layout)."""
    return os.path.join(os.path.abspath(data_dir), "ledgers")
