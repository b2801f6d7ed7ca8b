"""A Spark run through a bucket killed at any step: each input ledger offloaded and recorded
or still local and whole, the old or the new view whole, orphan objects collected, and the
next run converges (issue 29, point 4): real Spark in local mode, real processes, a real
``filesystem`` bucket; the staging's retries through a faulty S3 endpoint.

Every case starts from a topic whose first view a Spark run published through the bucket
(several compacted ledgers, objects only; the raw input staged: offloaded and recorded,
local copies kept), with more updates after it; a copy of that data dir and bucket
compacted by the local engine is what the next view must be, byte for byte. Then a Spark
run over the bucket is killed:

* **staging** (``compactor.runs.bucket_input``), a child process killed -9
  (``staging_killed.py``): after the roll-over, nothing uploaded; while the second staged
  ledger's copy is written; after its upload and read-back, before its record; after its
  record;
* **executor task**: a group's task kills its own Python worker with SIGKILL while writing
  its ledger in its scratch directory, or after uploading it; on ``local[2,2]`` the retried
  attempt publishes (uploading the same object again);
* **commit**: ``SimulatedCrash`` at each fault point of the publish transaction
  (``crash_support.COMMIT_POINTS``), the process then "killed" in-process.

(The driver killed -9 in the middle of the job is ``test_spark_bucket``'s.) After each,
the data dir is opened afresh as at a start (``collect_orphans`` first): the view is the
previous one or the new one whole, served byte for byte from the bucket (its ledgers have
no local file); every sealed ledger of the topic is recorded offloaded with a whole object,
or whole locally (``tests.offload_checks``); ``Offloader.collect_orphan_objects`` with
the manifests' live ledgers (grace 0) removes exactly the objects no record and no
manifest references — those of the ledger whose record never came, or the dead run's
group ledgers — and nothing referenced; the next Spark run publishes the local engine's
view and leaves in the bucket exactly the offloaded ledgers' and the view's objects.

And staging meeting 503s and connection resets through ``tests.s3_fault_proxy`` in front of
the moto server, more than the S3 client's own tries: the staging's backoff
(``ledger.offload.retry_transient``, the Offloader's) carries the run through, which
publishes the local engine's view.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from compactor.runs.runner import CompactionConfig, Compactor
from compactor.spark import SparkEngine
from compactor.spark.rewrite import FAULT_ENV
from compactor.view.manifest import CompactedManifests
from ledger import SimulatedCrash
from ledger.offload import Offloader
from ledger.storage.bucket import parse_object_name
from ledger.storage.object_fs import BucketConfig
from tests.integration.spark.crash_support import (
    COMMIT_POINTS,
    ENTRIES_PER_LEDGER,
    FIRST,
    SECOND,
    SHUFFLE,
    Prepared,
    kill,
    ledger_files,
    restart,
    spark_compactor,
)
from tests.integration.spark.support import NOW_S, TOPIC, TopicDir, local_messages, object_ids
from tests.offload_checks import assert_offloaded_or_whole
from tests.s3_fault_proxy import Fault, FaultProxy
from tests.s3_server import AWS_ENV, S3Server

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CHILD_BOUND_S = 120  # a child that imports compactd, rolls over and uploads, on two busy cores
STAGING_POINTS = ["after-roll-over", "uploading", "after-upload", "after-record"]
S3_TRIES = 5  # the S3 client's own tries of one request (``ledger.storage.object_fs``)
RESETS = 2  # fewer than S3_TRIES: the client's own retries carry them


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkEngine]:
    # local[2,2]: two cores and a task may fail twice. The executors find the S3 test
    # server's dummy credentials in their environment, as on a real cluster, and write
    # their scratch ledgers under the test's directory.
    executor_env = {f"spark.executorEnv.{name}": value for name, value in AWS_ENV.items()}
    executor_env["spark.executorEnv.TMPDIR"] = str(tmp_path_factory.mktemp("scratch"))
    spark_engine = SparkEngine("local[2,2]", config={**SHUFFLE, **executor_env}, piece_entries=3, group_entries=9)
    spark_engine.session()
    yield spark_engine
    spark_engine.stop()


@dataclass(kw_only=True)
class InBucket(Prepared):
    """``Prepared`` whose view and staged input are in ``bucket`` (a directory)."""

    bucket: BucketConfig


def _bucket(path: Path) -> BucketConfig:
    return BucketConfig("filesystem", str(path))


@pytest.fixture(scope="module")
def template(engine: SparkEngine, tmp_path_factory: pytest.TempPathFactory) -> InBucket:
    """The prepared data dir and bucket, made once (a Spark run and a local one); each
    test copies them."""
    root = tmp_path_factory.mktemp("template")
    bucket = _bucket(root / "bucket")
    topic_dir = TopicDir(root / "spark", entries_per_ledger=ENTRIES_PER_LEDGER, bucket=bucket)
    try:
        topic_dir.append(FIRST)
        topic_dir.compact(spark_compactor(engine))
        view = topic_dir.topic.view
        assert view is not None and len(view.ledger_ids) > 1  # a view of several ledgers
        assert CompactedManifests(topic_dir.data_dir.database).in_bucket(TOPIC)
        topic_dir.append(SECOND)
        served = topic_dir.compacted_ledger()
        served_messages = local_messages(topic_dir, read_compacted=True, include_open_ledger=True)
    finally:
        topic_dir.close()
    shutil.copytree(root / "spark", root / "local")
    shutil.copytree(root / "bucket", root / "local-bucket")
    local = TopicDir(root / "local", entries_per_ledger=ENTRIES_PER_LEDGER, bucket=_bucket(root / "local-bucket"))
    try:
        local.ledger.roll_over_now()  # what the Spark run does first, by itself
        local.compact(Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S))
        expected = local.compacted_ledger()
        expected_messages = local_messages(local, read_compacted=True, include_open_ledger=True)
    finally:
        local.close()
    assert expected != served
    return InBucket(root / "spark", served, served_messages, view.ledger_ids, view.horizon, expected,
                    expected_messages, bucket=bucket)


@pytest.fixture
def prepared(template: InBucket, tmp_path: Path) -> InBucket:
    """A copy of the template's data dir and bucket in ``tmp_path`` (modification times kept)."""
    shutil.copytree(template.path, tmp_path / "spark")
    shutil.copytree(template.bucket.base, tmp_path / "bucket")
    return dataclasses.replace(template, path=tmp_path / "spark", bucket=_bucket(tmp_path / "bucket"))


