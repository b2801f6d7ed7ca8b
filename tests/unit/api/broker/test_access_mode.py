"""Producer access modes in the core: an exclusive holder is never beside another producer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.broker.access_mode import AccessMode, ProducerFencedError, TopicAccess
from api.broker.errors import BrokerError, ProducerBusyError


class _World:
    """Producers attached to one topic, driven through ``TopicAccess`` as the wire does."""

    def __init__(self) -> None:
        self.access = TopicAccess()
        self.attached: list[object] = []
        self.queued: list[object] = []
        self.refused: list[object] = []

    def add(self, mode: AccessMode) -> object:
        owner = object()
        grant = self.access.admit(owner, mode, None, list(self.attached), fence=self.detach)
        if grant.queued:
            self.queued.append(owner)
            self.access.wait(owner, lambda epoch: self._ready(owner), lambda error: self._refused(owner))
        else:
            self.attached.append(owner)
        return owner

    def _refused(self, owner: object) -> None:
        self.queued.remove(owner)
        self.refused.append(owner)

    def _ready(self, owner: object) -> None:
        self.queued.remove(owner)
        self.attached.append(owner)

    def detach(self, owner: object) -> None:
        if owner in self.attached:
            self.attached.remove(owner)
        if owner in self.queued:
            self.queued.remove(owner)
        self.access.detached(owner, producers_left=bool(self.attached))


def test_each_mode_refuses_as_pulsar_does() -> None:
    world = _World()
    holder = world.add(AccessMode.EXCLUSIVE)
    with pytest.raises(ProducerFencedError):
        world.add(AccessMode.EXCLUSIVE)
    with pytest.raises(ProducerBusyError):
        world.add(AccessMode.SHARED)
    waiter = world.add(AccessMode.WAIT_FOR_EXCLUSIVE)
    assert world.queued == [waiter]
    world.detach(holder)
    assert world.attached == [waiter] and world.access.exclusive is waiter
    fencer = world.add(AccessMode.EXCLUSIVE_WITH_FENCING)
    assert world.attached == [fencer] and world.access.exclusive is fencer
    assert world.access.epoch == 3
    with pytest.raises(ProducerFencedError):  # an old holder coming back with its epoch
        world.access.admit(object(), AccessMode.EXCLUSIVE, 1, [], fence=world.detach)


@given(st.lists(st.tuples(st.sampled_from(list(AccessMode)), st.booleans(), st.integers(0, 9)), max_size=30))
def test_an_exclusive_holder_is_never_beside_another_producer(steps: list[tuple[AccessMode, bool, int]]) -> None:
    world = _World()
    for mode, leave, which in steps:
        if leave and (world.attached or world.queued):
            everyone = world.attached + world.queued
            world.detach(everyone[which % len(everyone)])
        else:
            try:
                world.add(mode)
            except BrokerError:
                pass
        holder = world.access.exclusive
        if holder is not None:
            assert world.attached == [holder]
        assert not (world.queued and not world.attached)  # nobody waits for a free topic
