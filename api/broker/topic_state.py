"""The topic lifecycle state machine: events in, actions out, no I/O.

``TopicStates`` is the one answer to "where is this topic in its life?": loading, loaded,
closing, being deleted (or held by its partitioned parent's delete), or none of these (no
entry). ``handle(event)`` moves one topic's state (a partitioned delete's marks: several)
and returns what must happen as ``Action`` values, which ``api.broker.registry.TopicRegistry``
(the executor: the ``Topic`` objects, the load threads, the closes and deletes) carries out.
Nothing here opens, closes or deletes a topic: load ids arrive in the events.

Per topic (``absent`` is no entry; ``marked`` is a partitioned parent's delete holding it)::

    absent    --LoadRequested-------->  loading    Open(id)
    loading   --LoadRequested-------->  loading    Join
    loaded    --LoadRequested-------->  loaded     Ready
    closing   --LoadRequested(wait)-->  reopening  Join          (opened once Closed)
    reopening --LoadRequested-------->  reopening  Join
    loading/reopening --LoadRequested(no wait)--> Reject(LOADING)
    closing   --LoadRequested(no wait)----------> Reject(CLOSING)
    deleting or marked --LoadRequested--> Reject(DELETING)
    stopping  --LoadRequested (not loaded)--> Reject(STOPPING)
    loading   --Opened(id)----------->  loaded     Publish(id)
    loading   --OpenFailed(id)------->  absent     Forget(id)
    loading   --Opened(id) stopping-->  closing    Discard(id)   (opened after the stop began)
    any       --Opened/OpenFailed(another id)-->   Discard(id) / nothing
    loaded    --UnloadRequested------>  closing    Unpublish, Close
    closing   --Closed--------------->  absent
    reopening --Closed--------------->  loading    Open(id)
    reopening --Closed, stopping----->  absent     Forget(id)    (its waiters are refused)
    loaded    --DeleteRequested------>  deleting   Unpublish, Delete
    deleting  --DeleteEnded---------->  absent (marked stays held)
    loading/reopening --DeleteRequested--> Reject(LOADING)
    closing   --DeleteRequested------>  Reject(CLOSING)
    absent/deleting --DeleteRequested--> Reject(NOT_LOADED)
    any but loading --Marked(keys)----->  marked +1     (all keys, or Reject(LOADING) and none)
    marked    --Released(keys)------->  marked -1
    loaded    --Stopped-------------->  closing    Unpublish, Close (each); then stopping

An unload or delete of a topic not loaded is refused (``Reject(NOT_LOADED)``); a load
refused at once is answered at once, never waited for. A partitioned parent's delete marks
its partitions first (``Marked``: loads of them are refused until ``Released``) after
waiting for their loads in flight, so that no load creates a partition's rows under the
delete's feet; deleting a marked partition that is loaded is allowed (the parent's delete
does it). Every wait is for an action in flight (an open, a close), none for an event.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "Action",
    "Close",
    "Closed",
    "Delete",
    "DeleteEnded",
    "DeleteRequested",
    "Discard",
    "Event",
    "Forget",
    "Join",
    "LoadRequested",
    "Marked",
    "Open",
    "OpenFailed",
    "Opened",
    "Phase",
    "Publish",
    "Ready",
    "Reject",
    "RejectReason",
    "Released",
    "Stopped",
    "TopicStates",
    "UnloadRequested",
    "Unpublish",
]


class Phase(enum.Enum):
    """Where a topic is in its life; ``absent`` (none of these) is no entry."""

    LOADING = "loading"
    LOADED = "loaded"
    CLOSING = "closing"
    REOPENING = "reopening"  # closing, and a load waits for the close to end
    DELETING = "deleting"


class RejectReason(enum.Enum):
    LOADING = "being loaded"
    CLOSING = "being unloaded"
    DELETING = "being deleted"
    NOT_LOADED = "not loaded"
    STOPPING = "the broker is stopping"


# -- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadRequested:
    """A caller wants ``topic`` loaded; ``load_id`` is the id an open would take.
    ``wait``: the caller may wait for a load or a close in flight (else it is refused)."""

    topic: str
    load_id: int
    wait: bool = True


@dataclass(frozen=True, slots=True)
class Opened:
    """Open ``load_id`` of ``topic`` ended with the topic open."""

    topic: str
    load_id: int


@dataclass(frozen=True, slots=True)
class OpenFailed:
    topic: str
    load_id: int


@dataclass(frozen=True, slots=True)
class UnloadRequested:
    topic: str


@dataclass(frozen=True, slots=True)
class Closed:
    """The close of ``topic`` ended (sealed, or failed: the next open recovers)."""

    topic: str


@dataclass(frozen=True, slots=True)
class DeleteRequested:
    """The loaded ``topic`` is to be deleted (the caller checked its clients and runs)."""

    topic: str


@dataclass(frozen=True, slots=True)
class DeleteEnded:
    """The deletion of ``topic`` ended (done, or failed: it may be loaded again)."""

    topic: str


@dataclass(frozen=True, slots=True)
class Marked:
    """A partitioned parent's delete holds ``topics`` (its partitions): none loads meanwhile."""

    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Released:
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stopped:
    """The broker stops: the loaded topics close, nothing loads again."""


