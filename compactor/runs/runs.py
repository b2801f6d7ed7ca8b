"""The compaction run executor: the one owner of runs in flight, their slots and status.

``CompactionRuns`` is shared by every door that starts a run: the REST trigger
(``Admin.trigger_compaction``), the scheduler (``BrokerService.scheduler_tick``) and
``compactd compact-topic`` (``api.offline``). It feeds events to the pure state machine
(``compactor.runs.run_state.RunStates``, which decides) and carries out the actions it returns:

* **slots**: at most ``max_concurrent_runs`` runs at once; others wait in a FIFO queue;
* **tasks**: a run (``Compactor.compact``, a straight procedure) goes to a worker thread;
  its outcome is an event (``Succeeded``/``Failed``) and the future ``request`` returned;
* **status**: what ``PersistStatus`` says is written to the status store given (an object
  with ``set_compaction_status``/``compaction_status``/``topics_with_status``), so it
  survives a restart; at construction a RUNNING left by a stopped broker becomes ERROR.
  The writes (SQLite commits) run in order on one writer thread, never on the event loop;
  ``status`` answers RUNNING while a run is queued or running, else what the store holds,
  so a status is read only once it is durable. A run's outcome (its future) resolves, a
  queued run is cancelled, and ``written`` returns only after the status it led to is
  written; ``check_delete`` refuses while a topic's status write is pending (a deleted
  topic's row must not come back);
* **trim**: after a success, the raw ledgers the new view covers are trimmed.

``in_flight``/``running`` are the one answer to "is a run of this topic in flight?";
``check_delete`` refuses deleting a topic (or its ``__compaction`` subscription) under a
run with ``CompactionInProgressError``. ``stop`` cancels queued runs (status ERROR, "the
broker stopped during the run") and waits for the running ones; one waiting on its I/O
throttle (``compactionMaxBytesPerSecond``) fails at once instead, so that a slow,
throttled run does not hold the stop. Call everything on one asyncio event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from compactor.errors import CompactionInProgressError, CompactionStoppedError
from compactor.record import RunFigures
from compactor.runs.run_state import (
    NOT_RUN,
    RUNNING,
    Action,
    Cancel,
    Deleted,
    Enqueue,
    Event,
    Failed,
    Interrupted,
    PersistStatus,
    Phase,
    Reject,
    RejectReason,
    Requested,
    RunStates,
    Started,
    StartRun,
    Stopped,
    Succeeded,
    Trim,
)
from compactor.runs.runner import Compactor, Progress
from compactor.view.topic import CompactedTopic

__all__ = ["CompactionRuns", "RunJob", "StatusStore"]

log = logging.getLogger(__name__)


class StatusStore(Protocol):
    """Where run status persists (``ledger.metadata.MetadataStore`` has these)."""

    def set_compaction_status(self, topic: str, status: str, last_error: str, updated_at_ms: int) -> None: ...

    def compaction_status(self, topic: str) -> tuple[str, str] | None: ...

    def topics_with_status(self, status: str) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class RunJob:
    """What one run needs: the topic, its ``deleteRetentionMs``, an optional progress
    callback, its ``minCompactionLagMs`` and its ``compactionMaxBytesPerSecond`` (0: off)."""

    topic: CompactedTopic
    delete_retention_ms: int = 0
    progress: Progress | None = None
    min_compaction_lag_ms: int = 0
    max_bytes_per_second: int = 0


@dataclass(slots=True)
class _Run:
    job: RunJob
    outcome: asyncio.Future[RunFigures]
    task: asyncio.Task[None] | None = field(default=None)


class CompactionRuns:
    """Runs compactions through ``compactor``; see the module docstring."""

    def __init__(
        self, compactor: Compactor, status: StatusStore, *, max_concurrent_runs: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.compactor = compactor
        self.status_store = status
        self.max_concurrent_runs = max(1, max_concurrent_runs)
        self._clock = clock
        self._states = RunStates()
        self._runs: dict[int, _Run] = {}
        self._queue: deque[int] = deque()
        self._trims: set[asyncio.Task[None]] = set()  # trims after a success, in flight
        self._run_ids = itertools.count(1)
        self._writer: ThreadPoolExecutor | None = None  # status writes, in order, off the loop
        self._writes: dict[str, asyncio.Future[None]] = {}  # each topic's last pending status write
        self._constructing = True  # the construction's writes are made before it returns
        for topic in status.topics_with_status(RUNNING):
            self._handle(Interrupted(topic, self._now_ms()))
        self._constructing = False

    # -- questions ------------------------------------------------------------------

    def in_flight(self, topic: str) -> bool:
        """A run of ``topic`` is queued or running."""
        return self._states.get(topic) is not None

    def running(self, topic: str) -> bool:
        """A run of ``topic`` holds a slot."""
        run = self._states.get(topic)
        return run is not None and run.phase is Phase.RUNNING

    @property
    def running_count(self) -> int:
        return self._states.count(Phase.RUNNING)

    @property
    def queued_count(self) -> int:
        return self._states.count(Phase.QUEUED)

    def status(self, topic: str) -> tuple[str, str]:
        """``(status, last error)`` of the topic's last or current run; NOT_RUN if none.
        RUNNING while one is queued or running; otherwise the last status written."""
        if self._states.get(topic) is not None:
            return RUNNING, ""
        return self.status_store.compaction_status(topic) or (NOT_RUN, "")

    async def written(self, topic: str | None = None) -> None:
        """Wait until the status writes pending for ``topic`` (None: every topic) are
        written; raises what a failed one raised."""
        if topic is None:
            pending = list(self._writes.values())
        else:
            pending = [self._writes[topic]] if topic in self._writes else []
        for write in pending:
            await asyncio.shield(write)

    # -- requests -------------------------------------------------------------------

    def request(self, job: RunJob) -> asyncio.Future[RunFigures]:
        """Queue a run of ``job.topic``; its figures, or its error, come in the future.

        ``CompactionInProgressError`` when one is queued or running, ``CompactionStoppedError``
        once ``stop`` began. A caller need not await the future: the outcome is in the status.
        """
        run_id = next(self._run_ids)
        outcome: asyncio.Future[RunFigures] = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(_retrieved)
        self._runs[run_id] = _Run(job, outcome)
        try:
            self._handle(Requested(job.topic.name, run_id, self._now_ms()))
        except Exception:
            del self._runs[run_id]
            outcome.cancel()
            raise
        return outcome

    async def run(self, job: RunJob) -> RunFigures:
        """Request a run and wait for its figures (raises what the run raised)."""
        return await self.request(job)

    def check_delete(self, topic: str, *, view_only: bool = False) -> None:
        """``CompactionInProgressError`` when ``topic`` (or, ``view_only``, its
        ``__compaction`` subscription) must not be deleted now: a run is in flight, or its
        status is still being written."""
        self._handle(Deleted(topic, view_only))
        if not view_only and topic in self._writes:
            raise CompactionInProgressError(topic)

    async def wait_idle(self) -> None:
        """Wait until no run is queued or running."""
        while self._runs:
            await asyncio.gather(*(r.outcome for r in list(self._runs.values())), return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the queued runs and wait for the running ones; no run starts after. A
        running run waiting on its I/O throttle, or whose round is in a worker process,
        fails at once with ``CompactionInterruptedError`` (``Compactor.interrupt``: the
        worker is killed); the previous view keeps serving."""
        self._handle(Stopped(self._now_ms()))
        self.compactor.interrupt()
        await self.wait_idle()
        await asyncio.gather(*list(self._trims))
        await asyncio.gather(*list(self._writes.values()), return_exceptions=True)
        if self._writer is not None:
            self._writer.shutdown(wait=True)

    # -- carrying out actions -------------------------------------------------------

    def _handle(self, event: Event) -> None:
        """Carry out what ``event`` calls for, then start queued runs in the free slots."""
        self._apply(event)
        self._fill_slots()

    def _apply(self, event: Event) -> None:
        for action in self._states.handle(event):
            self._carry_out(action)

    def _carry_out(self, action: Action) -> None:
        match action:
            case PersistStatus(topic, status, last_error, at_ms):
                self._persist(topic, status, last_error, at_ms)
            case Enqueue(_, run_id):
                self._queue.append(run_id)
            case StartRun(_, run_id):
                run = self._runs[run_id]
                run.task = asyncio.create_task(self._execute(run_id, run.job))
            case Trim(topic):
                self._trim(topic)
            case Cancel(topic, run_id):
                self._queue.remove(run_id)
                outcome = self._runs.pop(run_id).outcome
                self._after_written(topic, lambda: outcome.set_exception(CompactionStoppedError(topic)))
            case Reject(topic, RejectReason.IN_PROGRESS):
                raise CompactionInProgressError(topic)
            case Reject(topic, _):
                raise CompactionStoppedError(topic)

    def _fill_slots(self) -> None:
        while self._queue and self.running_count < self.max_concurrent_runs:
            run_id = self._queue.popleft()
            self._apply(Started(self._runs[run_id].job.topic.name, run_id, self._now_ms()))

    async def _execute(self, run_id: int, job: RunJob) -> None:
        name = job.topic.name
        try:
            figures = await asyncio.to_thread(functools.partial(
                self.compactor.compact, job.topic, delete_retention_ms=job.delete_retention_ms, progress=job.progress,
                min_compaction_lag_ms=job.min_compaction_lag_ms, max_bytes_per_second=job.max_bytes_per_second))
        except Exception as error:  # noqa: BLE001 - the outcome of a run is its status and its future
            self._handle(Failed(name, run_id, self._now_ms(), f"{type(error).__name__}: {error}"))
            await self._quietly_written(name)
            self._runs.pop(run_id).outcome.set_exception(error)
        else:
            self._handle(Succeeded(name, run_id, self._now_ms()))  # starts the trim, on a worker thread
            await asyncio.gather(*list(self._trims))  # the outcome comes after the trim it covers
            await self._quietly_written(name)
            self._runs.pop(run_id).outcome.set_result(figures)

    # -- status writes --------------------------------------------------------------

    def _persist(self, topic: str, status: str, last_error: str, at_ms: int) -> None:
        """Write the status on the writer thread (inline while constructing)."""
        if self._constructing:
            self.status_store.set_compaction_status(topic, status, last_error, at_ms)
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction-status")
        write = asyncio.get_running_loop().run_in_executor(
            self._writer, self.status_store.set_compaction_status, topic, status, last_error, at_ms)
        self._writes[topic] = write
        write.add_done_callback(functools.partial(self._write_done, topic))

    def _write_done(self, topic: str, write: asyncio.Future[None]) -> None:
        if self._writes.get(topic) is write:
            del self._writes[topic]
        if not write.cancelled() and write.exception() is not None:
            log.error("%s: writing the compaction status failed: %s", topic, write.exception())

    def _after_written(self, topic: str, callback: Callable[[], object]) -> None:
        """Call ``callback`` once the topic's pending status write is done (now if none)."""
        write = self._writes.get(topic)
        if write is None:
            callback()
        else:
            write.add_done_callback(lambda _: callback())

    async def _quietly_written(self, topic: str) -> None:
        """Wait for the topic's status write; its failure is logged (``_write_done``), the
        run's outcome stands."""
        with contextlib.suppress(Exception):  # logged by _write_done
            await self.written(topic)

    def _trim(self, topic: str) -> None:
        """Trim the topic's ledger on a worker thread (its deletes and commits stay off
        the event loop); ``stop`` waits for the trims in flight."""
        trimmed = [run.job.topic for run in self._runs.values() if run.job.topic.name == topic]
        for compacted in trimmed[:1]:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(_trim_quietly, compacted))
            self._trims.add(task)
            task.add_done_callback(self._trims.discard)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _trim_quietly(compacted: CompactedTopic) -> None:
    try:
        compacted.ledger.trim()
    except Exception as error:  # noqa: BLE001 - the run succeeded; the next trim retries
        log.warning("%s: trimming after compaction failed: %s", compacted.name, error)


def _retrieved(outcome: asyncio.Future[RunFigures]) -> None:
    """Mark a run's error as seen: a trigger that never awaits it has its status instead."""
    if not outcome.cancelled():
        outcome.exception()
