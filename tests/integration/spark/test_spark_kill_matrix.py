"""A Spark run killed at any step leaves the previous view serving, and the next run
converges (issue 13, point 3): real Spark in local mode, real processes, real files.

Every case starts from a topic whose first view a Spark run published (several compacted
ledgers), with more updates after it; a copy of that data dir compacted by the local
engine is what the next view must be, byte for byte. Then a Spark run is killed:

* **driver**: ``compactd compact-topic --engine spark`` in a child process is killed -9
  while a group's task is in the middle of writing its ledger (held there by the test
  fault point of ``compactor.spark.rewrite``, so that the kill lands inside the job) and
  another group's ledger is already written;
* **executor task**: a group's task kills its own Python worker with SIGKILL (the same
  fault point) while writing or after writing its ledger. On ``local[2,2]`` (a task may
  fail twice) the retried attempt publishes; when every attempt dies the run fails;
* **commit**: ``SimulatedCrash`` at each fault point of the publish transaction
  (``ledger.database``), the process then "killed" as ``tests/unit/compactor/test_crash.py``
  does (nothing closed; the stores stop and the lock goes).

After each, the data dir is opened afresh as at a start (``collect_orphans`` first): the
view is the previous one or the new one whole, served byte for byte; no temporary file is
left, and the ledger files are exactly the topic's ledgers and the view's; the next Spark
run publishes what the local engine publishes.

A failed job is cleaned up only once its tasks have stopped: a task still running when
its stage failed could otherwise rename its ledger into place after the driver deleted
the reserved ledgers (``compactor.spark.engine._settled_on_failure``).

Two attempts of one group both writing (a retry after the first wrote: the ``written``
case here; a speculative copy) leave one complete ledger, byte for byte a single
attempt's (``tests/unit/compactor/test_spark_rewrite_attempts.py``); the commit sees one
report per group, as Spark keeps one successful attempt per partition, and refuses a
repeated one (``test_spark_local``,
``test_a_missing_or_repeated_group_report_fails_the_run_and_the_previous_view_keeps_serving``).

The test seam (``compactor.spark.rewrite.FAULT_ENV``) reaches the Python workers through
the SparkContext's ``environment`` (the workers of the module's session) or the child
driver's environment.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from compactor.errors import SparkEngineError
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.spark import SparkEngine
from compactor.spark.rewrite import FAULT_ENV
from ledger import SimulatedCrash
from ledger.storage.base import SyncPolicy
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
    tasks_running,
)
from tests.integration.spark.support import NOW_S, TOPIC, TopicDir, local_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# Bounds of the waits on the child driver: a Spark start on two busy cores, then the job.
DRIVER_WRITING_TIMEOUT_S = 180.0
PROCESS_EXIT_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkEngine]:
    # local[2,2]: two cores and a task may fail twice (plain local[2] never retries one).
    # Pieces of 3 entries, groups of about 9: a run is rewritten in several groups.
    # Few shuffle partitions: the topics are tiny, and each task costs on two busy cores.
    spark_engine = SparkEngine("local[2,2]", config=SHUFFLE, piece_entries=3, group_entries=9)
    spark_engine.session()
    yield spark_engine
    spark_engine.stop()


@pytest.fixture(scope="module")
def template(engine: SparkEngine, tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """The prepared data dir, made once (a Spark run and a local one); each test copies it."""
    return _prepare(engine, tmp_path_factory.mktemp("template"))


@pytest.fixture
def prepared(template: Prepared, tmp_path: Path) -> Prepared:
    """A copy of the template's data dir in ``tmp_path``: same ledger ids, same expectations."""
    shutil.copytree(template.path, tmp_path / "spark")
    return dataclasses.replace(template, path=tmp_path / "spark")


def _prepare(engine: SparkEngine, tmp_path: Path) -> Prepared:
    topic_dir = TopicDir(tmp_path / "spark", entries_per_ledger=ENTRIES_PER_LEDGER)
    try:
        topic_dir.append(FIRST)
        topic_dir.compact(spark_compactor(engine))
        view = topic_dir.topic.view
        assert view is not None and len(view.ledger_ids) > 1  # a view of several ledgers
        topic_dir.append(SECOND)
        served, served_messages = topic_dir.compacted_ledger(), local_messages(
            topic_dir, read_compacted=True, include_open_ledger=True)
    finally:
        topic_dir.close()
    shutil.copytree(tmp_path / "spark", tmp_path / "local")
    local = TopicDir(tmp_path / "local", entries_per_ledger=ENTRIES_PER_LEDGER)
    try:
        local.compact(Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S))
        expected, expected_messages = local.compacted_ledger(), local_messages(local, read_compacted=True, include_open_ledger=True)
    finally:
        local.close()
    assert expected != served
    return Prepared(tmp_path / "spark", served, served_messages, view.ledger_ids, view.horizon, expected,
                    expected_messages)


