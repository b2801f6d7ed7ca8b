"""The Spark engine through a bucket, on Spark ``local[2]`` (issue 29, point 3).

With object storage configured, a Spark run first rolls the topic over and offloads its
input (keeping the local copies), then its executors — given a ledger directory that does
not exist and the ``BucketConfig`` — read every input ledger and key index from the bucket
and upload each group's compacted ledger there; the broker publishes them with the manifest
recording that they live in the bucket, and serves the view from there. Agreement: over
two runs (each after more appends; the second reads the previous view, itself in the
bucket), the view's entries equal the local engine's over the same topic without a bucket
(ledgers named by their place), with the same figures; the view's ledgers have no local
file; the raw input is recorded offloaded and its local copies are kept (they follow the
deletion lag); after a restart the read-compacted rows are the local engine's still; the ``compactd``
data source given the ``bucket`` option reads the same rows from there. On
both drivers: a directory, and a bucket of the real S3 server on loopback.

Failures: a run whose group dies after uploading its ledger fails, deletes every reserved
ledger's object and leaves the previous view serving; a driver killed -9 in the middle of
the job (one group's ledger uploaded, another's task hanging in its writing) leaves the
previous view serving after a restart, and objects no ledger record or manifest names,
which the orphan collection (``Offloader.collect_orphan_objects`` with the manifests' live
ledgers) removes — only those; the next run converges on the local engine's view.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from compactor.engine import OutputLedgers, RewriteInput, RewriteResult
from compactor.errors import SparkEngineError
from compactor.runs.held import HeldLedgers
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.spark import SparkEngine
from compactor.spark.rewrite import FAULT_ENV
from compactor.view.manifest import CompactedManifests
from ledger.offload import Offloader
from ledger.storage.bucket import ledger_object_name, parse_object_name
from ledger.storage.object_fs import BucketConfig
from tests.integration.spark.support import (
    NOW_S,
    TOPIC,
    TopicDir,
    live_ledger_ids,
    local_messages,
    mixed_entries,
    object_ids,
    spark_rows,
)
from tests.integration.spark.test_spark_local import _named_by_place
from tests.s3_server import AWS_ENV

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DRIVER_TIMEOUT_S = 180.0  # a Spark start on two busy cores, then the job
FIGURES = ("removed_events", "entries_read", "messages_read", "bytes_read", "entries_written", "bytes_written",
           "keys_kept")


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkEngine]:
    # The executors find the test server's dummy credentials in their environment, as they
    # would find a real cluster's (the Python workers of a local session are started by a
    # JVM that may predate the S3 fixture, so they are handed to them explicitly).
    executor_env = {f"spark.executorEnv.{name}": value for name, value in AWS_ENV.items()}
    spark_engine = SparkEngine("local[2]", piece_entries=4, group_entries=10, config=executor_env)
    spark_engine.session()
    yield spark_engine
    spark_engine.stop()


def _objects(bucket: BucketConfig, names: list[str]) -> list[str]:
    import pyarrow.fs as pafs

    infos = bucket.open().get_file_info([f"{bucket.base}/{name}" for name in names])
    return [name for name, info in zip(names, infos, strict=True) if info.type == pafs.FileType.File]


def _place_named(topic_dir: TopicDir) -> list[bytes]:
    return _named_by_place(topic_dir.compacted_ledger(), [r.ledger_id for r in topic_dir.ledger.ledger_list()])


def _rows_by_place(topic_dir: TopicDir) -> list[tuple[object, ...]]:
    """What a read-compacted reader gets, each message's ledger id named by its place."""
    place = {record.ledger_id: index for index, record in enumerate(topic_dir.ledger.ledger_list())}
    return [(*row[:2], place[row[2]], *row[3:]) for row in local_messages(topic_dir, read_compacted=True)]


