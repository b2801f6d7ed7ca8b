"""The Spark engine and the ``compactd`` data source on Spark ``local[2]`` (issue 7, points 2-4;
issue 13, points 2 and 3).

One SparkSession for the module (starting one costs seconds). Agreement: generated topics
(batches, tombstones, key-less messages, chunked messages, markers, undecodable entries,
several runs with and without young tombstones) compacted by the local engine and by the
Spark engine — both phases on the executors, in several groups, each into its own
compacted ledger — publish the same compacted entries: the Spark engine's ledgers
concatenated equal the local engine's ledger, entry for entry and byte for byte (ledger
ids named by their place in the topic, as the engines allocate different numbers of
compacted ledger ids), with the same figures. The commit takes every group's report
exactly once: a missing or duplicated report fails the run, deletes the reserved ledgers
and leaves the previous view serving; the next run converges. The data source gives
exactly the messages the local reader sees, raw and read-compacted, one partition per
ledger, while the data dir is locked by its owner.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pytest

pytest.importorskip("pyspark")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.engine import LedgerRange, OutputLedgers, RewriteInput, RewriteResult
from compactor.errors import SparkEngineError
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.spark import CompactdDataSource, SparkEngine
from compactor.spark.engine import partition_keys
from compactor.spark.rewrite import GroupReport, GroupSpec
from compactor.view.view import CompactedEntry, decode_compacted_entry, encode_compacted_entry
from ledger.position import Position
from tests.integration.spark.support import NOW_S, TopicDir, local_messages, run_both, spark_rows
from tests.strategies import stream_entries

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EXAMPLES = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Parts appended between runs: a few entries each, so that a topic spans several ledgers
# of TopicDir's five entries and a run reads the previous compacted view.
parts_strategy = st.lists(stream_entries(max_size=12).map(lambda stream: [item.data for item in stream]),
                          min_size=1, max_size=3)


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkEngine]:
    # Pieces of 3 entries, groups of about 6: a run of a few dozen entries is rewritten in
    # several groups, each into its own compacted ledger.
    spark_engine = SparkEngine("local[2]", piece_entries=3, group_entries=6)
    spark_engine.session()
    yield spark_engine
    spark_engine.stop()


class CountingEngine:
    """The Spark engine, counting its runs (to see which engine ``auto`` chose)."""

    def __init__(self, inner: SparkEngine, driver_bytes_per_key: int = 0) -> None:
        self.inner, self.runs = inner, 0
        self.driver_bytes_per_key = driver_bytes_per_key  # what auto weighs (compactor.engine)

    def compact(self, request: RewriteInput, ledgers: OutputLedgers) -> RewriteResult:
        self.runs += 1
        return self.inner.compact(request, ledgers)


def _figures(figures: Any) -> tuple[int, ...]:
    return (figures.removed_events, figures.entries_read, figures.messages_read, figures.bytes_read,
            figures.entries_written, figures.bytes_written, figures.keys_kept)


def _named_by_place(entries: list[bytes], topic_ledgers: Sequence[int]) -> list[bytes]:
    """Compacted entries with each original ledger id replaced by its place among the
    topic's ledgers; everything else as stored."""
    place = {ledger_id: index for index, ledger_id in enumerate(topic_ledgers)}
    renamed = []
    for data in entries:
        entry = decode_compacted_entry(data)
        position = Position(place[entry.position.ledger_id], entry.position.entry_id)
        renamed.append(encode_compacted_entry(CompactedEntry(position, entry.data, entry.batch_size, entry.surviving)))
        assert encode_compacted_entry(entry) == data  # the renaming changes the id only
    return renamed


def _compact_both(
    parts: list[list[bytes]], directory: Path, compactors: dict[str, Compactor], retentions: list[int],
) -> dict[str, list[tuple[list[bytes], Any]]]:
    """``run_both``, each run's compacted entries named by place (``_named_by_place``)."""
    results: dict[str, list[tuple[list[bytes], Any]]] = {}
    for name, compactor in compactors.items():
        topic_dir = TopicDir(directory / name)
        try:
            runs = []
            for number, part in enumerate(parts):
                topic_dir.append(part)
                figures = topic_dir.compact(compactor, delete_retention_ms=retentions[number])
                topic_ledgers = [record.ledger_id for record in topic_dir.ledger.ledger_list()]
                runs.append((_named_by_place(topic_dir.compacted_ledger(), topic_ledgers), figures))
            results[name] = runs
        finally:
            topic_dir.close()
    return results


