"""The compaction run executor: the one owner of runs in flight, their slots and status.

``CompactionRuns`` is shared by every door that starts a run: the REST trigger
(``Admin.trigger_compaction``), the scheduler (``BrokerService.scheduler_tick``) and
``compactd compact-topic`` (``api.offline``). It feeds events to the pure state machine
(``compactor.run_state.RunStates``, which decides) and carries out the actions it returns:

* **slots**: at most ``max_concurrent_runs`` runs at once; others wait in a FIFO queue;
* **tasks**: a run (``Compactor.compact``, a straight procedure) goes to a worker thread;
  its outcome is an event (``Succeeded``/``Failed``) and the future ``request`` returned;
* **status**: what ``PersistStatus`` says is written to the status store given (an object
  with ``set_compaction_status``/``compaction_status``/``topics_with_status``), so it
  survives a restart; at construction a RUNNING left by a stopped broker becomes ERROR;
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
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from compactor.errors import CompactionInProgressError, CompactionStoppedError
from compactor.record import RunFigures
from compactor.run_state import (
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
from compactor.runner import Compactor, Progress
from compactor.topic import CompactedTopic

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
        for topic in status.topics_with_status(RUNNING):
            self._handle(Interrupted(topic, self._now_ms()))

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
        """``(status, last error)`` of the topic's last or current run; NOT_RUN if none."""
        return self.status_store.compaction_status(topic) or (NOT_RUN, "")

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
        ``__compaction`` subscription) must not be deleted now."""
        self._handle(Deleted(topic, view_only))

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
                self.status_store.set_compaction_status(topic, status, last_error, at_ms)
            case Enqueue(_, run_id):
                self._queue.append(run_id)
            case StartRun(_, run_id):
                run = self._runs[run_id]
                run.task = asyncio.create_task(self._execute(run_id, run.job))
            case Trim(topic):
                self._trim(topic)
            case Cancel(topic, run_id):
                self._queue.remove(run_id)
                self._runs.pop(run_id).outcome.set_exception(CompactionStoppedError(topic))
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
            self._runs.pop(run_id).outcome.set_exception(error)
        else:
            self._handle(Succeeded(name, run_id, self._now_ms()))  # starts the trim, on a worker thread
            await asyncio.gather(*list(self._trims))  # the outcome comes after the trim it covers
            self._runs.pop(run_id).outcome.set_result(figures)

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