@pytest.fixture
def fault(engine: SparkEngine) -> Iterator[Callable[[str], None]]:
    """Sets the rewrite's fault point in the Python workers' environment for the next jobs."""
    environment = engine.session().sparkContext.environment

    def arm(setting: str) -> None:
        environment[FAULT_ENV] = setting

    yield arm
    environment.pop(FAULT_ENV, None)


# -- what must hold after every kill ------------------------------------------------------


def _offloaded(topic_dir: TopicDir) -> set[int]:
    return {record.ledger_id for record in topic_dir.data_dir.metadata.topic_ledgers(TOPIC) if record.offloaded}


def _assert_serves_from_the_bucket(topic_dir: TopicDir, bucket: BucketConfig, entries: list[bytes],
                                   messages: list[tuple[object, ...]]) -> None:
    """The published view is ``entries`` byte for byte, read from its objects (no local
    file), read-compacted readers get ``messages``; every sealed ledger is offloaded and
    recorded or local and whole; the local files are the topic's ledgers alone, with no
    temporary file."""
    view = topic_dir.topic.view
    assert view is not None
    files, temporary = ledger_files(topic_dir.path)
    assert temporary == []
    assert files <= {record.ledger_id for record in topic_dir.ledger.ledger_list()}
    assert not files & set(view.ledger_ids)
    assert set(view.ledger_ids) <= object_ids(bucket)
    assert topic_dir.compacted_ledger() == entries
    assert local_messages(topic_dir, read_compacted=True, include_open_ledger=True) == messages
    assert_offloaded_or_whole(topic_dir.data_dir, bucket, TOPIC)


def _assert_previous_view_serves(topic_dir: TopicDir, prepared: InBucket) -> None:
    view = topic_dir.topic.view
    assert view is not None and view.ledger_ids == prepared.view_ledger_ids and view.horizon == prepared.horizon
    _assert_serves_from_the_bucket(topic_dir, prepared.bucket, prepared.served, prepared.served_messages)