@EXAMPLES
@given(parts=parts_strategy, retain_null_key=st.booleans(),
       retentions=st.lists(st.sampled_from([0, 1]), min_size=3, max_size=3))
def test_the_spark_engine_publishes_the_local_engines_compacted_entries_byte_for_byte(
    engine: SparkEngine, parts: list[list[bytes]], retain_null_key: bool, retentions: list[int],
) -> None:
    # No merge step: it follows each engine's ledgers (Spark writes one per group), and the
    # figures compared below would count its writes on one side only.
    compactors = {
        name: Compactor(CompactionConfig(engine=name, retain_null_key=retain_null_key,  # type: ignore[arg-type]
                                         merge_fan_in=64, merge_dead_ratio=1.0),
                        clock=lambda: NOW_S, spark_engine=engine)
        for name in ("local", "spark")
    }
    with TemporaryDirectory() as directory:
        # deleteRetentionMs 1 makes every tombstone young: the entries' publish time is now.
        results = _compact_both(parts, Path(directory), compactors, retentions)

    for (local_ledger, local_figures), (spark_ledger, spark_figures) in zip(
            results["local"], results["spark"], strict=True):
        assert spark_ledger == local_ledger
        assert _figures(spark_figures) == _figures(local_figures)
        assert spark_figures.engine == ("spark" if spark_figures.ledger_id >= 0 else "")  # "": nothing to do


def test_a_run_is_rewritten_in_several_groups_each_into_its_own_ledger(engine: SparkEngine, tmp_path: Path) -> None:
    data = [_message(f"key-{index % 30}", b"v%d" % index) for index in range(40)]  # the first 10 rewritten
    local = run_both([data], tmp_path, {"local": Compactor(CompactionConfig(engine="local"))})["local"]
    topic_dir = TopicDir(tmp_path / "spark")
    try:
        topic_dir.append(data)
        figures = topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=engine))
        view = topic_dir.topic.view
        assert view is not None and len(view.ledger_ids) > 2  # several groups kept something
        assert figures.entries_written == 30
        assert all(entries for _, entries in view.segments)  # no empty ledger published
        assert topic_dir.compacted_ledger() == local[0][0]
        assert figures.ledger_id == view.ledger_ids[0]
        assert figures.keys_kept == 30
        files = sorted(int(name.split(".")[0]) for name in os.listdir(topic_dir.data_dir.ledgers.root)  # type: ignore[attr-defined]
                       if name.endswith(".ledger"))
        topic_ledgers = [record.ledger_id for record in topic_dir.ledger.ledger_list()]
        assert files == sorted(topic_ledgers + list(view.ledger_ids))  # the unused reserved ids left no file
    finally:
        topic_dir.close()


def test_every_group_gets_a_spark_partition_of_its_own(engine: SparkEngine) -> None:
    from pyspark.sql import functions as F

    spark = engine.session()
    for groups in (1, 2, 7, 64):
        keys = partition_keys(groups)
        frame = spark.createDataFrame([(key,) for key in keys], "key int")
        placed = [row[0] for row in frame.select(F.pmod(F.hash("key"), F.lit(groups))).collect()]
        assert placed == list(range(groups))


class KeepingPlans(SparkEngine):
    """The Spark engine, keeping the physical plan of each job it ran."""

    def __init__(self, inner: SparkEngine) -> None:
        super().__init__(inner.master, piece_entries=inner.piece_entries, group_entries=inner.group_entries)
        self._session = inner.session()
        self.plans: list[str] = []

    def _rewrite(self, request: RewriteInput, specs: Sequence[GroupSpec]) -> list[GroupReport]:
        job = self._job(request, specs)
        rows = job.collect()
        self.plans.append(job._jdf.queryExecution().executedPlan().toString())
        return [GroupReport.from_row(tuple(row)) for row in rows]


