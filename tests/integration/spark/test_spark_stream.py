"""The ``compactd`` data source as a stream (issue 13, point 6): snapshot, then the live tail.

The planning steps (``next_end``, ``tail_ranges``) are checked as properties: batches
taken one after the other from any start cover every entry after it exactly once, in
order, each within the read limit. On Spark ``local[2]`` (one session for the module), a
query into the memory sink gets the compacted snapshot and then the raw tail, the open
ledger included, while the data dir is locked by its owner, appended to and compacted
again (the query goes on after its position); a limited query cuts the tail into batches
of at most the limit; ``latest`` and ``startingTime``
start where they say.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from hypothesis import given
from hypothesis import strategies as st

from compactor.runs.runner import Compactor
from compactor.spark import SparkEngine
from compactor.spark.stream import next_end, tail_ranges
from ledger.position import Position
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.integration.spark.support import NOW_S, TopicDir, local_messages, spark_rows

BASE_MS = int(NOW_S * 1000)

ledgers_strategy = st.lists(st.integers(min_value=-1, max_value=6), max_size=6).map(
    lambda lasts: [(ledger_id + 1, last) for ledger_id, last in enumerate(lasts)])


@given(ledgers=ledgers_strategy, limit=st.none() | st.integers(min_value=1, max_value=5), data=st.data())
def test_batches_cover_every_entry_after_the_start_once_in_order_within_the_limit(
    ledgers: list[tuple[int, int]], limit: int | None, data: st.DataObject,
) -> None:
    every = [Position(ledger_id, entry) for ledger_id, last in ledgers for entry in range(last + 1)]
    first = start = data.draw(st.sampled_from([Position(-1, -1), *every]))
    read: list[Position] = []
    for _ in range(len(every) + 1):
        end = next_end(ledgers, start, limit)
        if end == start:
            break
        batch = [Position(r.ledger_id, e) for r in tail_ranges(ledgers, start, end)
                 for e in range(r.first_entry_id, r.last_entry_id + 1)]
        assert batch and batch[-1] == end
        assert limit is None or len(batch) <= limit
        read.extend(batch)
        start = end
    assert read == [position for position in every if position > first]
    assert next_end(ledgers, start, limit) == start  # nothing left


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    engine = SparkEngine("local[2]")
    yield engine.session()  # compactor.spark.register(session) done
    engine.stop()


def _message(index: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=BASE_MS + index,
                                  partition_key=f"k{index % 3}")
    return encode_entry(metadata, b"v%d" % index, with_checksum=True)


def _query(spark: Any, name: str, data_dir: Path, **options: str) -> Any:
    reader = spark.readStream.format("compactd").option("dataDir", str(data_dir)).option("topic", "spark-topic")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().writeStream.format("memory").queryName(name).start()


@pytest.mark.slow
@pytest.mark.integration
def test_a_stream_reads_the_snapshot_then_the_live_tail_in_limited_batches(spark: Any, tmp_path: Path) -> None:
    topic_dir = TopicDir(tmp_path / "data", entries_per_ledger=4)  # holds the lock: a running broker
    query = None
    try:
        topic_dir.append(_message(index) for index in range(10))
        topic_dir.compact(Compactor())
        topic_dir.append(_message(index) for index in range(10, 15))  # raw tail, partly in the open ledger
        query = _query(spark, "snapshot_then_tail", tmp_path / "data", maxEntriesPerTrigger="2")
        query.processAllAvailable()
        expected = local_messages(topic_dir, read_compacted=True, include_open_ledger=True)
        assert spark_rows(spark.table("snapshot_then_tail")) == expected
        assert len(expected) == 3 + 5  # the snapshot keeps one message a key (3 keys), then the tail

        topic_dir.compact(Compactor())  # a new snapshot: the running query goes on from where it is
        topic_dir.append(_message(index) for index in range(15, 18))  # live appends
        query.processAllAvailable()
        appended = [row for row in local_messages(topic_dir, read_compacted=False, include_open_ledger=True)
                    if row[5] >= BASE_MS + 15]
        assert spark_rows(spark.table("snapshot_then_tail")) == expected + appended
        assert len(appended) == 3
        sizes = [progress["numInputRows"] for progress in query.recentProgress if progress["numInputRows"]]
        assert sizes[0] == 3  # the snapshot, whole
        assert max(sizes[1:]) <= 2 and sum(sizes[1:]) == 5 + 3
    finally:
        if query is not None:
            query.stop()
        topic_dir.close()


@pytest.mark.slow
@pytest.mark.integration
def test_latest_and_starting_time_start_where_they_say(spark: Any, tmp_path: Path) -> None:
    topic_dir = TopicDir(tmp_path / "data", entries_per_ledger=4)
    queries = []
    try:
        topic_dir.append(_message(index) for index in range(6))
        topic_dir.compact(Compactor())
        queries.append(_query(spark, "from_latest", tmp_path / "data", startingOffsets="latest"))
        queries.append(_query(spark, "from_time", tmp_path / "data", startingTime=str(BASE_MS + 4)))
        for query in queries:
            query.processAllAvailable()
        assert spark.table("from_latest").count() == 0
        topic_dir.append(_message(index) for index in range(6, 8))
        for query in queries:
            query.processAllAvailable()
        latest = spark.table("from_latest").orderBy("ledger_id", "entry_id").collect()
        assert [row.publish_time - BASE_MS for row in latest] == [6, 7]
        timed = spark.table("from_time").orderBy("ledger_id", "entry_id").collect()
        assert [row.publish_time - BASE_MS for row in timed] == [4, 5, 6, 7]
    finally:
        for query in queries:
            query.stop()
        topic_dir.close()
