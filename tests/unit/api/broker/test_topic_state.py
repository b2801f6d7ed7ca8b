"""Every row of the topic lifecycle table (``api.broker.topic_state``), on the pure machine."""

from __future__ import annotations

import pytest

from api.broker.topic_state import (
    Close,
    Closed,
    Delete,
    DeleteEnded,
    DeleteRequested,
    Discard,
    Forget,
    Join,
    LoadRequested,
    Marked,
    Open,
    Opened,
    OpenFailed,
    Phase,
    Publish,
    Ready,
    Reject,
    RejectReason,
    Released,
    Stopped,
    TopicStates,
    UnloadRequested,
    Unpublish,
)

T = "persistent://public/default/t"
P0, P1 = T + "-partition-0", T + "-partition-1"


def loading() -> TopicStates:
    states = TopicStates()
    assert states.handle(LoadRequested(T, 1)) == [Open(T, 1)]
    return states


def loaded() -> TopicStates:
    states = loading()
    assert states.handle(Opened(T, 1)) == [Publish(T, 1)]
    return states


def closing() -> TopicStates:
    states = loaded()
    assert states.handle(UnloadRequested(T)) == [Unpublish(T), Close(T)]
    return states


def reopening() -> TopicStates:
    states = closing()
    assert states.handle(LoadRequested(T, 2)) == [Join(T)]
    return states


def deleting() -> TopicStates:
    states = loaded()
    assert states.handle(DeleteRequested(T)) == [Unpublish(T), Delete(T)]
    return states


def test_absent_load_requested_opens() -> None:
    states = loading()
    assert states.phase(T) is Phase.LOADING and states.load_id(T) == 1


def test_loading_load_requested_joins_or_is_refused_without_waiting() -> None:
    states = loading()
    assert states.handle(LoadRequested(T, 2)) == [Join(T)]
    assert states.handle(LoadRequested(T, 3, wait=False)) == [Reject(T, RejectReason.LOADING)]
    assert states.load_id(T) == 1  # one open in flight, shared


def test_loaded_load_requested_is_ready() -> None:
    states = loaded()
    assert states.handle(LoadRequested(T, 2)) == [Ready(T)]
    assert states.handle(LoadRequested(T, 3, wait=False)) == [Ready(T)]


def test_closing_load_requested_waits_for_the_close_then_opens() -> None:
    states = reopening()
    assert states.phase(T) is Phase.REOPENING
    assert states.handle(LoadRequested(T, 3)) == [Join(T)]  # reopening: joins the same load
    assert states.handle(Closed(T)) == [Open(T, 2)]
    assert states.phase(T) is Phase.LOADING and states.load_id(T) == 2


def test_closing_load_requested_without_waiting_is_refused() -> None:
    states = closing()
    assert states.handle(LoadRequested(T, 2, wait=False)) == [Reject(T, RejectReason.CLOSING)]
    assert states.handle(LoadRequested(T, 2, wait=False)) == [Reject(T, RejectReason.CLOSING)]
    assert states.phase(T) is Phase.CLOSING
    assert reopening().handle(LoadRequested(T, 3, wait=False)) == [Reject(T, RejectReason.LOADING)]


@pytest.mark.parametrize("wait", [True, False])
def test_deleting_or_marked_load_requested_is_refused(wait: bool) -> None:
    assert deleting().handle(LoadRequested(T, 2, wait=wait)) == [Reject(T, RejectReason.DELETING)]
    states = TopicStates()
    assert states.handle(Marked((T,))) == []
    assert states.handle(LoadRequested(T, 2, wait=wait)) == [Reject(T, RejectReason.DELETING)]


def test_stopping_load_requested_is_refused_but_a_loaded_topic_was_closed() -> None:
    states = TopicStates()
    states.handle(Stopped())
    assert states.handle(LoadRequested(T, 1)) == [Reject(T, RejectReason.STOPPING)]
    states = reopening()
    states.handle(Stopped())
    assert states.handle(Closed(T)) == [Forget(T, 2)]  # the load waiting for the close does not open
    assert states.phase(T) is None
    assert states.handle(LoadRequested(T, 3)) == [Reject(T, RejectReason.STOPPING)]


def test_loading_opened_publishes_and_open_failed_forgets() -> None:
    assert loaded().phase(T) is Phase.LOADED
    states = loading()
    assert states.handle(OpenFailed(T, 1)) == [Forget(T, 1)]
    assert states.phase(T) is None
    assert states.handle(LoadRequested(T, 2)) == [Open(T, 2)]  # a later load tries again