Event = (LoadRequested | Opened | OpenFailed | UnloadRequested | Closed | DeleteRequested | DeleteEnded
         | Marked | Released | Stopped)


# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Open:
    """Open ``topic`` off the loop as load ``load_id``; its end is ``Opened``/``OpenFailed``."""

    topic: str
    load_id: int


@dataclass(frozen=True, slots=True)
class Join:
    """Wait for the load (or the close, then the load) of ``topic`` in flight, then ask again."""

    topic: str


@dataclass(frozen=True, slots=True)
class Ready:
    """The loaded topic answers the request."""

    topic: str


@dataclass(frozen=True, slots=True)
class Publish:
    """The topic open ``load_id`` made is the loaded topic: callers may attach to it."""

    topic: str
    load_id: int


@dataclass(frozen=True, slots=True)
class Forget:
    """Load ``load_id`` failed: its error is its callers'."""

    topic: str
    load_id: int


@dataclass(frozen=True, slots=True)
class Discard:
    """Close what load ``load_id`` opened, unpublished (it ended after the stop began)."""

    topic: str
    load_id: int


@dataclass(frozen=True, slots=True)
class Unpublish:
    """The loaded topic is no longer the loaded topic: nothing new attaches to it."""

    topic: str


@dataclass(frozen=True, slots=True)
class Close:
    """Close the unpublished topic off the loop; its end is ``Closed``."""

    topic: str


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete the unpublished topic (data, rows) off the loop; its end is ``DeleteEnded``."""

    topic: str


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the request (the executor raises)."""

    topic: str
    reason: RejectReason


Action = Open | Join | Ready | Publish | Forget | Discard | Unpublish | Close | Delete | Reject


@dataclass(slots=True)
class TopicState:
    """One topic's state: its phase (None: absent) and how many parent deletes hold it."""

    phase: Phase | None = None
    load_id: int | None = None
    marks: int = field(default=0)