@pytest.mark.parametrize("driver", ["filesystem", "aws-s3"])
def test_a_spark_run_through_a_bucket_publishes_the_local_engines_view_from_the_bucket(
    engine: SparkEngine, driver: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    bucket = (BucketConfig("filesystem", str(tmp_path / "bucket")) if driver == "filesystem"
              else request.getfixturevalue("s3_bucket"))
    spark = Compactor(CompactionConfig(engine="spark"), spark_engine=engine, clock=lambda: NOW_S)
    local = Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S)
    on_spark, on_local = TopicDir(tmp_path / "spark", bucket=bucket), TopicDir(tmp_path / "local")
    try:
        for first, count in ((0, 23), (23, 14)):
            for topic_dir in (on_spark, on_local):
                topic_dir.append(mixed_entries(count, first))
            on_local.ledger.roll_over_now()  # what the Spark run does first, by itself
            spark_figures, local_figures = on_spark.compact(spark), on_local.compact(local)
            assert _place_named(on_spark) == _place_named(on_local)
            assert [getattr(spark_figures, name) for name in FIGURES] == \
                [getattr(local_figures, name) for name in FIGURES]

            view = on_spark.topic.view
            assert view is not None
            assert CompactedManifests(on_spark.data_dir.database).in_bucket(TOPIC)
            local_names = set(os.listdir(tmp_path / "spark" / "ledgers"))
            for ledger_id in view.ledger_ids:  # written by the executors into the bucket only
                assert f"{ledger_id:020d}.ledger" not in local_names
            assert _objects(bucket, [ledger_object_name(i) for i in view.ledger_ids]) == \
                [ledger_object_name(i) for i in view.ledger_ids]
            sealed = [r for r in on_spark.data_dir.metadata.topic_ledgers(TOPIC) if r.closed_at_ms and r.entries]
            assert sealed and all(record.offloaded for record in sealed)  # staged as any offload
            assert all(f"{record.ledger_id:020d}.ledger" in local_names for record in sealed)  # local copies kept
        expected = _rows_by_place(on_local)
        assert _rows_by_place(on_spark) == expected
        # The data source reads the view from the bucket too, given the bucket's location.
        frame = (engine.session().read.format("compactd").option("dataDir", str(tmp_path / "spark"))
                 .option("topic", TOPIC).option("readCompacted", "true").option("bucket", bucket.to_url())
                 .option("bucketEndpoint", bucket.endpoint or "").load())
        assert spark_rows(frame) == local_messages(on_spark, read_compacted=True)
    finally:
        on_spark.close()
        on_local.close()
        local.close()
    restarted = TopicDir(tmp_path / "spark", bucket=bucket)
    try:  # the view is read from the bucket after a restart too
        assert _rows_by_place(restarted) == expected
    finally:
        restarted.close()


# -- a run that fails, or whose driver is killed, with the bucket ------------------------


def _prepared(tmp_path: Path, bucket: BucketConfig, engine: SparkEngine) -> tuple[TopicDir, list[bytes], list[bytes]]:
    """A topic with a view published through ``bucket`` and updates after it; the view's
    entries, and what the next view must be (the local engine over the same topic)."""
    spark = Compactor(CompactionConfig(engine="spark"), spark_engine=engine, clock=lambda: NOW_S)
    local = Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S)
    on_spark, reference = TopicDir(tmp_path / "spark", bucket=bucket), TopicDir(tmp_path / "local")
    try:
        for topic_dir in (on_spark, reference):
            topic_dir.append(mixed_entries(23))
        reference.ledger.roll_over_now()
        on_spark.compact(spark)
        reference.compact(local)
        for topic_dir in (on_spark, reference):
            topic_dir.append(mixed_entries(14, 23))
        reference.ledger.roll_over_now()
        reference.compact(local)
        expected = _place_named(reference)
    finally:
        reference.close()
        local.close()
    return on_spark, on_spark.compacted_ledger(), expected


def test_a_run_whose_every_task_dies_after_uploading_leaves_no_object_and_the_previous_view(
    engine: SparkEngine, tmp_path: Path,
) -> None:
    bucket = BucketConfig("filesystem", str(tmp_path / "bucket"))
    topic_dir, served, expected = _prepared(tmp_path, bucket, engine)
    environment = engine.session().sparkContext.environment
    try:
        environment[FAULT_ENV] = "1:99:written"  # group 1's task dies once its ledger is uploaded (no retry)
        with pytest.raises(SparkEngineError):
            topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=engine, clock=lambda: NOW_S))
        environment.pop(FAULT_ENV)
        assert topic_dir.compacted_ledger() == served  # the previous view serves
        assert object_ids(bucket) <= live_ledger_ids(topic_dir)  # the reserved ledgers' objects were deleted
        topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=engine, clock=lambda: NOW_S))
        assert _place_named(topic_dir) == expected  # the next run converges
    finally:
        environment.pop(FAULT_ENV, None)
        topic_dir.close()