def test_loading_opened_after_the_stop_began_is_discarded() -> None:
    states = loading()
    assert states.handle(Stopped()) == []
    assert states.handle(Opened(T, 1)) == [Discard(T, 1)]
    assert states.phase(T) is Phase.CLOSING
    assert states.handle(Closed(T)) == [] and states.phase(T) is None


def test_an_end_of_another_load_id_changes_nothing() -> None:
    states = loaded()
    assert states.handle(OpenFailed(T, 7)) == [] and states.phase(T) is Phase.LOADED
    states = loading()
    assert states.handle(OpenFailed(T, 7)) == [] and states.phase(T) is Phase.LOADING


def test_loaded_unload_requested_unpublishes_then_closes_and_closed_forgets() -> None:
    states = closing()
    assert states.phase(T) is Phase.CLOSING
    assert states.handle(Closed(T)) == [] and states.phase(T) is None


def test_loaded_delete_requested_unpublishes_then_deletes_and_delete_ended_forgets() -> None:
    states = deleting()
    assert states.phase(T) is Phase.DELETING
    assert states.handle(DeleteEnded(T)) == [] and states.phase(T) is None
    assert states.handle(LoadRequested(T, 2)) == [Open(T, 2)]


@pytest.mark.parametrize(("make", "reason"), [
    (loading, RejectReason.LOADING),
    (reopening, RejectReason.LOADING),
    (closing, RejectReason.CLOSING),
    (TopicStates, RejectReason.NOT_LOADED),
    (deleting, RejectReason.NOT_LOADED),
])
def test_unload_or_delete_of_a_topic_not_loaded_is_refused(make, reason) -> None:  # type: ignore[no-untyped-def]
    states = make()
    before = states.phase(T)
    assert states.handle(UnloadRequested(T)) == [Reject(T, reason)]
    assert states.handle(DeleteRequested(T)) == [Reject(T, reason)]
    assert states.phase(T) is before


def test_marked_holds_partitions_until_released_and_a_loaded_one_may_be_deleted() -> None:
    """The partitioned delete row: a loaded partition is deleted under its parent's mark,
    and stays unloadable until the mark is released (the race: a partition's rows forgotten
    under a load's feet)."""
    states = TopicStates()
    assert states.handle(LoadRequested(P0, 1)) == [Open(P0, 1)]
    assert states.handle(Opened(P0, 1)) == [Publish(P0, 1)]
    assert states.handle(Marked((P0, P1))) == []
    assert states.handle(LoadRequested(P1, 2)) == [Reject(P1, RejectReason.DELETING)]
    assert states.handle(LoadRequested(P0, 3)) == [Ready(P0)]  # still loaded: its clients are checked
    assert states.handle(DeleteRequested(P0)) == [Unpublish(P0), Delete(P0)]
    assert states.handle(DeleteEnded(P0)) == []
    assert states.handle(LoadRequested(P0, 4)) == [Reject(P0, RejectReason.DELETING)]  # held by the parent
    assert states.handle(Released((P0, P1))) == []
    assert states.phase(P0) is None and states.phase(P1) is None and not states.marked(P0)
    assert states.handle(LoadRequested(P0, 5)) == [Open(P0, 5)]


def test_marked_is_refused_whole_while_a_partition_loads() -> None:
    """The partitioned delete waits for a partition's load in flight: marking is refused,
    and nothing is marked, while one loads."""
    states = TopicStates()
    states.handle(LoadRequested(P1, 1))
    assert states.handle(Marked((P0, P1))) == [Reject(P1, RejectReason.LOADING)]
    assert not states.marked(P0) and states.phase(P0) is None
    states.handle(Opened(P1, 1))
    assert states.handle(Marked((P0, P1))) == []


def test_marks_nest() -> None:
    states = TopicStates()
    states.handle(Marked((P0,)))
    states.handle(Marked((P0,)))
    states.handle(Released((P0,)))
    assert states.marked(P0)
    states.handle(Released((P0,)))
    assert not states.marked(P0) and states.handle(Released((P0,))) == []


def test_stopped_closes_every_loaded_topic() -> None:
    states = loaded()
    states.handle(LoadRequested(P0, 5))
    assert states.handle(Stopped()) == [Unpublish(T), Close(T)]
    assert states.phase(T) is Phase.CLOSING and states.phase(P0) is Phase.LOADING