def _collect_orphan_objects(topic_dir: TopicDir, bucket: BucketConfig, orphans: set[int]) -> None:
    """The collection (grace 0, with the manifests' live ledgers) removes the objects of
    exactly ``orphans``, and keeps every object a record or a manifest references."""
    live = CompactedManifests(topic_dir.data_dir.database).live_ledger_ids(int(NOW_S * 1000))
    assert not orphans & (_offloaded(topic_dir) | live)
    before = object_ids(bucket)
    assert orphans <= before
    offloader = Offloader(topic_dir.data_dir.ledgers, topic_dir.data_dir.metadata)
    try:
        removed = offloader.collect_orphan_objects(0, also_live=live)
    finally:
        offloader.shutdown()
    assert {parse_object_name(name) for name in removed} == orphans
    assert object_ids(bucket) == before - orphans


def _assert_converges(topic_dir: TopicDir, engine: SparkEngine, prepared: InBucket) -> None:
    """The next Spark run publishes the local engine's view; the bucket then holds the
    offloaded ledgers' objects and the view's, nothing else."""
    topic_dir.compact(spark_compactor(engine))
    _assert_serves_from_the_bucket(topic_dir, prepared.bucket, prepared.expected, prepared.expected_messages)
    view = topic_dir.topic.view
    assert view is not None
    assert object_ids(prepared.bucket) == _offloaded(topic_dir) | set(view.ledger_ids)


# -- staging killed -9 ----------------------------------------------------------------------


@pytest.mark.parametrize("point", STAGING_POINTS)
def test_a_run_killed_in_its_staging_leaves_each_ledger_offloaded_or_whole_and_the_next_run_converges(
    engine: SparkEngine, prepared: InBucket, point: str,
) -> None:
    topic_dir = TopicDir(prepared.path, entries_per_ledger=ENTRIES_PER_LEDGER, bucket=prepared.bucket)
    try:
        offloaded_before = _offloaded(topic_dir)
    finally:
        topic_dir.close()
    child = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("staging_killed.py")), str(prepared.path),
         prepared.bucket.to_url(), point],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3]),
                                                          os.environ.get("PYTHONPATH", "")])},
        capture_output=True, timeout=CHILD_BOUND_S, check=False)
    assert child.returncode == -signal.SIGKILL, child.stdout.decode() + child.stderr.decode()[-3000:]

    topic_dir, orphans = restart(prepared.path, bucket=prepared.bucket)
    try:
        assert orphans == []  # no local ledger is unreferenced: the roll-over's is the topic's
        _assert_previous_view_serves(topic_dir, prepared)
        offloaded = _offloaded(topic_dir)
        staged = offloaded - offloaded_before  # recorded by the killed run
        unrecorded = object_ids(prepared.bucket) - offloaded - set(prepared.view_ledger_ids)
        if point == "after-roll-over":
            assert staged == set() and unrecorded == set()
        elif point == "after-record":
            assert len(staged) == 2 and unrecorded == set()
        else:  # the second ledger's copy, whole or temporary, never recorded: an orphan
            assert len(staged) == 1 and len(unrecorded) == 1 and unrecorded.isdisjoint(offloaded)
        _collect_orphan_objects(topic_dir, prepared.bucket, unrecorded)
        _assert_converges(topic_dir, engine, prepared)
    finally:
        topic_dir.close()


# -- an executor task killed -------------------------------------------------------------


@pytest.mark.parametrize("point", ["writing", "written"])
def test_a_task_attempt_killed_writing_or_after_uploading_is_retried_and_the_run_publishes_from_the_bucket(
    engine: SparkEngine, fault: Callable[[str], None], prepared: InBucket, point: str,
) -> None:
    fault(f"1:1:{point}")  # attempt 0 of group 1 dies; attempt 1 succeeds
    topic_dir = TopicDir(prepared.path, entries_per_ledger=ENTRIES_PER_LEDGER, bucket=prepared.bucket)
    try:
        topic_dir.compact(spark_compactor(engine))
        _assert_serves_from_the_bucket(topic_dir, prepared.bucket, prepared.expected, prepared.expected_messages)
    finally:
        topic_dir.close()
    fault("")

    topic_dir, orphans = restart(prepared.path, bucket=prepared.bucket)
    try:
        assert orphans == []  # the replaced view's ledgers went at the publish (no grace period)
        _assert_serves_from_the_bucket(topic_dir, prepared.bucket, prepared.expected, prepared.expected_messages)
        _collect_orphan_objects(topic_dir, prepared.bucket, set())  # the retried group's object is the view's
        view = topic_dir.topic.view
        assert view is not None
        assert object_ids(prepared.bucket) == _offloaded(topic_dir) | set(view.ledger_ids)
    finally:
        topic_dir.close()


