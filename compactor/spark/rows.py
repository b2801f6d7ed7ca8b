"""What an executor makes of one ledger range: Arrow record batches, no PySpark needed.

The ``compactd`` data source reads ledger files directly through a read-only
``FileLedgerStore`` (``open_store``: no lock, the owning broker may be running; with the
broker's bucket, an offloaded ledger is read from the object store), and
``message_batches`` turns one ``LedgerRange`` into rows (``MESSAGE_SCHEMA``): one row per
message, as a reader of the topic gets it. Raw entries: markers, entries that do not
decode (opaque) and slots a previous run dropped (``compacted_out``) give no row.
Compacted entries: the surviving slots only (the ``ack_set`` a read-compacted reader is
sent), less those the view's dead marks name (a dead entry gives no row). ``key`` is text:
a key that is not valid UTF-8 (a producer's raw bytes) has its bad bytes replaced there,
as Arrow strings must be text; ``key_bytes`` is the key's bytes exactly
(``Message.key_bytes``: the raw bytes, base64-decoded when the producer sent binary key
bytes, the flagged text's bytes when that is not valid base64); both are null for a
key-less message. ``value`` is null for a ``send(None)``. A chunked message gives one row
per chunk, whose ``value`` is the chunk's piece of the compressed whole as stored (the
rows are not put back together). The Spark engine's executors use ``open_store`` and
``read_range`` too (``compactor.spark.index_scan``).

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
    "bucket_option",
    "ledgers_root_of",
    "message_batches",
    "open_store",
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