def _compacted_ledgers(path: Path, ledger_ids: set[int]) -> set[int]:
    """Those of ``ledger_ids`` that are compacted ledgers (their metadata says so), read
    without owning the directory."""
    from ledger.storage.file import FileLedgerStore

    store = FileLedgerStore(str(path / "ledgers"), sync=SyncPolicy.NONE, read_only=True)
    try:
        return {ledger_id for ledger_id in ledger_ids
                if store.info(ledger_id).metadata.get("component") == "compacted-ledger"}
    finally:
        store.shutdown()


def _assert_serves(topic_dir: TopicDir, entries: list[bytes], messages: list[tuple[object, ...]]) -> None:
    """The published view is ``entries`` byte for byte, read-compacted readers get
    ``messages``, and the ledger files are exactly the topic's and the view's."""
    view = topic_dir.topic.view
    assert view is not None
    assert topic_dir.compacted_ledger() == entries
    assert local_messages(topic_dir, read_compacted=True, include_open_ledger=True) == messages
    files, temporary = ledger_files(topic_dir.path)
    assert temporary == []
    assert files == {record.ledger_id for record in topic_dir.ledger.ledger_list()} | set(view.ledger_ids)


def _assert_previous_view_serves(topic_dir: TopicDir, prepared: Prepared) -> None:
    view = topic_dir.topic.view
    assert view is not None and view.ledger_ids == prepared.view_ledger_ids and view.horizon == prepared.horizon
    _assert_serves(topic_dir, prepared.served, prepared.served_messages)


def _assert_converges(topic_dir: TopicDir, engine: SparkEngine, prepared: Prepared) -> None:
    """The next Spark run publishes the local engine's view, and nothing is left over."""
    topic_dir.compact(spark_compactor(engine))
    _assert_serves(topic_dir, prepared.expected, prepared.expected_messages)


# -- the driver killed -----------------------------------------------------------------


def _compactd() -> list[str]:
    compactd = Path(sys.executable).parent / "compactd"
    return [str(compactd)] if compactd.exists() else [sys.executable, "-c", "from api.cli import main; main()"]


