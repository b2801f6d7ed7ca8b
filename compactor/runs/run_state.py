"""The compaction run state machine: events in, actions out, no I/O.

``RunStates`` is the one answer to "is a run of this topic in flight?". It knows every
topic with a run requested or running (an idle topic has no entry) and whether the broker
is stopping; ``handle(event)`` moves one topic's state and returns what must happen as
``Action`` values, which ``compactor.runs.runs.CompactionRuns`` (the executor: run slots, the
queue, the tasks, the status store) carries out. Nothing here reads a clock, a store or a
task: times and run ids arrive in the events.

Per topic (``idle`` is no entry)::

    idle    --Requested-->  queued   PersistStatus(RUNNING), Enqueue
    queued  --Started--->   running  StartRun
    running --Succeeded-->  idle     PersistStatus(SUCCESS), Trim
    running --Failed----->  idle     PersistStatus(ERROR, the error)
    queued  --Stopped---->  idle     PersistStatus(ERROR, INTERRUPTED), Cancel
    idle    --Interrupted-> idle     PersistStatus(ERROR, INTERRUPTED)  (a restart found RUNNING)
    queued/running --Requested-->    Reject(IN_PROGRESS)
    queued/running --Deleted(topic)-> Reject(IN_PROGRESS); idle: allowed (no action)
    running --Deleted(view)-------->  Reject(IN_PROGRESS); idle/queued: allowed
    after Stopped: Requested --> Reject(STOPPING); a running run still ends as above

``Started``, ``Succeeded`` and ``Failed`` carry the run id they belong to: one for a run
that is not the topic's current one changes nothing. The statuses are ``ledger.job_status``'s
(Pulsar's ``LongRunningProcessStatus``, the offload's too): ``NOT_RUN`` is what a topic never
compacted reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ledger.job_status import JobStatus

__all__ = [
    "ERROR",
    "INTERRUPTED",
    "NOT_RUN",
    "RUNNING",
    "SUCCESS",
    "Action",
    "Cancel",
    "Deleted",
    "Enqueue",
    "Event",
    "Failed",
    "Interrupted",
    "PersistStatus",
    "Phase",
    "Reject",
    "RejectReason",
    "Requested",
    "RunStates",
    "StartRun",
    "Started",
    "Stopped",
    "Succeeded",
    "Trim",
]

# The statuses by the short names the transition table above uses.
NOT_RUN, RUNNING, SUCCESS, ERROR = JobStatus.NOT_RUN, JobStatus.RUNNING, JobStatus.SUCCESS, JobStatus.ERROR
INTERRUPTED = "the broker stopped during the run"
"""The error a run reads when the broker stopped before it ended (or before it started)."""


class Phase(enum.Enum):
    """Where a topic's current run is; an idle topic has none."""

    QUEUED = "queued"
    RUNNING = "running"


class RejectReason(enum.Enum):
    IN_PROGRESS = "in progress"
    STOPPING = "stopping"


# -- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requested:
    """A run of ``topic`` is asked for (REST trigger, scheduler, ``compact-topic``)."""

    topic: str
    run_id: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Started:
    """The executor gave run ``run_id`` a slot."""

    topic: str
    run_id: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Succeeded:
    topic: str
    run_id: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Failed:
    topic: str
    run_id: int
    at_ms: int
    error: str


@dataclass(frozen=True, slots=True)
class Interrupted:
    """At start: the status store holds RUNNING for ``topic``, left by a broker that stopped
    mid-run (``run_id`` None: that run was not this broker's)."""

    topic: str
    at_ms: int
    run_id: int | None = None


@dataclass(frozen=True, slots=True)
class Deleted:
    """``topic`` is to be deleted, or only its ``__compaction`` subscription (``view_only``)."""

    topic: str
    view_only: bool = False


@dataclass(frozen=True, slots=True)
class Stopped:
    """The broker stops: queued runs are cancelled, running ones end, no new run is taken."""

    at_ms: int


