"""The Spark engine and the ``compactd`` data source on Spark ``local[2]`` (issue 7, points 2-4).

One SparkSession for the module (starting one costs seconds). Agreement: generated topics
(batches, tombstones, key-less messages, markers, undecodable entries, several runs with
and without young tombstones) compacted by the local and the Spark engines give identical
compacted ledgers — the same entries, byte for byte, hence the same message ids — and the
same figures. The data source gives exactly the messages the local reader sees, raw and
read-compacted, one partition per ledger, while the data dir is locked by its owner.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pytest

pytest.importorskip("pyspark")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.algorithm import PhaseOneResult
from compactor.engine import SPARK_DRIVER_BYTES_PER_KEY, LedgerRange, PhaseOneInput
from compactor.errors import SparkEngineError
from compactor.runner import CompactionConfig, Compactor
from compactor.spark import CompactdDataSource, SparkPhaseOne
from ledger.position import Position
from tests.integration.spark.support import NOW_S, TopicDir, local_messages, run_both, spark_rows
from tests.strategies import stream_entries

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EXAMPLES = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Parts appended between runs: a few entries each, so that a topic spans several ledgers
# of TopicDir's five entries and a run reads the previous compacted ledger.
parts_strategy = st.lists(stream_entries(max_size=12).map(lambda stream: [item.data for item in stream]),
                          min_size=1, max_size=3)


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkPhaseOne]:
    spark_engine = SparkPhaseOne("local[2]")
    spark_engine.session()
    yield spark_engine
    spark_engine.stop()


class CountingEngine:
    """The Spark engine, counting its runs (to see which engine ``auto`` chose)."""

    def __init__(self, inner: SparkPhaseOne, driver_bytes_per_key: int = SPARK_DRIVER_BYTES_PER_KEY) -> None:
        self.inner, self.runs = inner, 0
        self.driver_bytes_per_key = driver_bytes_per_key  # what auto weighs (compactor.engine)

    def phase_one(self, request: PhaseOneInput) -> PhaseOneResult:
        self.runs += 1
        return self.inner.phase_one(request)


def _figures(figures: Any) -> tuple[int, ...]:
    return (figures.ledger_id, figures.removed_events, figures.entries_read, figures.messages_read,
            figures.bytes_read, figures.entries_written, figures.bytes_written)


@EXAMPLES
@given(parts=parts_strategy, retain_null_key=st.booleans(),
       retentions=st.lists(st.sampled_from([0, 1]), min_size=3, max_size=3))
def test_local_and_spark_engines_write_identical_compacted_ledgers(
    engine: SparkPhaseOne, parts: list[list[bytes]], retain_null_key: bool, retentions: list[int],
) -> None:
    compactors = {
        name: Compactor(CompactionConfig(engine=name, retain_null_key=retain_null_key),  # type: ignore[arg-type]
                        clock=lambda: NOW_S, spark_engine=engine)
        for name in ("local", "spark")
    }
    with TemporaryDirectory() as directory:
        # deleteRetentionMs 1 makes every tombstone young: the entries' publish time is now.
        results = run_both(parts, Path(directory), compactors, retention=lambda run: retentions[run])

    for (local_ledger, local_figures), (spark_ledger, spark_figures) in zip(
            results["local"], results["spark"], strict=True):
        assert spark_ledger == local_ledger
        assert _figures(spark_figures) == _figures(local_figures)


def test_auto_moves_a_run_to_spark_only_where_spark_keeps_the_broker_within_the_budget(
    engine: SparkPhaseOne, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    data = [_message(f"key-{index % 3}", b"v%d" % index) for index in range(12)]
    outcomes = {}
    # (budget, what the engine brings back to the broker per key, runs on Spark): a roomy
    # budget stays local; 24 bytes (one key) needs local rounds, and Spark only takes over
    # when it keeps the keys off the broker.
    cases = {"roomy": (1 << 30, 0, 0), "collects": (24, SPARK_DRIVER_BYTES_PER_KEY, 0), "keeps": (24, 0, 1)}
    for name, (budget, driver_bytes, spark_runs) in cases.items():
        counting = CountingEngine(engine, driver_bytes)
        compactor = Compactor(CompactionConfig(engine="auto", memory_budget_bytes=budget),
                              spark_engine=counting)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="compactor.runner"):
            outcomes[name] = run_both([data], tmp_path / name, {"auto": compactor})["auto"]
        assert counting.runs == spark_runs, name
        assert ("phase one on the spark engine" in caplog.text) is bool(spark_runs)
    assert outcomes["roomy"][0][0] == outcomes["collects"][0][0] == outcomes["keeps"][0][0]
    assert len(outcomes["roomy"][0][0]) == 3


def _message(key: str | None, value: bytes) -> bytes:
    from compactor.encoder import encode_entry
    from compactor.proto import pulsar_api_pb2 as pb

    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=int(NOW_S * 1000))
    if key is not None:
        metadata.partition_key = key
    return encode_entry(metadata, value, with_checksum=True)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=parts_strategy)
def test_the_data_source_gives_what_the_local_reader_sees(engine: SparkPhaseOne, parts: list[list[bytes]]) -> None:
    spark = engine.session()
    spark.dataSource.register(CompactdDataSource)
    compactor = Compactor(CompactionConfig(), clock=lambda: NOW_S)
    with TemporaryDirectory() as directory:
        topic_dir = TopicDir(Path(directory) / "data")  # holds the lock: a running broker
        try:
            for part in parts:
                topic_dir.append(part)
                topic_dir.compact(compactor)
            topic_dir.append(parts[0])  # a raw tail after the horizon
            for read_compacted in (False, True):
                frame = (spark.read.format("compactd").option("dataDir", directory + "/data")
                         .option("topic", "spark-topic").option("readCompacted", str(read_compacted).lower())
                         .load())
                expected = local_messages(topic_dir, read_compacted=read_compacted)
                assert spark_rows(frame) == expected
        finally:
            topic_dir.close()


def test_one_partition_per_ledger_and_the_open_tail_on_request(engine: SparkPhaseOne, tmp_path: Path) -> None:
    spark = engine.session()
    topic_dir = TopicDir(tmp_path / "data", entries_per_ledger=4)
    try:
        topic_dir.append(_message(f"k{index % 5}", b"%d" % index) for index in range(14))  # 3 sealed + 2 open
        read = spark.read.format("compactd").option("dataDir", str(tmp_path / "data")).option("topic", "spark-topic")
        sealed = read.load()
        assert sealed.rdd.getNumPartitions() == 3
        assert spark_rows(sealed) == local_messages(topic_dir, read_compacted=False)
        assert sealed.count() == 12
        with_tail = read.option("includeOpenLedger", "true").load()
        assert with_tail.rdd.getNumPartitions() == 4
        assert spark_rows(with_tail) == local_messages(topic_dir, read_compacted=False, include_open_ledger=True)

        topic_dir.compact(Compactor())
        compacted = read.option("readCompacted", "true").load()
        assert sorted(row.key for row in compacted.collect()) == ["k0", "k1", "k2", "k3", "k4"]
        assert compacted.where("tombstone").count() == 0
    finally:
        topic_dir.close()



def test_a_failed_spark_job_is_a_retriable_spark_engine_error(engine: SparkPhaseOne, tmp_path: Path) -> None:
    request = PhaseOneInput(str(tmp_path / "no-ledgers"), (LedgerRange(1, 0, 0),), Position(1, 0))
    with pytest.raises(SparkEngineError, match="spark phase one failed") as caught:
        engine.phase_one(request)
    assert caught.value.retriable


def test_the_data_source_refuses_an_unknown_topic_or_missing_options(engine: SparkPhaseOne, tmp_path: Path) -> None:
    spark = engine.session()
    TopicDir(tmp_path / "data").close()
    with pytest.raises(Exception, match="not found in data dir"):
        spark.read.format("compactd").option("dataDir", str(tmp_path / "data")).option("topic", "nope").load().count()
    with pytest.raises(Exception, match="needs the options dataDir and topic"):
        spark.read.format("compactd").option("dataDir", str(tmp_path / "data")).load().count()
