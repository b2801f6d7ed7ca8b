"""The Spark readers plan the compacted snapshot from the manifest: every ledger of the
view in stream order, and a snapshot planned before a publish stays readable through the
grace period (issue 13, points 1 and 6). Planning only: no SparkSession is started (the
reads themselves are ``tests/integration/spark``'s)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from compactor.engine import LedgerRange
from compactor.local.algorithm import CompactedEntry, compact
from compactor.runs.runner import Compactor, sweep_compacted_garbage
from compactor.spark import rows
from compactor.spark.source import plan_ranges, topic_state
from compactor.spark.stream import EARLIEST, StreamReader
from compactor.view.topic import CompactedTopic
from compactor.view.view import CompactedView, encode_compacted_entry
from cursor import CursorStore
from ledger import DataDir, ManagedLedger, ManagedLedgerConfig, Position
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/spark-manifest"
NOW_S = 1_700_000_000.0
GRACE_S = 60.0


def message(index: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=1_000 + index,
                                  partition_key=f"k{index % 6}")
    return encode_entry(metadata, b"v%d" % index, with_checksum=False)


class Topic:
    """A topic in a locked data dir (a running broker) whose views are published split."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now_s = NOW_S
        self.data_dir = DataDir.open(str(path))
        self.ledger = ManagedLedger.open(TOPIC, self.data_dir.ledgers, self.data_dir.metadata,
                                         ManagedLedgerConfig(max_entries_per_ledger=4))
        self.topic = CompactedTopic.restore(self.ledger, CursorStore(self.data_dir.database), create_cursor=True,
                                            grace_period_s=GRACE_S, clock=lambda: self.now_s)
        self.appended = 0

    def append(self, count: int) -> Position:
        for index in range(self.appended, self.appended + count):
            self.ledger.append(message(index)).result(timeout=10)
        self.appended += count
        return self.ledger.last_confirmed_position()

    def publish_split(self, cuts: tuple[int, ...]) -> CompactedView:
        stop = self.ledger.last_confirmed_position()
        raw = self.ledger.read_entries(self.ledger.first_position(), 10_000)
        entries = compact(raw)
        ledger_ids = []
        for first, end in itertools.pairwise([0, *cuts, len(entries)]):
            ledger_id = self.data_dir.ledgers.create({"component": "compacted-ledger"})
            for entry in entries[first:end]:
                self.data_dir.ledgers.append(ledger_id, encode_compacted_entry(entry)).result(timeout=10)
            self.data_dir.ledgers.close(ledger_id)
            ledger_ids.append(ledger_id)
        return Compactor()._publish(self.topic, self.topic.cursor, stop, ledger_ids, self.topic.view)

    def close(self) -> None:
        self.ledger.close()
        self.data_dir.close()


@pytest.fixture
def topic(tmp_path: Path) -> Iterator[Topic]:
    opened = Topic(tmp_path / "data")
    yield opened
    opened.close()


def read(data_dir: Path, pieces: list[LedgerRange]) -> list[CompactedEntry]:
    store = rows.open_store(rows.ledgers_root_of(str(data_dir)))
    try:
        return [entry for piece in pieces for entry in rows.read_range(store, piece)]
    finally:
        store.shutdown()


def test_a_batch_read_plans_every_ledger_of_the_view_in_order_then_the_raw_tail(topic: Topic) -> None:
    topic.append(13)
    view = topic.publish_split(cuts=(2, 2, 4))
    topic.append(5)  # a raw tail: one sealed ledger, and the open one
    records, snapshot = topic_state(str(topic.path), TOPIC, read_compacted=True)
    assert snapshot is not None and snapshot.ledger_ids == view.ledger_ids and snapshot.horizon == view.horizon
    ranges = [piece for piece, _ in plan_ranges(str(topic.path), TOPIC, read_compacted=True, include_open_ledger=True)]
    compacted = [piece for piece in ranges if piece.compacted]
    assert [piece.ledger_id for piece in compacted] == [i for i, n in view.segments if n]  # the empty one left out
    assert read(topic.path, compacted) == list(view.iter_all())
    raw = topic.ledger.read_entries(topic.ledger.next_valid_position(view.horizon), 100)
    assert read(topic.path, [piece for piece in ranges if not piece.compacted]) == [
        CompactedEntry(entry.position, entry.data) for entry in raw]
    assert records


def test_a_stream_snapshot_names_its_ledgers_and_survives_a_later_publish_for_the_grace_period(
    topic: Topic,
) -> None:
    topic.append(11)
    old = topic.publish_split(cuts=(3, 3))
    reader = StreamReader(str(topic.path), TOPIC, {}, topic_state)
    start = reader.initialOffset()
    assert start == EARLIEST
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end["snapshot"] == old.ledger_id and end["snapshotLedgers"] == list(old.ledger_ids)

    topic.append(6)
    topic.publish_split(cuts=(1,))  # a new view: the old one's ledgers are garbage now
    pieces = [partition.value[0] for partition in reader.partitions(start, end)]  # the batch, (re)planned
    assert [piece.ledger_id for piece in pieces] == [i for i, n in old.segments if n]
    assert read(topic.path, pieces) == list(old.iter_all())  # whole, during the grace period

    topic.now_s += GRACE_S + 1
    assert sorted(sweep_compacted_garbage(topic.data_dir, now_ms=int(topic.now_s * 1000))) == sorted(old.ledger_ids)
    tail = reader.latestOffset(end, reader.getDefaultReadLimit())
    assert "snapshotLedgers" not in tail and tail["snapshot"] == -1