def test_a_driver_killed_mid_job_leaves_orphan_objects_that_the_collection_removes_and_the_next_run_converges(
    engine: SparkEngine, tmp_path: Path,
) -> None:
    bucket = BucketConfig("filesystem", str(tmp_path / "bucket"))
    topic_dir, served, expected = _prepared(tmp_path, bucket, engine)
    before = object_ids(bucket) | live_ledger_ids(topic_dir)
    topic_dir.close()  # the driver opens the data dir as the broker would
    driver_script = Path(__file__).with_name("bucket_driver.py")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", FAULT_ENV: "1:99:hang",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3]), os.environ.get("PYTHONPATH", "")])}
    log = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen([sys.executable, str(driver_script), str(tmp_path / "spark"), "local[2]",
                               bucket.to_url()], env=env, stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:  # group 0 uploads its ledger while group 1's task hangs in its writing: then kill -9
        deadline = time.monotonic() + DRIVER_TIMEOUT_S
        while not object_ids(bucket) - before:
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no compacted ledger uploaded in time"
            time.sleep(0.05)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(DRIVER_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(DRIVER_TIMEOUT_S)
        log.close()
    uploaded = object_ids(bucket) - before

    restarted = TopicDir(tmp_path / "spark", bucket=bucket)
    try:
        assert restarted.compacted_ledger() == served  # the previous view serves, from the bucket
        live = CompactedManifests(restarted.data_dir.database).live_ledger_ids(int(NOW_S * 1000))
        offloader = Offloader(restarted.data_dir.ledgers, restarted.data_dir.metadata)
        try:
            removed = offloader.collect_orphan_objects(0, also_live=live)
        finally:
            offloader.shutdown()
        assert {parse_object_name(name) for name in removed} == uploaded  # only the killed run's objects
        assert object_ids(bucket) <= live_ledger_ids(restarted)
        restarted.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=engine, clock=lambda: NOW_S))
        assert _place_named(restarted) == expected
    finally:
        restarted.close()


class _CollectingMidRun:
    """The Spark engine, with the broker's orphan collection (grace 0) run between the
    executors' uploads and the publish: what the broker's trim pass may do at any time."""

    def __init__(self, inner: SparkEngine, topic_dir: TopicDir) -> None:
        self.inner, self.topic_dir = inner, topic_dir
        self.driver_bytes_per_key = inner.driver_bytes_per_key
        self.held = HeldLedgers()  # the compactor's, once it exists
        self.removed: list[str] = []
        self.uploaded: set[int] = set()

    def compact(self, request: RewriteInput, ledgers: OutputLedgers) -> RewriteResult:
        result = self.inner.compact(request, ledgers)
        self.uploaded = set(result.ledger_ids)
        database = self.topic_dir.data_dir.database
        live = CompactedManifests(database).live_ledger_ids(int(NOW_S * 1000)) | self.held.ids()
        offloader = Offloader(self.topic_dir.data_dir.ledgers, self.topic_dir.data_dir.metadata)
        try:
            self.removed = offloader.collect_orphan_objects(0, also_live=live)
        finally:
            offloader.shutdown()
        return result


def test_the_orphan_collection_during_a_run_spares_what_the_run_holds_in_the_bucket(
    engine: SparkEngine, tmp_path: Path,
) -> None:
    bucket = BucketConfig("filesystem", str(tmp_path / "bucket"))
    topic_dir, reference = TopicDir(tmp_path / "spark", bucket=bucket), TopicDir(tmp_path / "local")
    collecting = _CollectingMidRun(engine, topic_dir)
    compactor = Compactor(CompactionConfig(engine="spark"), spark_engine=collecting, clock=lambda: NOW_S)
    collecting.held = compactor.held
    local = Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S)
    try:
        for tested in (topic_dir, reference):
            tested.append(mixed_entries(23, 0))
        reference.ledger.roll_over_now()
        topic_dir.compact(compactor)
        reference.compact(local)
        assert collecting.uploaded and collecting.removed == []  # the run's group ledgers were spared
        assert compactor.held.ids() == set()  # and released once published
        assert _place_named(topic_dir) == _place_named(reference)
        view = topic_dir.topic.view
        assert view is not None and set(view.ledger_ids) == collecting.uploaded
    finally:
        topic_dir.close()
        reference.close()
        local.close()
