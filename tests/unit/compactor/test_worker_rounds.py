"""The local engine's rounds in a worker process (``compactor.local.worker``).

* Agreement: over several runs and budgets (one round or many), a compactor whose rounds
  run in a child process publishes exactly the views an in-process compactor publishes,
  entry for entry and byte for byte, with the same figures.
* Failure: a round whose child is killed (the broker stopping, or the child dying) fails
  the run cleanly: the previous view keeps serving, the reserved ledger is not left
  behind, and the next run converges.
* The child really is another process: the broker's interpreter never runs phase one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactor.engine import KEY_MAP_BYTES_PER_KEY
from compactor.errors import CompactionInterruptedError, CompactorError
from compactor.local.worker import CHILD_NICE
from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.view.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from tests.unit.compactor.test_crash import _append, _workload

TOPIC = "persistent://public/default/worker-rounds"
LEDGER_CONFIG = ManagedLedgerConfig(max_entries_per_ledger=8)
POLL_S, POLL_LIMIT_S = 0.01, 30.0


@pytest.fixture(scope="module")
def worker_compactors() -> Iterator[dict[int, Compactor]]:
    """Compactors with rounds in one worker process, by memory budget (their pools are
    started once for the module: a child's start takes a second)."""
    made: dict[int, Compactor] = {}
    yield made
    for compactor in made.values():
        compactor.close()


def _worker(made: dict[int, Compactor], budget: int) -> Compactor:
    if budget not in made:
        made[budget] = Compactor(CompactionConfig(engine="local", read_batch_entries=4, memory_budget_bytes=budget,
                                                  worker_processes=1))
    return made[budget]


def _open(path: Path) -> tuple[DataDir, CompactedTopic]:
    data_dir = DataDir.open(str(path))
    collect_orphans(data_dir)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, LEDGER_CONFIG)
    return data_dir, CompactedTopic.restore(ledger, CursorStore(data_dir.database))


def _view(topic: CompactedTopic) -> list[tuple[Position, bytes, tuple[int, ...]]]:
    view = topic.view
    assert view is not None
    return [(entry.position, entry.data, entry.surviving) for entry in view.iter_all()]


@pytest.mark.parametrize("keys", [3, 1_000_000])  # several rounds a run; one round
def test_rounds_in_a_worker_process_publish_what_rounds_in_the_broker_publish(
    tmp_path: Path, worker_compactors: dict[int, Compactor], keys: int,
) -> None:
    budget = keys * KEY_MAP_BYTES_PER_KEY
    here = Compactor(CompactionConfig(engine="local", read_batch_entries=4, memory_budget_bytes=budget))
    there = _worker(worker_compactors, budget)
    views, figures = {}, {}
    for name, compactor in (("here", here), ("there", there)):
        data_dir, topic = _open(tmp_path / name)
        views[name], figures[name] = [], []
        for seed in (1, 2, 3):  # each run builds on the view the previous one published
            _append(topic.ledger, _workload(seed, 30))
            run = compactor.compact(topic, delete_retention_ms=0)
            figures[name].append((run.rounds, run.keys_kept, run.removed_events, run.entries_read,
                                  run.messages_read, run.entries_written, run.bytes_written, run.horizon))
            views[name].append(_view(topic))
        data_dir.close()
    assert views["there"] == views["here"]
    assert figures["there"] == figures["here"]
    assert all(rounds > 1 for rounds, *_ in figures["there"]) == (keys == 3)


def test_the_worker_runs_the_phases_in_another_process(tmp_path: Path, worker_compactors: dict[int, Compactor]) -> None:
    compactor = _worker(worker_compactors, 1 << 20)
    data_dir, topic = _open(tmp_path / "dir")
    _append(topic.ledger, _workload(4, 20))
    compactor.compact(topic)
    workers = compactor._workers
    assert workers is not None and workers._pool is not None
    children = [process.pid for process in workers._pool._processes.values()]  # type: ignore[attr-defined]
    assert children and os.getpid() not in children
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert all(os.getpriority(os.PRIO_PROCESS, pid) == min(19, ours + CHILD_NICE) for pid in children)
    data_dir.close()


def _slow_run(tmp_path: Path, compactor: Compactor) -> tuple[DataDir, CompactedTopic, list[BaseException]]:
    """A topic with a published view and a second run under way in a child, throttled to
    last long; the run's error lands in the returned list."""
    data_dir, topic = _open(tmp_path / "dir")
    _append(topic.ledger, _workload(5, 30))
    compactor.compact(topic)
    _append(topic.ledger, _workload(6, 30))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            compactor.compact(topic, max_bytes_per_second=200)  # some seconds for ~2 KiB
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    workers = compactor._workers
    assert workers is not None
    deadline = time.monotonic() + POLL_LIMIT_S
    while workers._pool is None or not workers._pool._processes:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(POLL_S)
    return data_dir, topic, errors


def _joined(errors: list[BaseException]) -> BaseException:
    deadline = time.monotonic() + POLL_LIMIT_S
    while not errors:
        assert time.monotonic() < deadline, "the run never ended"
        time.sleep(POLL_S)
    return errors[0]


def _assert_previous_view_serves_alone(data_dir: DataDir, topic: CompactedTopic, before: list[object]) -> None:
    assert _view(topic) == before
    view = topic.view
    assert view is not None
    data = {record.ledger_id for record in topic.ledger.ledger_list()}
    assert set(data_dir.ledgers.list()) == data | set(view.ledger_ids)


def test_a_broker_stop_kills_the_round_in_its_worker_and_the_previous_view_serves(tmp_path: Path) -> None:
    compactor = Compactor(CompactionConfig(engine="local", read_batch_entries=4, worker_processes=1))
    data_dir, topic, errors = _slow_run(tmp_path, compactor)
    before = _view(topic)
    compactor.interrupt()
    assert isinstance(_joined(errors), CompactionInterruptedError)
    _assert_previous_view_serves_alone(data_dir, topic, before)
    compactor.close()
    data_dir.close()


def test_a_worker_that_dies_fails_the_run_and_the_next_run_converges(tmp_path: Path) -> None:
    compactor = Compactor(CompactionConfig(engine="local", read_batch_entries=4, worker_processes=1))
    data_dir, topic, errors = _slow_run(tmp_path, compactor)
    before = _view(topic)
    workers = compactor._workers
    assert workers is not None and workers._pool is not None
    for process in workers._pool._processes.values():  # type: ignore[attr-defined]
        process.kill()
    error = _joined(errors)
    assert isinstance(error, CompactorError) and "worker process died" in str(error)
    _assert_previous_view_serves_alone(data_dir, topic, before)
    compactor.compact(topic)  # a fresh child
    in_process = Compactor(CompactionConfig(engine="local", read_batch_entries=4))
    other_dir, other = _open(tmp_path / "other")
    for seed in (5, 6):  # the same runs, in the broker
        _append(other.ledger, _workload(seed, 30))
        in_process.compact(other)
    assert _view(topic) == _view(other)
    compactor.close()
    data_dir.close()
    other_dir.close()


def test_a_worker_whose_broker_died_before_it_started_exits_at_once() -> None:
    """kill -9 of the broker between a worker's spawn and its initializer: asking to die
    with the parent is too late then (it died already), so the worker compares its parent
    with the broker it was started by, and exits instead of staying behind."""
    code = ("import os, sys\nfrom compactor.local.worker import _child_started\n"
            "_child_started(os.getppid())\nprint('kept', flush=True)\n"
            "_child_started(os.getppid() + 1)\nprint('stayed', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "kept\n"), done.stderr
