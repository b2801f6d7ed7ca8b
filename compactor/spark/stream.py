"""The ``compactd`` data source as a stream: the compacted snapshot, then the live tail.

``spark.readStream.format("compactd")`` (after ``compactor.spark.register(spark)``) takes
``dataDir`` and ``topic`` as the batch reader does and gives the same rows
(``rows.MESSAGE_SCHEMA_DDL``) as micro-batches:

* ``startingOffsets`` ``"earliest"`` (default): the first micro-batch is the published
  compacted snapshot (the compacted view's ledgers, whole, in the manifest's order, up to
  its horizon; none when the topic was never compacted), then the raw entries after the
  horizon; ``"latest"``: only entries
  appended after the query started. ``startingTime`` (ms since the epoch; overrides
  ``startingOffsets``): the raw entries from the first one published at or after it (no
  snapshot).
* The tail is every raw ledger after the last offset, the open one included up to its
  last confirmed entry, so messages show up while the broker appends them.
* ``maxEntriesPerTrigger``: at most that many raw entries per micro-batch (an entry is one
  message or one batch of messages); the snapshot batch is always read whole. Spark's
  ``Trigger.AvailableNow`` and ``processAllAvailable`` read everything there is.

An offset is ``{"ledger": L, "entry": E, "snapshot": C}``: every entry at or before
position (L, E) was delivered; ``C`` >= 0 marks the batch ending there as the snapshot of
the compacted view whose first ledger is ``C`` (its ledgers, in order, are the offset's
``"snapshotLedgers"``; an offset without them names the one ledger ``C``), -2 an earliest
query's start (the snapshot is still to be read), -1 any other offset. A batch's input is
fixed by its two offsets (a task retry or a restarted query reads the same entries): the
snapshot names its compacted ledgers and the raw entries never change once confirmed. A
later compaction publishes a new view; the query keeps the one it started from for its
snapshot batch, which stays readable for the broker's grace period
(``compacted_ledger_grace_period_s``, ``compactor.view.manifest``) and reads the raw ledgers
after it.

``next_end`` and ``tail_ranges`` are the pure planning steps over the topic's readable
ledgers (``(ledger_id, last_entry_id)`` pairs, in order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from compactor.engine import LedgerRange
from compactor.errors import CompactorError, MalformedEntryError
from compactor.spark import rows
from compactor.view.marks import LedgerMarks
from ledger.errors import LedgerNotFoundError
from ledger.position import Position
from ledger.storage.object_fs import BucketConfig
from message.entry import parse_entry

__all__ = ["StreamReader", "next_end", "offset", "tail_ranges"]

Ledgers = Sequence[tuple[int, int]]
TopicState = Callable[..., tuple[list[Any], Any]]  # compactor.spark.source.topic_state
EARLIEST = {"ledger": -1, "entry": -1, "snapshot": -2}


def offset(position: Position, snapshot: Sequence[int] = ()) -> dict[str, Any]:
    """The offset after ``position``; ``snapshot``: the ledgers of the compacted view the
    batch ending there reads (see the module docstring)."""
    if not snapshot:
        return {"ledger": position.ledger_id, "entry": position.entry_id, "snapshot": -1}
    return {"ledger": position.ledger_id, "entry": position.entry_id, "snapshot": snapshot[0],
            "snapshotLedgers": list(snapshot)}


def _snapshot_ledgers(value: dict[str, Any]) -> list[int]:
    """The compacted ledgers an offset's batch reads (none when it is no snapshot)."""
    first = int(value.get("snapshot", -1))
    if first < 0:
        return []
    return [int(ledger_id) for ledger_id in value.get("snapshotLedgers", [first])]


def _position(value: dict[str, Any]) -> Position:
    return Position(int(value["ledger"]), int(value["entry"]))


def next_end(ledgers: Ledgers, start: Position, limit: int | None) -> Position:
    """The last position of the next batch after ``start``: at most ``limit`` entries
    (None: all there are); ``start`` itself when there is nothing new."""
    end, left = start, limit
    for ledger_id, last in ledgers:
        if ledger_id < start.ledger_id or last < 0:
            continue
        first = start.entry_id + 1 if ledger_id == start.ledger_id else 0
        if first > last:
            continue
        if left is not None:
            if left <= 0:
                break
            last = min(last, first + left - 1)
            left -= last - first + 1
        end = Position(ledger_id, last)
    return end


def tail_ranges(ledgers: Ledgers, start: Position, end: Position) -> list[LedgerRange]:
    """The raw ranges after ``start`` up to ``end`` (both positions of ``ledgers``)."""
    ranges = []
    for ledger_id, last in ledgers:
        if ledger_id < start.ledger_id or ledger_id > end.ledger_id:
            continue
        first = start.entry_id + 1 if ledger_id == start.ledger_id else 0
        last = min(last, end.entry_id) if ledger_id == end.ledger_id else last
        if first <= last:
            ranges.append(LedgerRange(ledger_id, first, last))
    return ranges


