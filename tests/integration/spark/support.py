"""Helpers of the Spark tests: a topic in a real data dir, and what the local reader sees of it.

``TopicDir`` is a data dir as the broker keeps it (file ledgers with small ledgers, so a
topic spans several; SQLite metadata; the lock held while it is open), with one topic, its
``__compaction`` cursor and a compactor. ``local_messages`` is the reference the data
source must agree with: every message ``message.entry.iter_messages`` gives, read
through the local stores, as the rows ``compactor.spark.rows.MESSAGE_SCHEMA_DDL`` names.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from compactor.record import RunFigures
from compactor.runs.runner import Compactor
from compactor.view.topic import COMPACTION_SUBSCRIPTION, CompactedTopic
from compactor.view.view import CompactedEntry, encode_compacted_entry
from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage.base import SyncPolicy
from ledger.storage.object_fs import BucketConfig
from message.encoder import encode_batch, encode_entry
from message.entry import is_marker, iter_messages, parse_entry
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/spark-topic"
# A fixed clock: both engines compute the same tombstone cut-off (now - deleteRetentionMs).
NOW_S = 1_700_000_000.0

Row = tuple[Any, ...]


class TopicDir:
    """One topic in a data dir at ``path``; see the module docstring."""

    def __init__(self, path: Path, *, entries_per_ledger: int = 5, bucket: BucketConfig | None = None) -> None:
        self.path = path
        self.data_dir = DataDir.open(str(path), sync=SyncPolicy.NONE, bucket=bucket)
        self.ledger = ManagedLedger.open(
            TOPIC, self.data_dir.ledgers, self.data_dir.metadata,
            ManagedLedgerConfig(max_entries_per_ledger=entries_per_ledger),
        )
        cursors = CursorStore(self.data_dir.database)
        ManagedCursor.open_durable(self.ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST, store=cursors)
        self.topic = CompactedTopic.restore(self.ledger, cursors)

    def append(self, entries: Iterable[bytes]) -> None:
        for data in entries:
            self.ledger.append(data).result()

    def compact(self, compactor: Compactor, *, delete_retention_ms: int = 0) -> RunFigures:
        return compactor.compact(self.topic, delete_retention_ms=delete_retention_ms)

    def compacted_ledger(self) -> list[bytes]:
        """Every entry of the published compacted view as a full rewrite stores it: its
        ledgers' live entries concatenated in stream order, their dead slots emptied (a
        view with no dead marks: its entries as stored); [] when none."""
        view = self.topic.view
        if view is None or not view.entries:
            return []
        return [encode_compacted_entry(entry) for entry in view.read(0, view.entries - 1, emptied=True)]

    def close(self) -> None:
        self.ledger.close()
        self.data_dir.close()


def object_ids(bucket: BucketConfig) -> set[int]:
    """The ledger ids the bucket holds an object of (a ledger, a sidecar, a temporary copy)."""
    from ledger.storage.bucket import LedgerBucket
    from ledger.storage.byte_source import BlockCache

    return {found.ledger_id for found in LedgerBucket(bucket, BlockCache(0)).objects()}


def live_ledger_ids(topic_dir: TopicDir) -> set[int]:
    """Every ledger a bucket object may belong to: the topic's and its view's."""
    view = topic_dir.topic.view
    return {record.ledger_id for record in topic_dir.ledger.ledger_list()} | set(view.ledger_ids if view else ())


def mixed_entries(count: int = 40, first: int = 0) -> list[bytes]:
    """Keyed singles and batches, tombstones and key-less messages over several ledgers;
    keys written once are spread over the topic, so that every group keeps something."""
    entries = []
    for index in range(first, first + count):
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=1_700_000_000_000 + index)
        if index % 4 == 3:  # a batch of three slots: two keys and a key-less message
            slots = [(pb.SingleMessageMetadata(partition_key=f"k{(index + slot) % 7}", payload_size=2), b"b%d" % slot)
                     for slot in range(2)]
            slots.append((pb.SingleMessageMetadata(payload_size=1), b"n"))
            entries.append(encode_batch(metadata, slots, pb.LZ4, with_checksum=True))
            continue
        metadata.partition_key = f"k{index % 7}" if index % 5 else f"once-{index}"  # some keys written once, early
        value = b"" if index % 9 == 5 else b"v%d" % index  # now and then a tombstone
        entries.append(encode_entry(metadata, value, with_checksum=True))
    return entries


def local_messages(topic_dir: TopicDir, *, read_compacted: bool, include_open_ledger: bool = True) -> list[Row]:
    """The rows the data source must give, read through the local stores (module docstring)."""
    ledger = topic_dir.ledger
    entries: list[CompactedEntry] = []
    horizon = Position(-1, -1)
    view = topic_dir.topic.view if read_compacted else None
    if view is not None:
        entries.extend(view.iter_all())
        horizon = view.horizon
    current = ledger.current_ledger_id
    for record in ledger.ledger_list():
        if record.ledger_id < horizon.ledger_id or (record.ledger_id == current and not include_open_ledger):
            continue
        first = horizon.entry_id + 1 if record.ledger_id == horizon.ledger_id else 0
        if first <= record.entries - 1:
            read = ledger.store.read(record.ledger_id, first, record.entries - 1)
            entries.extend(CompactedEntry(Position(record.ledger_id, first + i), d) for i, d in enumerate(read))
    return [row for entry in entries for row in _rows(entry)]


def _rows(entry: CompactedEntry) -> list[Row]:
    try:
        parsed = parse_entry(entry.data)
        if is_marker(parsed.metadata):
            return []
        messages = list(iter_messages(parsed))
    except MalformedEntryError:
        return []
    rows = []
    for message in messages:
        if message.compacted_out or (entry.batch_size and message.batch_index not in entry.surviving):
            continue
        key = None if message.key is None else message.key.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        rows.append((
            key, None if message.null_value else bytes(message.payload), entry.position.ledger_id,
            entry.position.entry_id, message.batch_index, parsed.metadata.publish_time, message.event_time,
            dict(message.properties), message.is_tombstone, _key_bytes(message),
        ))
    return rows


def _key_bytes(message: Any) -> bytes | None:
    try:
        key: bytes | None = message.key_bytes
        return key
    except MalformedEntryError:
        return None if message.key is None else bytes(message.key.encode("utf-8", "surrogateescape"))


def spark_rows(frame: Any) -> list[Row]:
    """A DataFrame of the ``compactd`` format as plain tuples, in topic order."""
    rows = frame.orderBy("ledger_id", "entry_id", "batch_index").collect()
    return [
        (row.key, None if row.value is None else bytes(row.value), row.ledger_id, row.entry_id,
         row.batch_index, row.publish_time, row.event_time, dict(row.properties or {}), row.tombstone,
         None if row.key_bytes is None else bytes(row.key_bytes))
        for row in rows
    ]


def run_both(
    parts: list[list[bytes]], path: Path, compactors: dict[str, Compactor],
    retention: Callable[[int], int] = lambda run: 0,
) -> dict[str, list[tuple[list[bytes], RunFigures]]]:
    """Append ``parts`` one after the other to one data dir per engine, compacting after
    each; every run's compacted ledger and figures, per engine."""
    results: dict[str, list[tuple[list[bytes], RunFigures]]] = {}
    for name, compactor in compactors.items():
        topic_dir = TopicDir(path / name)
        try:
            runs = []
            for number, part in enumerate(parts):
                topic_dir.append(part)
                figures = topic_dir.compact(compactor, delete_retention_ms=retention(number))
                runs.append((topic_dir.compacted_ledger(), figures))
            results[name] = runs
        finally:
            topic_dir.close()
    return results