def test_phase_one_reaches_the_groups_through_the_shuffle_never_through_the_driver(
    engine: SparkEngine, tmp_path: Path,
) -> None:
    data = [_message(f"key-{index % 30}", b"v%d" % index) for index in range(40)]
    # Chunked messages: one replaced later (its chunks are dropped: the join that decides
    # it runs), one whose key is never written again (kept whole), one never completed.
    data[2:2] = [_chunk("u-1", "key-1", 0, 2), _chunk("u-2", "only", 0, 2)]
    data[5:5] = [_chunk("u-1", "key-1", 1, 2), _chunk("u-3", "open", 0, 3)]
    data[12:12] = [_chunk("u-2", "only", 1, 2)]
    keeping = KeepingPlans(engine)
    expected = _compact_both([data], tmp_path, {"local": Compactor(CompactionConfig(engine="local"))}, [0])
    topic_dir = TopicDir(tmp_path / "spark")
    try:
        topic_dir.append(data)
        topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=keeping))
        topic_ledgers = [record.ledger_id for record in topic_dir.ledger.ledger_list()]
        assert _named_by_place(topic_dir.compacted_ledger(), topic_ledgers) == expected["local"][0][0]
    finally:
        topic_dir.close()
    [plan] = keeping.plans
    final = plan.split("== Initial Plan ==")[0]
    assert "isFinalPlan=true" in final
    assert "SortMergeJoin" in final and "Broadcast" not in final  # no join side went through the driver
    assert "FlatMapGroupsInArrow" in final
    # one shuffle into the groups' partitions, by the slot that puts every group in its own
    assert final.count("Exchange hashpartitioning(slot") == 1 and "hashpartitioning(grp" not in final


def _chunk(uuid: str, key: str, chunk_id: int, chunks: int) -> bytes:
    from message.encoder import encode_entry
    from message.proto import pulsar_api_pb2 as pb

    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=int(NOW_S * 1000), uuid=uuid,
                                  chunk_id=chunk_id, num_chunks_from_msg=chunks, total_chunk_msg_size=chunks * 4,
                                  partition_key=key)
    return encode_entry(metadata, b"c%03d" % chunk_id, with_checksum=True)


class DroppingReports(SparkEngine):
    """The Spark engine whose job loses or repeats a group's report: a fault the real job
    cannot produce on demand (Spark keeps one attempt per partition)."""

    def __init__(self, inner: SparkEngine, fault: str) -> None:
        super().__init__(inner.master, piece_entries=inner.piece_entries, group_entries=inner.group_entries)
        self._session = inner.session()
        self.fault = fault
        self.reserved: list[int] = []

    def _rewrite(self, request: RewriteInput, specs: Sequence[GroupSpec]) -> list[GroupReport]:
        self.reserved = [spec.ledger_id for spec in specs]
        reports = super()._rewrite(request, specs)
        return reports[1:] if self.fault == "missing" else [*reports, reports[0]]

    def stop(self) -> None:  # the session is the module's
        pass


@pytest.mark.parametrize("fault", ["missing", "duplicate"])
def test_a_missing_or_repeated_group_report_fails_the_run_and_the_previous_view_keeps_serving(
    engine: SparkEngine, tmp_path: Path, fault: str,
) -> None:
    first = [_message(f"key-{index % 5}", b"a%d" % index) for index in range(20)]
    second = [_message(f"key-{index % 7}", b"b%d" % index) for index in range(20)]
    expected = _compact_both([first, second], tmp_path, {"local": Compactor(CompactionConfig(engine="local"))}, [0, 0])
    topic_dir = TopicDir(tmp_path / "spark")
    try:
        topic_dir.append(first)
        topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=engine))
        before, served = topic_dir.topic.view, topic_dir.compacted_ledger()
        topic_dir.append(second)
        faulty = DroppingReports(engine, fault)
        with pytest.raises(SparkEngineError, match="did not report" if fault == "missing" else "reported twice"):
            topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=faulty))
        assert topic_dir.topic.view is before
        assert topic_dir.compacted_ledger() == served
        root = topic_dir.data_dir.ledgers.root  # type: ignore[attr-defined]
        assert len(faulty.reserved) > 1
        assert not any(os.path.exists(os.path.join(root, f"{ledger_id:020d}.ledger")) for ledger_id in faulty.reserved)

        topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=engine))  # converges
        topic_ledgers = [record.ledger_id for record in topic_dir.ledger.ledger_list()]
        assert _named_by_place(topic_dir.compacted_ledger(), topic_ledgers) == expected["local"][1][0]
    finally:
        topic_dir.close()