def _poll(condition: Callable[[], bool], timeout_s: float, what: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"the driver exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def _gone(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_driver_killed_in_the_middle_of_the_job_leaves_the_previous_view_and_the_next_run_converges(
    engine: SparkEngine, prepared: Prepared, tmp_path: Path,
) -> None:
    before, _ = ledger_files(prepared.path)
    # Group 1's task stops while writing (every attempt), so the job is in flight when
    # the driver dies; group 0's runs on the other core and writes its ledger.
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", FAULT_ENV: "1:99:hang",
           "PYSPARK_SUBMIT_ARGS": " ".join(f"--conf {key}={value}" for key, value in SHUFFLE.items()) + " pyspark-shell"}
    log = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen(
        [*_compactd(), "compact-topic", "--data-dir", str(prepared.path), "--topic", TOPIC, "--engine", "spark",
         "--spark-master", "local[2]"],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def writing() -> bool:
            files, temporary = ledger_files(prepared.path)
            return bool(temporary) and bool(_compacted_ledgers(prepared.path, files - before))

        _poll(writing, DRIVER_WRITING_TIMEOUT_S, "executor writing a reserved ledger and a temporary file", driver)
        files, temporary = ledger_files(prepared.path)
        os.kill(driver.pid, signal.SIGKILL)
        assert driver.wait(PROCESS_EXIT_TIMEOUT_S) == -signal.SIGKILL
        # Its JVM and Python workers follow it (they watch their parent's pipes); whatever
        # has not within the bound is killed with it, so nothing writes after the restart.
        deadline = time.monotonic() + PROCESS_EXIT_TIMEOUT_S
        while not _gone(driver.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if not _gone(driver.pid):
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(PROCESS_EXIT_TIMEOUT_S)
        log.close()
    written = _compacted_ledgers(prepared.path, files - before)
    assert written and temporary  # the kill landed inside the job

    topic_dir, orphans = restart(prepared.path)
    try:
        assert written <= set(orphans)  # the killed run's ledgers are unreferenced
        _assert_previous_view_serves(topic_dir, prepared)
        _assert_converges(topic_dir, engine, prepared)
    finally:
        topic_dir.close()


# -- an executor task killed ------------------------------------------------------------


@pytest.fixture
def fault(engine: SparkEngine) -> Iterator[Callable[[str], None]]:
    """Sets the fault point in the Python workers' environment for the next jobs."""
    environment = engine.session().sparkContext.environment

    def arm(setting: str) -> None:
        environment[FAULT_ENV] = setting

    yield arm
    environment.pop(FAULT_ENV, None)


@pytest.mark.parametrize("point", ["writing", "written"])
def test_a_task_attempt_killed_is_retried_and_the_run_publishes_the_local_engines_view(
    engine: SparkEngine, fault: Callable[[str], None], prepared: Prepared, point: str,
) -> None:
    fault(f"1:1:{point}")  # attempt 0 of group 1 dies; attempt 1 succeeds
    topic_dir = TopicDir(prepared.path, entries_per_ledger=ENTRIES_PER_LEDGER)
    try:
        topic_dir.compact(spark_compactor(engine))
        assert topic_dir.compacted_ledger() == prepared.expected
        assert local_messages(topic_dir, read_compacted=True, include_open_ledger=True) == prepared.expected_messages
        _, temporary = ledger_files(prepared.path)
    finally:
        topic_dir.close()
    # The attempt killed while writing left its temporary file (the retry wrote another
    # and renamed it); the one killed after writing, none (the retry replaced its ledger).
    assert len(temporary) == (1 if point == "writing" else 0)

    topic_dir, orphans = restart(prepared.path)
    try:
        assert orphans == []
        _assert_serves(topic_dir, prepared.expected, prepared.expected_messages)
    finally:
        topic_dir.close()


def test_a_task_whose_every_attempt_is_killed_fails_the_run_and_the_previous_view_keeps_serving(
    engine: SparkEngine, fault: Callable[[str], None], prepared: Prepared,
) -> None:
    fault("1:2:writing")  # both attempts local[2,2] allows die
    topic_dir = TopicDir(prepared.path, entries_per_ledger=ENTRIES_PER_LEDGER)
    try:
        before, _ = ledger_files(prepared.path)
        with pytest.raises(SparkEngineError, match="spark rewrite failed"):
            topic_dir.compact(spark_compactor(engine))
        _assert_previous_view_serves_untilrestart(topic_dir, prepared)
        # Once no task of the failed job runs any more, none of its ledgers is on disk: the
        # driver deleted them after its cancelled tasks stopped, not before (a task still
        # running when the job aborted could rename its ledger into place afterwards).
        deadline = time.monotonic() + PROCESS_EXIT_TIMEOUT_S
        while tasks_running(engine):
            assert time.monotonic() < deadline, "the failed job's tasks still run"
            time.sleep(0.05)
        files, _ = ledger_files(prepared.path)
        assert files == before
    finally:
        topic_dir.close()
    fault("")

    topic_dir, _ = restart(prepared.path)
    try:
        _assert_previous_view_serves(topic_dir, prepared)
        _assert_converges(topic_dir, engine, prepared)
    finally:
        topic_dir.close()


def _assert_previous_view_serves_untilrestart(topic_dir: TopicDir, prepared: Prepared) -> None:
    """After a failed run the previous view serves; what the killed attempts left (their
    temporary files) waits for the next start."""
    view = topic_dir.topic.view
    assert view is not None and view.ledger_ids == prepared.view_ledger_ids
    assert topic_dir.compacted_ledger() == prepared.served
    assert local_messages(topic_dir, read_compacted=True, include_open_ledger=True) == prepared.served_messages
    _, temporary = ledger_files(prepared.path)
    # One per killed attempt (a cancelled task whose worker Spark killed mid-write would add one).
    assert len(temporary) >= 2


# -- the commit killed ----------------------------------------------------------------------


@pytest.mark.parametrize(("point", "published"), COMMIT_POINTS)
def test_a_crash_in_the_commit_of_a_spark_run_leaves_the_old_or_the_new_view_whole_and_the_next_run_converges(
    engine: SparkEngine, prepared: Prepared, point: str, published: bool,
) -> None:
    topic_dir = TopicDir(prepared.path, entries_per_ledger=ENTRIES_PER_LEDGER)
    before, _ = ledger_files(prepared.path)
    new_ids: list[int] = []

    def crash(**_: object) -> None:
        files, _temporary = ledger_files(prepared.path)
        new_ids.extend(sorted(files - before))  # the run's ledgers, all written and sealed
        raise SimulatedCrash(point)

    topic_dir.data_dir.database.fault_points[point] = crash
    try:
        with pytest.raises(SimulatedCrash):
            topic_dir.compact(spark_compactor(engine))
    finally:
        kill(topic_dir)
    assert len(new_ids) > 1

    topic_dir, orphans = restart(prepared.path)
    try:
        view = topic_dir.topic.view
        assert view is not None
        if published:  # the new view whole: an incremental run appends its ledgers to the previous view's
            assert list(view.ledger_ids) == [*prepared.view_ledger_ids, *new_ids]
            assert orphans == []
            _assert_serves(topic_dir, prepared.expected, prepared.expected_messages)
        else:  # the old view whole; the run's ledgers were unreferenced
            assert sorted(orphans) == new_ids
            _assert_previous_view_serves(topic_dir, prepared)
        _assert_converges(topic_dir, engine, prepared)
    finally:
        topic_dir.close()