def pyspark_home() -> str:
    """Where the PySpark distribution (bin/, jars/) is installed."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def published_compacted_ledger(path: Path) -> tuple[Position, list[bytes]]:
    """The horizon and the entries of the compacted view published in the (stopped) data
    dir at ``path`` (its ledgers' entries concatenated, from the manifest), read without
    opening it for writing."""
    from compactor.spark.source import topic_state
    from ledger.storage.file import FileLedgerStore

    _, snapshot = topic_state(str(path), TOPIC, read_compacted=True)
    assert snapshot is not None
    store = FileLedgerStore(str(path / "ledgers"), sync=SyncPolicy.NONE, read_only=True)
    try:
        entries = []
        for ledger_id in snapshot.ledger_ids:
            last = store.last_add_confirmed(ledger_id)
            entries.extend(store.read(ledger_id, 0, last) if last >= 0 else [])
        return snapshot.horizon, entries
    finally:
        store.shutdown()


COMPACTD_NAMES = frozenset({"ledger", "message", "cursor", "compactor", "api", "bench"})


def bare_interpreter(directory: Path, *, hidden: Iterable[str] = ()) -> Path:
    """A Python interpreter that sees every installed package but compactd and ``hidden``.

    The same Python started with ``-S`` (no site processing, so no ``.pth`` file, hence no
    editable install of compactd), a ``PYTHONPATH`` of only a directory of links to the
    site-packages entries other than compactd's packages, install hooks and ``hidden``
    (top-level names), started in an empty directory and ignoring the ``PYTHONPATH`` Spark
    hands it (``python -m`` puts the working directory on ``sys.path``).
    """
    hide = COMPACTD_NAMES | set(hidden)
    visible = directory / "site"
    visible.mkdir(parents=True)
    for packages in site.getsitepackages():
        for entry in sorted(os.listdir(packages)):
            name = entry.split(".")[0].split("-")[0]
            concealed = (entry in hide or name in hide or entry.startswith(("__editable__", "compactd"))
                         or entry.endswith(".pth"))
            if not concealed and not (visible / entry).exists():
                (visible / entry).symlink_to(os.path.join(packages, entry))
    (directory / "cwd").mkdir()
    script = directory / "bare-python"
    script.write_text(f'#!/bin/sh\ncd "{directory / "cwd"}" || exit 1\n'
                      f'PYTHONPATH="{visible}" exec "{sys.executable}" -S "$@"\n')
    script.chmod(0o755)
    return script
