"""The run state machine (``compactor.runs.run_state``): every transition as a table, no I/O.

Each row: the events that bring topic T to a state, one more event, the actions it must
return and T's phase after it. The invariants over any sequence of events are checked
with hypothesis.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.runs.run_state import (
    ERROR,
    INTERRUPTED,
    RUNNING,
    SUCCESS,
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

T, U = "persistent://public/default/t", "persistent://public/default/u"

IDLE: tuple[Event, ...] = ()
QUEUED: tuple[Event, ...] = (Requested(T, 1, 1),)
RUNNING_: tuple[Event, ...] = (*QUEUED, Started(T, 1, 2))
STOPPING_IDLE: tuple[Event, ...] = (Stopped(3),)
STOPPING_RUNNING: tuple[Event, ...] = (*RUNNING_, Stopped(3))
IN_PROGRESS: list[Action] = [Reject(T, RejectReason.IN_PROGRESS)]


@dataclass(frozen=True)
class Row:
    name: str
    before: tuple[Event, ...]
    event: Event
    actions: list[Action]
    phase: Phase | None  # T's phase after; None = idle
    run_id: int | None = None  # T's current run after, when not idle


TABLE = [
    # requested
    Row("a request on an idle topic queues it and persists RUNNING", IDLE, Requested(T, 1, 5),
        [PersistStatus(T, RUNNING, "", 5), Enqueue(T, 1)], Phase.QUEUED, 1),
    Row("a trigger while queued is refused", QUEUED, Requested(T, 2, 5), IN_PROGRESS, Phase.QUEUED, 1),
    Row("a trigger while running is refused", RUNNING_, Requested(T, 2, 5), IN_PROGRESS, Phase.RUNNING, 1),
    Row("a trigger after stop is refused", STOPPING_IDLE, Requested(T, 2, 5),
        [Reject(T, RejectReason.STOPPING)], None),
    Row("a request of another topic is independent", RUNNING_, Requested(U, 2, 5),
        [PersistStatus(U, RUNNING, "", 5), Enqueue(U, 2)], Phase.RUNNING, 1),
    # started
    Row("a slot starts the queued run", QUEUED, Started(T, 1, 5), [StartRun(T, 1)], Phase.RUNNING, 1),
    Row("a start of another run id changes nothing", QUEUED, Started(T, 9, 5), [], Phase.QUEUED, 1),
    Row("a start of an idle topic changes nothing", IDLE, Started(T, 1, 5), [], None),
    Row("a second start changes nothing", RUNNING_, Started(T, 1, 5), [], Phase.RUNNING, 1),
    # succeeded / failed
    Row("a success persists SUCCESS and trims", RUNNING_, Succeeded(T, 1, 7),
        [PersistStatus(T, SUCCESS, "", 7), Trim(T)], None),
    Row("a failure persists ERROR with its reason", RUNNING_, Failed(T, 1, 7, "OSError: disk full"),
        [PersistStatus(T, ERROR, "OSError: disk full", 7)], None),
    Row("a success of a stale run id changes nothing", RUNNING_, Succeeded(T, 2, 7), [], Phase.RUNNING, 1),
    Row("a failure of a stale run id changes nothing", RUNNING_, Failed(T, 2, 7, "x"), [], Phase.RUNNING, 1),
    Row("a success of a run never started changes nothing", QUEUED, Succeeded(T, 1, 7), [], Phase.QUEUED, 1),
    Row("a success of an idle topic changes nothing", IDLE, Succeeded(T, 1, 7), [], None),
    # interrupted
    Row("a restart finding RUNNING persisted turns it into ERROR", IDLE, Interrupted(T, 7),
        [PersistStatus(T, ERROR, INTERRUPTED, 7)], None),
    Row("RUNNING found for a run of this broker is left to it", RUNNING_, Interrupted(T, 7), [], Phase.RUNNING, 1),
    # deleted
    Row("deleting an idle topic is allowed", IDLE, Deleted(T), [], None),
    Row("deleting a topic while queued is refused", QUEUED, Deleted(T), IN_PROGRESS, Phase.QUEUED, 1),
    Row("deleting a topic while running is refused", RUNNING_, Deleted(T), IN_PROGRESS, Phase.RUNNING, 1),
    Row("deleting the __compaction subscription of an idle topic is allowed", IDLE, Deleted(T, view_only=True),
        [], None),
    Row("deleting the __compaction subscription while queued is allowed", QUEUED, Deleted(T, view_only=True),
        [], Phase.QUEUED, 1),
    Row("deleting the __compaction subscription while running is refused", RUNNING_,
        Deleted(T, view_only=True), IN_PROGRESS, Phase.RUNNING, 1),
    Row("deleting another topic is not refused by T's run", RUNNING_, Deleted(U), [], Phase.RUNNING, 1),
    # stopped
    Row("a stop cancels a queued run, which reads ERROR", QUEUED, Stopped(7),
        [PersistStatus(T, ERROR, INTERRUPTED, 7), Cancel(T, 1)], None),
    Row("a stop mid-run leaves the run to end", RUNNING_, Stopped(7), [], Phase.RUNNING, 1),
    Row("a stop on an idle topic does nothing", IDLE, Stopped(7), [], None),
    Row("a run that ends after the stop persists SUCCESS", STOPPING_RUNNING, Succeeded(T, 1, 8),
        [PersistStatus(T, SUCCESS, "", 8), Trim(T)], None),
    Row("a run that fails after the stop persists ERROR", STOPPING_RUNNING, Failed(T, 1, 8, "E: x"),
        [PersistStatus(T, ERROR, "E: x", 8)], None),
]


@pytest.mark.parametrize("row", TABLE, ids=[row.name for row in TABLE])
def test_every_transition_of_the_table(row: Row) -> None:
    states = RunStates()
    for event in row.before:
        states.handle(event)
    assert states.handle(row.event) == row.actions
    current = states.get(T)
    assert (current.phase if current else None) is row.phase
    if current is not None:
        assert current.run_id == row.run_id


def test_a_topic_runs_again_after_its_run_ended() -> None:
    states = RunStates()
    for event in (*RUNNING_, Succeeded(T, 1, 3)):
        states.handle(event)
    assert states.handle(Requested(T, 2, 4)) == [PersistStatus(T, RUNNING, "", 4), Enqueue(T, 2)]
    assert states.handle(Succeeded(T, 1, 5)) == []  # the old run's late news
    assert states.count(Phase.QUEUED) == 1 and states.topics(Phase.QUEUED) == [T]


TOPICS = st.sampled_from([T, U])
IDS = st.integers(min_value=1, max_value=4)
EVENTS = st.one_of(
    st.builds(Requested, TOPICS, IDS, st.just(1)),
    st.builds(Started, TOPICS, IDS, st.just(1)),
    st.builds(Succeeded, TOPICS, IDS, st.just(1)),
    st.builds(Failed, TOPICS, IDS, st.just(1), st.just("E: x")),
    st.builds(Interrupted, TOPICS, st.just(1)),
    st.builds(Deleted, TOPICS, st.booleans()),
    st.builds(Stopped, st.just(1)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=30))
def test_a_persisted_run_always_ends_before_the_next_starts_and_refusals_change_nothing(events: list[Event]) -> None:
    """Whatever the order of events: a RUNNING persisted is always followed by SUCCESS or
    ERROR before the next RUNNING, and a topic is in flight exactly when its last status
    is RUNNING; a run starts only from the queue, with its own run id; a rejection changes
    nothing."""
    states = RunStates()
    persisted: dict[str, list[str]] = {T: [], U: []}
    for event in events:
        before = {topic: states.get(topic) for topic in (T, U)}
        actions = states.handle(event)
        if any(isinstance(action, Reject) for action in actions):
            assert len(actions) == 1 and {topic: states.get(topic) for topic in (T, U)} == before
        for action in actions:
            if isinstance(action, PersistStatus):
                persisted[action.topic].append(action.status)
            if isinstance(action, StartRun):
                prior = before[action.topic]
                assert prior is not None and prior.phase is Phase.QUEUED and prior.run_id == action.run_id
    for topic, statuses in persisted.items():
        in_flight = states.get(topic) is not None
        for first, second in itertools.pairwise(statuses):
            assert not (first == RUNNING and second == RUNNING)  # never two runs at once
        assert in_flight == (bool(statuses) and statuses[-1] == RUNNING)
