"""PySpark data sources over a compactd data dir: a topic (or its compacted view) as a DataFrame.

``CompactdDataSource`` (format ``"compactd"``), registered by ``compactor.spark.register``
(which also ships compactd's code to the Python workers: ``compactor.spark.shipping``)::

    compactor.spark.register(spark)
    df = (spark.read.format("compactd")
          .option("dataDir", "/var/lib/compactd").option("topic", "my-table")
          .option("readCompacted", "true")        # default "false": the raw topic
          .option("includeOpenLedger", "true")    # default: the open ledger's confirmed entries too
          .load())

gives one row per message (``compactor.spark.rows.MESSAGE_SCHEMA_DDL``: key, value,
ledger_id, entry_id, batch_index, publish_time and event_time in ms since the epoch,
properties, tombstone, key_bytes: the key's exact bytes, where ``key`` is text) and one partition per ledger, so executors read ledgers in
parallel. Options:

* ``dataDir`` (required): the data dir; it is opened **read-only** and without its lock,
  so a running broker keeps serving: the metadata through a read-only SQLite connection
  (WAL readers see committed transactions whole), the ledger files through a read-only
  ``FileLedgerStore``. Executors must see the same path (one machine, or a shared disk).
* ``topic`` (required): ``persistent://tenant/namespace/topic``, ``tenant/namespace/topic``
  or a short name in ``public/default``.
* ``readCompacted``: ``"true"`` reads what a read-compacted reader gets: the published
  compacted view (its ledgers in the manifest's order: surviving messages only, at their
  original ids; the entries and slots its dead marks name are skipped), then the raw ledgers after the horizon; ``"false"`` (default) reads the
  raw ledgers. A replaced view's ledgers stay readable for the broker's grace period
  (``compacted_ledger_grace_period_s``), so a scan planned before a publish reads whole.
* ``includeOpenLedger``: ``"true"`` (default) also reads the open (current) ledger up to
  its last confirmed entry at planning time, as a reader created then would see it (a live
  topic often has only an open ledger); ``"false"``: sealed ledgers only, which never
  change under a running broker.
* ``bucket`` (with ``bucketEndpoint``, ``bucketRegion``): the broker's offload location
  (``s3://bucket/prefix`` or ``file:///dir``): a ledger offloaded and no longer on the
  local disk, or a compacted ledger a Spark run wrote there, is read from it. Credentials
  come from each executor's own AWS configuration chain.

``spark.readStream.format("compactd")`` reads the same rows as a stream (the compacted
snapshot, then the live tail): ``compactor.spark.stream``.

Only ``compactor.spark`` imports PySpark; this module is loaded on first use of
``compactor.spark.CompactdDataSource``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from compactor.engine import LedgerRange
from compactor.errors import CompactorError
from compactor.spark import rows
from compactor.view.manifest import CompactedManifests
from compactor.view.marks import LedgerMarks
from compactor.view.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION
from cursor.store import CursorStore
from ledger.errors import LedgerNotFoundError
from ledger.metadata import LedgerRecord, MetadataStore
from ledger.position import Position
from ledger.storage.object_fs import BucketConfig

__all__ = ["CompactdDataSource", "CompactedSnapshot", "full_topic_name", "plan_ranges",
           "topic_state"]

METADATA_FILE = "metadata.db"  # ledger.data_dir's layout
TRUE_WORDS = {"true": True, "false": False}


def full_topic_name(topic: str) -> str:
    """``topic`` in its full form (Pulsar's short forms: ``t``, ``tenant/ns/t``)."""
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    if len(parts) == 3:
        return f"persistent://{topic}"
    raise CompactorError(f"topic {topic!r} is neither a short name nor tenant/namespace/topic")


def _flag(options: Any, name: str, default: str = "false") -> bool:
    value = str(options.get(name, default)).strip().lower()
    if value not in TRUE_WORDS:
        raise CompactorError(f"option {name}: {value!r} is not true or false")
    return TRUE_WORDS[value]


def _topic_of(lowered: Mapping[str, str]) -> tuple[str, str]:
    """The options' (lower-cased names) data dir, made absolute, and full topic name;
    ``CompactorError`` when either is missing."""
    data_dir, topic = lowered.get("datadir"), lowered.get("topic")
    if not data_dir or not topic:
        raise CompactorError("the compactd data source needs the options dataDir and topic")
    return os.path.abspath(data_dir), full_topic_name(topic)


class CompactedSnapshot(NamedTuple):
    """A topic's published compacted view as persisted: its ledgers in stream order (the
    manifest, ``compactor.view.manifest``), its horizon (the ``__compaction`` mark-delete)
    and its ledgers' dead marks (``compactor.view.marks``: what an executor skips)."""

    ledger_ids: tuple[int, ...]
    horizon: Position
    marks: Mapping[int, LedgerMarks] = MappingProxyType({})


def topic_state(
    data_dir: str, topic: str, *, read_compacted: bool
) -> tuple[list[LedgerRecord], CompactedSnapshot | None]:
    """``topic``'s ledger records and, if ``read_compacted``, its published compacted view
    (None when there is none), from one read-only look at the metadata."""
    path = os.path.join(os.path.abspath(data_dir), METADATA_FILE)
    metadata = MetadataStore(path, read_only=True)
    try:
        with metadata.database.reading():
            records = metadata.topic_ledgers(topic)
            if not records and not metadata.topic_exists(topic):
                raise CompactorError(f"topic {topic} not found in data dir {data_dir}")
            snapshot = _snapshot(metadata, topic) if read_compacted else None
    finally:
        metadata.close()
    return list(records), snapshot


def _snapshot(metadata: MetadataStore, topic: str) -> CompactedSnapshot | None:
    cursor = CursorStore(metadata.database).load(topic, COMPACTION_SUBSCRIPTION)
    if cursor is None or COMPACTED_TOPIC_LEDGER not in cursor.properties:
        return None
    manifests = CompactedManifests(metadata.database)
    ledger_ids = manifests.view_ledger_ids(topic, cursor.properties[COMPACTED_TOPIC_LEDGER])
    return CompactedSnapshot(ledger_ids, cursor.mark_delete_position, manifests.marks(topic))


def plan_ranges(
    data_dir: str, topic: str, *, read_compacted: bool, include_open_ledger: bool, bucket: BucketConfig | None = None,
) -> list[tuple[LedgerRange, LedgerMarks | None]]:
    """The ledger ranges a read of ``topic`` covers, in topic order (see the module
    docstring), each with the dead marks of its ledger (compacted ones only)."""
    records, snapshot = topic_state(data_dir, topic, read_compacted=read_compacted)
    store = rows.open_store(rows.ledgers_root_of(data_dir), bucket)
    try:
        ranges: list[tuple[LedgerRange, LedgerMarks | None]] = []
        horizon = Position(-1, -1)
        if snapshot is not None:
            horizon = snapshot.horizon
            ranges.extend((piece, snapshot.marks.get(piece.ledger_id))
                          for piece in rows.snapshot_ranges(store, snapshot.ledger_ids))
        ranges.extend((piece, None) for piece in _raw_after(store, records, horizon, include_open_ledger))
        return ranges
    finally:
        store.shutdown()


def _raw_after(
    store: Any, records: Sequence[LedgerRecord], horizon: Position, include_open_ledger: bool
) -> Iterator[LedgerRange]:
    """Raw entries after ``horizon``: sealed ledgers, and the open one if asked for."""
    for record in records:
        if record.ledger_id < horizon.ledger_id:
            continue
        entries = record.entries
        if record.is_open:
            if not include_open_ledger:
                continue
            try:
                entries = store.last_add_confirmed(record.ledger_id) + 1
            except LedgerNotFoundError:
                continue
        first = horizon.entry_id + 1 if record.ledger_id == horizon.ledger_id else 0
        if first <= entries - 1:
            yield LedgerRange(record.ledger_id, first, entries - 1)


class _MessageReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        lowered = {key.lower(): value for key, value in options.items()}
        self.data_dir, self.topic = _topic_of(lowered)
        self.read_compacted = _flag(lowered, "readcompacted")
        self.include_open_ledger = _flag(lowered, "includeopenledger", "true")
        self.bucket = rows.bucket_option(lowered)

    def partitions(self) -> Sequence[InputPartition]:
        ranges = plan_ranges(self.data_dir, self.topic, read_compacted=self.read_compacted,
                             include_open_ledger=self.include_open_ledger, bucket=self.bucket)
        return [InputPartition(ledger_range) for ledger_range in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition is None or partition.value is None:  # no ledger to read: Spark's one empty partition
            return
        ledger_range, marks = partition.value
        yield from rows.message_batches(rows.ledgers_root_of(self.data_dir), ledger_range, self.bucket, marks)


class CompactdDataSource(DataSource):
    """Format ``"compactd"``: one row per message of a topic (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "compactd"

    def schema(self) -> str:
        return rows.MESSAGE_SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        del schema
        return _MessageReader(dict(self.options))

    def streamReader(self, schema: Any) -> Any:
        """``spark.readStream.format("compactd")``: ``compactor.spark.stream``."""
        from compactor.spark.stream import StreamReader

        del schema
        lowered = {key.lower(): str(value) for key, value in self.options.items()}
        return StreamReader(*_topic_of(lowered), lowered, topic_state)