class TopicStates:
    """Every topic's lifecycle state; see the module docstring for the transitions."""

    def __init__(self) -> None:
        self._states: dict[str, TopicState] = {}
        self.stopping = False

    def phase(self, topic: str) -> Phase | None:
        """The topic's phase, or None when it is absent."""
        state = self._states.get(topic)
        return state.phase if state is not None else None

    def load_id(self, topic: str) -> int | None:
        """The id of the topic's load in flight or published."""
        state = self._states.get(topic)
        return state.load_id if state is not None else None

    def marked(self, topic: str) -> bool:
        state = self._states.get(topic)
        return state is not None and state.marks > 0

    def topics(self, phase: Phase) -> list[str]:
        return [topic for topic, state in self._states.items() if state.phase is phase]

    def handle(self, event: Event) -> list[Action]:
        """Apply ``event``; the actions to carry out, in order."""
        match event:
            case LoadRequested():
                return self._load_requested(event)
            case Opened():
                return self._opened(event)
            case OpenFailed():
                state = self._states.get(event.topic)
                if state is None or state.phase is not Phase.LOADING or state.load_id != event.load_id:
                    return []
                self._set(event.topic, None, None)
                return [Forget(event.topic, event.load_id)]
            case UnloadRequested():
                return self._leave(event.topic, Phase.CLOSING, Close(event.topic))
            case Closed():
                return self._closed(event)
            case DeleteRequested():
                return self._leave(event.topic, Phase.DELETING, Delete(event.topic))
            case DeleteEnded():
                state = self._states.get(event.topic)
                if state is not None and state.phase is Phase.DELETING:
                    self._set(event.topic, None, None)
                return []
            case Marked():
                return self._marked(event)
            case Released():
                for topic in event.topics:
                    state = self._states.get(topic)
                    if state is not None and state.marks > 0:
                        state.marks -= 1
                        self._tidy(topic)
                return []
            case Stopped():
                self.stopping = True
                actions: list[Action] = []
                for topic in self.topics(Phase.LOADED):
                    actions += self._leave(topic, Phase.CLOSING, Close(topic))
                return actions
        raise TypeError(f"not a topic event: {event!r}")  # pragma: no cover - exhaustive above

    # -- transitions --------------------------------------------------------------------

    def _load_requested(self, event: LoadRequested) -> list[Action]:
        topic = event.topic
        state = self._states.get(topic)
        phase = state.phase if state is not None else None
        if phase is Phase.LOADED:
            return [Ready(topic)]
        if phase is Phase.DELETING or (state is not None and state.marks > 0):
            return [Reject(topic, RejectReason.DELETING)]
        if self.stopping:
            return [Reject(topic, RejectReason.STOPPING)]
        if phase in (Phase.LOADING, Phase.REOPENING):
            return [Join(topic)] if event.wait else [Reject(topic, RejectReason.LOADING)]
        if phase is Phase.CLOSING:
            if not event.wait:
                return [Reject(topic, RejectReason.CLOSING)]
            self._set(topic, Phase.REOPENING, event.load_id)
            return [Join(topic)]
        self._set(topic, Phase.LOADING, event.load_id)
        return [Open(topic, event.load_id)]

    def _opened(self, event: Opened) -> list[Action]:
        state = self._states.get(event.topic)
        if state is None or state.phase is not Phase.LOADING or state.load_id != event.load_id:
            return [Discard(event.topic, event.load_id)]  # pragma: no cover - an open is the only one of its id
        if self.stopping:
            self._set(event.topic, Phase.CLOSING, event.load_id)
            return [Discard(event.topic, event.load_id)]
        self._set(event.topic, Phase.LOADED, event.load_id)
        return [Publish(event.topic, event.load_id)]

    def _leave(self, topic: str, phase: Phase, then: Action) -> list[Action]:
        """A loaded topic's unload (``CLOSING``) or delete (``DELETING``)."""
        state = self._states.get(topic)
        current = state.phase if state is not None else None
        if current is Phase.LOADED:
            self._set(topic, phase, None)
            return [Unpublish(topic), then]
        if current in (Phase.LOADING, Phase.REOPENING):
            return [Reject(topic, RejectReason.LOADING)]
        if current is Phase.CLOSING:
            return [Reject(topic, RejectReason.CLOSING)]
        return [Reject(topic, RejectReason.NOT_LOADED)]

    def _closed(self, event: Closed) -> list[Action]:
        state = self._states.get(event.topic)
        if state is None:
            return []
        if state.phase is Phase.CLOSING:
            self._set(event.topic, None, None)
        elif state.phase is Phase.REOPENING:
            assert state.load_id is not None
            if self.stopping:  # the load waiting for the close is refused: its waiters learn why
                load_id = state.load_id
                self._set(event.topic, None, None)
                return [Forget(event.topic, load_id)]
            self._set(event.topic, Phase.LOADING, state.load_id)
            return [Open(event.topic, state.load_id)]
        return []

    def _marked(self, event: Marked) -> list[Action]:
        loading = [t for t in event.topics if self.phase(t) in (Phase.LOADING, Phase.REOPENING)]
        if loading:
            return [Reject(t, RejectReason.LOADING) for t in loading]
        for topic in event.topics:
            self._states.setdefault(topic, TopicState()).marks += 1
        return []

    def _set(self, topic: str, phase: Phase | None, load_id: int | None) -> None:
        state = self._states.setdefault(topic, TopicState())
        state.phase, state.load_id = phase, load_id
        self._tidy(topic)

    def _tidy(self, topic: str) -> None:
        state = self._states[topic]
        if state.phase is None and state.marks == 0:
            del self._states[topic]