def test_auto_moves_a_run_to_spark_only_where_one_local_round_would_not_do(
    engine: SparkEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    data = [_message(f"key-{index % 3}", b"v%d" % index) for index in range(12)]
    outcomes = {}
    # (budget, what the engine brings back to the broker per key, runs on Spark): a roomy
    # budget stays local; 24 bytes (one key) needs local rounds, and Spark takes over as
    # it keeps the keys off the broker; an engine that collected keys would not.
    cases = {"roomy": (1 << 30, 0, 0), "collects": (24, 77, 0), "keeps": (24, 0, 1)}
    for name, (budget, driver_bytes, spark_runs) in cases.items():
        counting = CountingEngine(engine, driver_bytes)
        compactor = Compactor(CompactionConfig(engine="auto", memory_budget_bytes=budget),
                              spark_engine=counting)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="compactor.runs.runner"):
            outcomes[name] = run_both([data], tmp_path / name, {"auto": compactor})["auto"]
        assert counting.runs == spark_runs, name
        assert ("phase one on the spark engine" in caplog.text) is bool(spark_runs)
    assert outcomes["roomy"][0][0] == outcomes["collects"][0][0] == outcomes["keeps"][0][0]
    assert len(outcomes["roomy"][0][0]) == 3


def _message(key: str | None, value: bytes) -> bytes:
    from message.encoder import encode_entry
    from message.proto import pulsar_api_pb2 as pb

    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=int(NOW_S * 1000))
    if key is not None:
        metadata.partition_key = key
    return encode_entry(metadata, value, with_checksum=True)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=parts_strategy)
def test_the_data_source_gives_what_the_local_reader_sees(engine: SparkEngine, parts: list[list[bytes]]) -> None:
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


def test_one_partition_per_ledger_the_open_tail_by_default_and_sealed_only_on_request(
    engine: SparkEngine, tmp_path: Path,
) -> None:
    spark = engine.session()
    topic_dir = TopicDir(tmp_path / "data", entries_per_ledger=4)
    try:
        topic_dir.append(_message(f"k{index % 5}", b"%d" % index) for index in range(14))  # 3 sealed + 2 open
        read = spark.read.format("compactd").option("dataDir", str(tmp_path / "data")).option("topic", "spark-topic")
        with_tail = read.load()
        assert with_tail.rdd.getNumPartitions() == 4
        assert spark_rows(with_tail) == local_messages(topic_dir, read_compacted=False)
        assert with_tail.count() == 14
        sealed = read.option("includeOpenLedger", "false").load()
        assert sealed.rdd.getNumPartitions() == 3
        assert spark_rows(sealed) == local_messages(topic_dir, read_compacted=False, include_open_ledger=False)
        assert sealed.count() == 12

        topic_dir.compact(Compactor())
        compacted = read.option("readCompacted", "true").load()
        assert sorted(row.key for row in compacted.collect()) == ["k0", "k1", "k2", "k3", "k4"]
        assert compacted.where("tombstone").count() == 0
    finally:
        topic_dir.close()



class NoLedgers:
    """An ``OutputLedgers`` that hands out ids and records deletions."""

    def __init__(self) -> None:
        self.deleted: list[int] = []

    def reserve_ids(self, count: int) -> list[int]:
        return list(range(100, 100 + count))

    def delete(self, ledger_id: int) -> None:
        self.deleted.append(ledger_id)


def test_a_failed_spark_job_is_a_retriable_spark_engine_error_and_frees_its_ids(
    engine: SparkEngine, tmp_path: Path,
) -> None:
    request = RewriteInput(str(tmp_path / "no-ledgers"), (LedgerRange(1, 0, 0),), Position(1, 0))
    ledgers = NoLedgers()
    with pytest.raises(SparkEngineError, match="spark rewrite failed") as caught:
        engine.compact(request, ledgers)
    assert caught.value.retriable
    assert ledgers.deleted == [100]


def test_the_data_source_refuses_an_unknown_topic_or_missing_options(engine: SparkEngine, tmp_path: Path) -> None:
    spark = engine.session()
    TopicDir(tmp_path / "data").close()
    with pytest.raises(Exception, match="not found in data dir"):
        spark.read.format("compactd").option("dataDir", str(tmp_path / "data")).option("topic", "nope").load().count()
    with pytest.raises(Exception, match="needs the options dataDir and topic"):
        spark.read.format("compactd").option("dataDir", str(tmp_path / "data")).load().count()
