"""The run executor (``compactor.runs.runs.CompactionRuns``) over real ledgers and SQLite status.

Runs are held in their worker thread by a progress callback that waits for an event
(bounded), so that what the executor does while a run is in flight can be observed.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from compactor.errors import CompactionInProgressError, CompactionStoppedError
from compactor.runs.run_state import INTERRUPTED
from compactor.runs.runner import Compactor, Progress
from compactor.runs.runs import CompactionRuns, RunJob
from compactor.runs.status import CompactionStatusStore
from compactor.view.topic import CompactedTopic
from cursor.store import CursorStore
from ledger import DataDir, ManagedLedger, ManagedLedgerConfig
from ledger.errors import LedgerNotFoundError
from ledger.storage import file as file_module
from ledger.storage.sealed_writer import ledger_file_name
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

T, U = "persistent://public/default/t", "persistent://public/default/u"
HOLD_S = 10.0  # the most a held run waits for its release
WAIT_S = 10.0


def message(key: str, value: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def held(release: threading.Event, started: threading.Event | None = None) -> Progress:
    def progress(_phase: str, _done: int, _total: int) -> None:
        if started is not None:
            started.set()
        release.wait(HOLD_S)
    return progress


class Fixture:
    def __init__(self, path: Path) -> None:
        self.data_dir = DataDir.open(str(path))
        self.cursors = CursorStore(self.data_dir.database)
        self.statuses = CompactionStatusStore(self.data_dir.database)
        self.topics: dict[str, CompactedTopic] = {}

    def topic(self, name: str) -> CompactedTopic:
        if name not in self.topics:
            ledger = ManagedLedger.open(name, self.data_dir.ledgers, self.data_dir.metadata,
                                        ManagedLedgerConfig(max_entries_per_ledger=2))
            for value in (b"1", b"2", b"3"):
                ledger.append(message("k", value)).result(timeout=10)
            self.topics[name] = CompactedTopic.restore(ledger, self.cursors, create_cursor=True)
        return self.topics[name]

    def runs(self, max_concurrent_runs: int = 1) -> CompactionRuns:
        return CompactionRuns(Compactor(), self.statuses, max_concurrent_runs=max_concurrent_runs)

    def close(self) -> None:
        for topic in self.topics.values():
            topic.ledger.close()
        self.data_dir.close()


def run(path: Path, body: Callable[[Fixture], Coroutine[Any, Any, None]]) -> None:
    fixture = Fixture(path)
    try:
        asyncio.run(body(fixture))
    finally:
        fixture.close()


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.001)


def test_a_run_persists_running_then_success_and_trims_what_it_covered(tmp_path: Path) -> None:
    async def body(f: Fixture) -> None:
        runs, topic = f.runs(), f.topic(T)
        ledgers_before = len(topic.ledger.ledger_list())
        outcome = runs.request(RunJob(topic))
        assert runs.status(T) == ("RUNNING", "") and runs.in_flight(T)
        figures = await outcome
        assert runs.status(T) == ("SUCCESS", "") and not runs.in_flight(T)
        assert topic.view is not None and figures.ledger_id == topic.view.ledger_id
        assert len(topic.ledger.ledger_list()) < ledgers_before  # only __compaction held them
        assert runs.status(U) == ("NOT_RUN", "")
    run(tmp_path, body)


def test_runs_beyond_the_slots_wait_in_the_queue_and_count_as_in_flight(tmp_path: Path) -> None:
    async def body(f: Fixture) -> None:
        runs, release, started = f.runs(max_concurrent_runs=1), threading.Event(), threading.Event()
        first = runs.request(RunJob(f.topic(T), progress=held(release, started)))
        second = runs.request(RunJob(f.topic(U)))
        assert (runs.running(T), runs.running(U), runs.in_flight(U)) == (True, False, True)
        assert (runs.running_count, runs.queued_count) == (1, 1)
        for name in (T, U):
            with pytest.raises(CompactionInProgressError):
                runs.request(RunJob(f.topic(name)))
            with pytest.raises(CompactionInProgressError):
                runs.check_delete(name)
        runs.check_delete(U, view_only=True)  # a queued run does not hold the subscription
        with pytest.raises(CompactionInProgressError):
            runs.check_delete(T, view_only=True)
        await until(started.is_set)
        assert not second.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second), WAIT_S)
        assert runs.status(T)[0] == runs.status(U)[0] == "SUCCESS"
        runs.check_delete(T)  # idle: allowed
    run(tmp_path, body)


def test_a_failed_run_reads_error_and_frees_its_slot(tmp_path: Path) -> None:
    async def body(f: Fixture) -> None:
        runs, topic = f.runs(), f.topic(T)
        await runs.run(RunJob(topic))
        assert topic.view is not None
        f.data_dir.ledgers.delete(topic.view.ledger_id)  # out of band: the next run cannot read it
        f.topic(T).ledger.append(message("j", b"1")).result(timeout=10)
        failing = runs.request(RunJob(topic))
        queued = runs.request(RunJob(f.topic(U)))
        with pytest.raises(LedgerNotFoundError):
            await failing
        status, error = runs.status(T)
        assert status == "ERROR" and error.startswith("LedgerNotFoundError: ")
        await asyncio.wait_for(queued, WAIT_S)
        assert runs.status(U)[0] == "SUCCESS"
    run(tmp_path, body)


def test_a_stop_mid_run_waits_for_it_and_cancels_the_queued_ones(tmp_path: Path) -> None:
    async def body(f: Fixture) -> None:
        runs, release, started = f.runs(max_concurrent_runs=1), threading.Event(), threading.Event()
        running = runs.request(RunJob(f.topic(T), progress=held(release, started)))
        queued = runs.request(RunJob(f.topic(U)))
        await until(started.is_set)
        stopping = asyncio.create_task(runs.stop())
        await until(queued.done)
        with pytest.raises(CompactionStoppedError):
            queued.result()
        assert runs.status(U) == ("ERROR", INTERRUPTED)
        with pytest.raises(CompactionStoppedError):
            runs.request(RunJob(f.topic(U)))
        assert not stopping.done() and runs.running(T)  # the stop waits for the run
        release.set()
        await asyncio.wait_for(stopping, WAIT_S)
        assert running.done() and runs.status(T) == ("SUCCESS", "")
    run(tmp_path, body)


def test_a_restart_finding_running_persisted_reads_error(tmp_path: Path) -> None:
    async def body(f: Fixture) -> None:
        f.statuses.set_compaction_status(T, "RUNNING", "", 1)  # as if killed mid-run
        f.statuses.set_compaction_status(U, "SUCCESS", "", 1)
        runs = f.runs()
        assert runs.status(T) == ("ERROR", INTERRUPTED)
        assert runs.status(U) == ("SUCCESS", "")
        assert f.statuses.topics_with_status("RUNNING") == []
    run(tmp_path, body)


def test_the_run_gets_the_topics_one_compaction_cursor(tmp_path: Path) -> None:
    """The ``__compaction`` cursor is opened once, with the topic, and a run moves that
    object: no second copy is rebuilt from SQLite."""
    async def body(f: Fixture) -> None:
        runs, topic = f.runs(), f.topic(T)
        cursor = topic.cursor
        await runs.run(RunJob(topic))
        assert topic.cursor is cursor
        assert topic.view is not None and cursor.mark_delete_position == topic.view.horizon
        assert cursor.properties == {"CompactedTopicLedger": topic.view.ledger_id}
        assert cursor.estimated_backlog_bytes() == 0
    run(tmp_path, body)


class GatedStatuses(CompactionStatusStore):
    """The real status store; each write records its thread and, while ``gate`` is clear,
    waits for it (a slow disk's commit, which the real store cannot be made to be)."""

    def __init__(self, store: CompactionStatusStore) -> None:
        super().__init__(store.database)
        self.gate = threading.Event()
        self.gate.set()
        self.threads: list[int] = []

    def set_compaction_status(self, topic: str, status: str, last_error: str, updated_at_ms: int) -> None:
        self.threads.append(threading.get_ident())
        self.gate.wait(HOLD_S)
        super().set_compaction_status(topic, status, last_error, updated_at_ms)


def test_status_writes_run_off_the_loop_and_outcomes_wait_for_them(tmp_path: Path) -> None:
    async def body(f: Fixture) -> None:
        statuses = GatedStatuses(f.statuses)
        runs = CompactionRuns(Compactor(), statuses, max_concurrent_runs=1)
        loop_thread = threading.get_ident()
        statuses.gate.clear()  # the RUNNING write hangs: the trigger must not
        outcome = runs.request(RunJob(f.topic(T)))
        assert runs.status(T) == ("RUNNING", "")
        written = asyncio.ensure_future(runs.written())
        await asyncio.sleep(0)
        assert not written.done()  # a REST trigger answers only once RUNNING is durable
        statuses.gate.set()
        await asyncio.wait_for(written, WAIT_S)
        await asyncio.wait_for(outcome, WAIT_S)
        assert f.statuses.compaction_status(T) == ("SUCCESS", "")  # durable when the outcome came
        assert len(statuses.threads) == 2 and loop_thread not in statuses.threads
        await runs.stop()
    run(tmp_path, body)


def test_a_status_shows_success_only_once_written_and_deletes_wait_for_it(tmp_path: Path) -> None:
    async def body(f: Fixture) -> None:
        statuses = GatedStatuses(f.statuses)
        runs = CompactionRuns(Compactor(), statuses, max_concurrent_runs=1)
        release, started = threading.Event(), threading.Event()
        outcome = runs.request(RunJob(f.topic(T), progress=held(release, started)))
        await until(started.is_set)
        await runs.written(T)
        statuses.gate.clear()  # the SUCCESS write hangs
        release.set()
        await until(lambda: not runs.in_flight(T))
        assert runs.status(T) == ("RUNNING", "")  # what is durable so far
        with pytest.raises(CompactionInProgressError):
            runs.check_delete(T)  # its row would come back after the delete
        assert not outcome.done()
        statuses.gate.set()
        await asyncio.wait_for(outcome, WAIT_S)
        assert runs.status(T) == ("SUCCESS", "")
        runs.check_delete(T)
        await runs.stop()
    run(tmp_path, body)


def test_publishing_a_rounds_ledger_scans_none_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The round's writer hands the store its layout (``FileLedgerStore.adopt_sealed``):
    the broker's process walks no record of the ledger it publishes."""
    scanned: list[str] = []
    real = file_module.scan_fd

    def recorded(fd: int, path: str) -> object:
        scanned.append(os.path.basename(path))
        return real(fd, path)
    monkeypatch.setattr(file_module, "scan_fd", recorded)

    async def body(f: Fixture) -> None:
        topic = f.topic(T)
        await f.runs().run(RunJob(topic))
        assert topic.view is not None and topic.view.entries == 1
        assert ledger_file_name(topic.view.ledger_id) not in scanned
        assert list(f.data_dir.ledgers.read(topic.view.ledger_id, 0, 0))  # served, CRC-checked
    run(tmp_path, body)