# -- the commit killed ----------------------------------------------------------------------


@pytest.mark.parametrize(("point", "published"), COMMIT_POINTS)
def test_a_crash_in_the_commit_of_a_bucket_run_leaves_the_old_or_the_new_view_whole_and_the_next_run_converges(
    engine: SparkEngine, prepared: InBucket, point: str, published: bool,
) -> None:
    topic_dir = TopicDir(prepared.path, entries_per_ledger=ENTRIES_PER_LEDGER, bucket=prepared.bucket)
    before = object_ids(prepared.bucket)
    new_ids: list[int] = []

    def crash(**_: object) -> None:
        # The run's group ledgers, all uploaded (the other new objects: the input it staged).
        topic_ledgers = {record.ledger_id for record in topic_dir.ledger.ledger_list()}
        new_ids.extend(sorted(object_ids(prepared.bucket) - before - topic_ledgers))
        raise SimulatedCrash(point)

    topic_dir.data_dir.database.fault_points[point] = crash
    try:
        with pytest.raises(SimulatedCrash):
            topic_dir.compact(spark_compactor(engine))
    finally:
        kill(topic_dir)
    assert len(new_ids) > 1

    topic_dir, orphans = restart(prepared.path, bucket=prepared.bucket)
    try:
        view = topic_dir.topic.view
        assert view is not None
        if published:  # the new view whole: an incremental run appends its ledgers to the previous view's
            assert list(view.ledger_ids) == [*prepared.view_ledger_ids, *new_ids]
            assert orphans == []
            _assert_serves_from_the_bucket(topic_dir, prepared.bucket, prepared.expected,
                                           prepared.expected_messages)
            _collect_orphan_objects(topic_dir, prepared.bucket, set())
        else:  # the old view whole; the run's group ledgers are objects nobody references
            assert orphans == []  # no local file of them: they were only ever objects
            _assert_previous_view_serves(topic_dir, prepared)
            _collect_orphan_objects(topic_dir, prepared.bucket, set(new_ids))
        _assert_converges(topic_dir, engine, prepared)
    finally:
        topic_dir.close()


# -- staging through a faulty S3 endpoint ------------------------------------------------------


def test_staging_that_meets_503s_and_resets_past_the_clients_tries_backs_off_and_publishes_the_local_engines_view(
    engine: SparkEngine, s3_server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    with FaultProxy(s3_server.endpoint) as proxy:
        bucket = s3_server.bucket(endpoint=proxy.endpoint, prefix="staging")
        on_spark = TopicDir(tmp_path / "spark", entries_per_ledger=ENTRIES_PER_LEDGER, bucket=bucket)
        on_local = TopicDir(tmp_path / "local", entries_per_ledger=ENTRIES_PER_LEDGER)
        try:
            for topic_dir in (on_spark, on_local):
                topic_dir.append(FIRST + SECOND)
            on_local.ledger.roll_over_now()  # what the Spark run does first, by itself
            on_local.compact(Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S))
            # As many 503s in a row as the S3 client tries one request: they fail an upload,
            # which only the staging's own backoff retries; then resets the client rides out.
            proxy.inject(Fault.STATUS, status=503, method="PUT", path=r"/ledgers/", times=S3_TRIES)
            proxy.inject(Fault.RESET, method="PUT", path=r"/ledgers/", times=RESETS)
            with caplog.at_level(logging.WARNING, logger="ledger.offload"):
                on_spark.compact(spark_compactor(engine))
            assert proxy.pending == 0
            assert (len(proxy.faults(Fault.STATUS)), len(proxy.faults(Fault.RESET))) == (S3_TRIES, RESETS)
            retried = [record.getMessage() for record in caplog.records if "retrying in" in record.getMessage()]
            assert len(retried) == 1 and retried[0].startswith("upload of ledger")

            assert CompactedManifests(on_spark.data_dir.database).in_bucket(TOPIC)
            assert on_spark.compacted_ledger() == on_local.compacted_ledger()
            assert local_messages(on_spark, read_compacted=True) == local_messages(on_local, read_compacted=True)
            sealed = [record for record in on_spark.ledger.ledger_list()[:-1] if record.entries]
            assert sealed and all(record.offloaded for record in sealed)
            assert_offloaded_or_whole(on_spark.data_dir, bucket, TOPIC)  # byte-identical copies
        finally:
            on_spark.close()
            on_local.close()
