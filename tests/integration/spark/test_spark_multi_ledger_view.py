"""The ``compactd`` data source over a compacted view of several ledgers (issue 13, point 1),
on Spark ``local[2]``: a batch read and a stream read with ``readCompacted`` give what the
local reader sees, every ledger of the view in stream order (empty ones included in the
view, left out of the partitions), then the raw tail.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from compactor.runs.runner import Compactor
from compactor.spark import SparkEngine
from compactor.view.view import CompactedView, encode_compacted_entry
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.integration.spark.support import NOW_S, TopicDir, local_messages, spark_rows

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BASE_MS = int(NOW_S * 1000)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    engine = SparkEngine("local[2]")
    yield engine.session()  # compactor.spark.register(session) done
    engine.stop()


def message(index: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=BASE_MS + index,
                                  partition_key=f"k{index * 5 % 11}")
    return encode_entry(metadata, b"v%d" % index, with_checksum=True)


def split_view(topic_dir: TopicDir, cuts: tuple[int, ...]) -> CompactedView:
    """Publish the topic's compacted entries again as several ledgers."""
    view = topic_dir.topic.view
    assert view is not None
    entries = list(view.iter_all())
    ledger_ids = []
    for first, end in itertools.pairwise([0, *cuts, len(entries)]):
        ledger_id = topic_dir.data_dir.ledgers.create({"component": "compacted-ledger"})
        for entry in entries[first:end]:
            topic_dir.data_dir.ledgers.append(ledger_id, encode_compacted_entry(entry)).result(timeout=10)
        topic_dir.data_dir.ledgers.close(ledger_id)
        ledger_ids.append(ledger_id)
    return Compactor()._publish(topic_dir.topic, topic_dir.topic.cursor, view.horizon, ledger_ids, view)


def test_batch_and_stream_reads_of_a_view_of_several_ledgers(spark: Any, tmp_path: Path) -> None:
    topic_dir = TopicDir(tmp_path / "data", entries_per_ledger=4)  # holds the lock: a running broker
    query = None
    try:
        topic_dir.append(message(index) for index in range(30))
        topic_dir.compact(Compactor())
        view = split_view(topic_dir, cuts=(3, 3, 7))
        assert len(view.ledger_ids) == 4 and view.entries == 11
        topic_dir.append(message(index) for index in range(30, 36))  # a raw tail, partly open

        frame = (spark.read.format("compactd").option("dataDir", str(tmp_path / "data"))
                 .option("topic", "spark-topic").option("readCompacted", "true").load())
        expected = local_messages(topic_dir, read_compacted=True)
        assert spark_rows(frame) == expected
        assert [row[2:4] for row in expected[:11]] == [
            (entry.position.ledger_id, entry.position.entry_id) for entry in view.iter_all()]
        raw_ledgers = {row[2] for row in expected[11:]}  # the raw tail's ledgers, the open one's confirmed part too
        assert frame.rdd.getNumPartitions() == 3 + len(raw_ledgers)  # the empty ledger is no partition

        stream = (spark.readStream.format("compactd").option("dataDir", str(tmp_path / "data"))
                  .option("topic", "spark-topic").load())
        query = stream.writeStream.format("memory").queryName("multi_ledger_view").start()
        query.processAllAvailable()
        assert spark_rows(spark.table("multi_ledger_view")) == local_messages(
            topic_dir, read_compacted=True, include_open_ledger=True)
    finally:
        if query is not None:
            query.stop()
        topic_dir.close()