Event = Requested | Started | Succeeded | Failed | Interrupted | Deleted | Stopped


# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PersistStatus:
    topic: str
    status: JobStatus
    last_error: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Wait for a run slot."""

    topic: str
    run_id: int


@dataclass(frozen=True, slots=True)
class StartRun:
    topic: str
    run_id: int


@dataclass(frozen=True, slots=True)
class Trim:
    """Trim the raw ledgers the published view now covers."""

    topic: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Drop a queued run: it will not start."""

    topic: str
    run_id: int


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the request (the executor raises)."""

    topic: str
    reason: RejectReason


Action = PersistStatus | Enqueue | StartRun | Trim | Cancel | Reject


@dataclass(frozen=True, slots=True)
class TopicRun:
    """A topic's current run."""

    run_id: int
    phase: Phase


class RunStates:
    """Every topic's run state; see the module docstring for the transitions."""

    def __init__(self) -> None:
        self._runs: dict[str, TopicRun] = {}
        self.stopping = False

    def get(self, topic: str) -> TopicRun | None:
        """The topic's current run, or None when it is idle."""
        return self._runs.get(topic)

    def count(self, phase: Phase) -> int:
        return sum(1 for run in self._runs.values() if run.phase is phase)

    def topics(self, phase: Phase) -> list[str]:
        return [topic for topic, run in self._runs.items() if run.phase is phase]

    def handle(self, event: Event) -> list[Action]:
        """Apply ``event``; the actions to carry out, in order."""
        match event:
            case Requested():
                return self._requested(event)
            case Started():
                return self._started(event)
            case Succeeded():
                return self._ended(event.topic, event.run_id, [
                    PersistStatus(event.topic, SUCCESS, "", event.at_ms), Trim(event.topic)])
            case Failed():
                return self._ended(event.topic, event.run_id, [
                    PersistStatus(event.topic, ERROR, event.error, event.at_ms)])
            case Interrupted():
                if event.topic in self._runs:
                    return []  # this broker's run: it ends by Succeeded or Failed
                return [PersistStatus(event.topic, ERROR, INTERRUPTED, event.at_ms)]
            case Deleted():
                return self._deleted(event)
            case Stopped():
                return self._stopped(event)
        raise TypeError(f"not a run event: {event!r}")  # pragma: no cover - exhaustive above

    def _requested(self, event: Requested) -> list[Action]:
        if self.stopping:
            return [Reject(event.topic, RejectReason.STOPPING)]
        if event.topic in self._runs:
            return [Reject(event.topic, RejectReason.IN_PROGRESS)]
        self._runs[event.topic] = TopicRun(event.run_id, Phase.QUEUED)
        return [PersistStatus(event.topic, RUNNING, "", event.at_ms), Enqueue(event.topic, event.run_id)]

    def _started(self, event: Started) -> list[Action]:
        current = self._runs.get(event.topic)
        if current is None or current.run_id != event.run_id or current.phase is not Phase.QUEUED:
            return []
        self._runs[event.topic] = TopicRun(event.run_id, Phase.RUNNING)
        return [StartRun(event.topic, event.run_id)]

    def _ended(self, topic: str, run_id: int, actions: list[Action]) -> list[Action]:
        current = self._runs.get(topic)
        if current is None or current.run_id != run_id or current.phase is not Phase.RUNNING:
            return []
        del self._runs[topic]
        return actions

    def _deleted(self, event: Deleted) -> list[Action]:
        current = self._runs.get(event.topic)
        if current is None or (event.view_only and current.phase is Phase.QUEUED):
            return []
        return [Reject(event.topic, RejectReason.IN_PROGRESS)]

    def _stopped(self, event: Stopped) -> list[Action]:
        self.stopping = True
        actions: list[Action] = []
        for topic in self.topics(Phase.QUEUED):
            run_id = self._runs.pop(topic).run_id
            actions += [PersistStatus(topic, ERROR, INTERRUPTED, event.at_ms), Cancel(topic, run_id)]
        return actions