class _Topic:
    """What a planning step reads of the data dir (read-only, no lock); ``topic_state`` is
    ``compactor.spark.source.topic_state`` (the one reader of the ``__compaction`` row)."""

    def __init__(self, data_dir: str, topic: str, topic_state: TopicState, bucket: BucketConfig | None = None) -> None:
        self.data_dir, self.topic, self.topic_state, self.bucket = data_dir, topic, topic_state, bucket

    def state(self) -> tuple[list[tuple[int, int]], tuple[int, ...], Position]:
        """The readable ledgers, the published compacted view's ledgers (none: never
        compacted) and its horizon."""
        records, snapshot = self.topic_state(self.data_dir, self.topic, read_compacted=True)
        store = rows.open_store(rows.ledgers_root_of(self.data_dir), self.bucket)
        try:
            ledgers = []
            for record in records:
                try:
                    last = store.last_add_confirmed(record.ledger_id) if record.is_open else record.entries - 1
                except LedgerNotFoundError:  # an open ledger not created on disk yet
                    continue
                ledgers.append((record.ledger_id, last))
        finally:
            store.shutdown()
        if snapshot is None:
            return ledgers, (), Position(-1, -1)
        return ledgers, tuple(snapshot.ledger_ids), snapshot.horizon

    def marks(self) -> dict[int, LedgerMarks]:
        """The dead marks of the published view's ledgers (``compactor.view.marks``), read
        when a batch of the snapshot is planned: a ledger's marks only grow, each naming
        messages the tail after the snapshot's horizon supersedes."""
        _, snapshot = self.topic_state(self.data_dir, self.topic, read_compacted=True)
        return {} if snapshot is None else dict(snapshot.marks)

    def before_time(self, ledgers: Ledgers, time_ms: int) -> Position:
        """The position just before the first raw entry published at or after ``time_ms``
        (a scan of the entries' metadata, ledger by ledger)."""
        store = rows.open_store(rows.ledgers_root_of(self.data_dir), self.bucket)
        try:
            previous = Position(-1, -1)
            for ledger_range in tail_ranges(ledgers, Position(-1, -1), Position(1 << 62, 1 << 62)):
                for entry in rows.read_range(store, ledger_range):
                    try:
                        published = parse_entry(entry.data).metadata.publish_time
                    except MalformedEntryError:
                        published = -1
                    if published >= time_ms:
                        return previous
                    previous = entry.position
            return previous
        finally:
            store.shutdown()


class StreamReader(DataSourceStreamReader):
    """The stream reader of the ``compactd`` format (see the module docstring)."""

    def __init__(self, data_dir: str, topic: str, options: dict[str, str], topic_state: TopicState) -> None:
        self.source = _Topic(data_dir, topic, topic_state, rows.bucket_option(options))
        self.starting = options.get("startingoffsets", "earliest").strip().lower()
        if self.starting not in ("earliest", "latest"):
            raise CompactorError(f"option startingOffsets: {self.starting!r} is not earliest or latest")
        self.starting_time = _number(options, "startingtime")
        self.max_entries = _number(options, "maxentriespertrigger")
        if self.max_entries is not None and self.max_entries < 1:
            raise CompactorError(f"option maxEntriesPerTrigger: {self.max_entries} is not a positive number")

    def initialOffset(self) -> dict[str, Any]:
        ledgers, _, _ = self.source.state()
        if self.starting_time is not None:
            return offset(self.source.before_time(ledgers, self.starting_time))
        if self.starting == "latest":
            return offset(next_end(ledgers, Position(-1, -1), None))
        return dict(EARLIEST)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_entries is None else ReadMaxRows(self.max_entries)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        ledgers, compacted, horizon = self.source.state()
        if start == EARLIEST and compacted:  # an earliest query's first batch: the snapshot
            return offset(horizon, compacted)
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = next_end(ledgers, _position(start), cap)
        return start if end == _position(start) else offset(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if start == end:
            return []
        snapshot = _snapshot_ledgers(end)
        if snapshot:
            store = rows.open_store(rows.ledgers_root_of(self.source.data_dir), self.source.bucket)
            try:
                pieces = rows.snapshot_ranges(store, snapshot)
            finally:
                store.shutdown()
            marks = self.source.marks()
            return [InputPartition((piece, marks.get(piece.ledger_id))) for piece in pieces]
        ledgers, _, _ = self.source.state()
        return [InputPartition((piece, None)) for piece in tail_ranges(ledgers, _position(start), _position(end))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition is None or partition.value is None:  # no range to read
            return
        ledger_range, marks = partition.value
        yield from rows.message_batches(rows.ledgers_root_of(self.source.data_dir), ledger_range, self.source.bucket,
                                        marks)


def _number(options: dict[str, str], name: str) -> int | None:
    value = options.get(name)
    if value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise CompactorError(f"option {name}: {value!r} is not a whole number") from None
