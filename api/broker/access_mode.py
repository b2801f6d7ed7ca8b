"""Producer access modes: who may produce on a topic (Pulsar's ``ProducerAccessMode``).

``TopicAccess`` owns one topic's exclusive holder, its queue of producers waiting for
exclusive access, and its topic epoch. Rules (as Pulsar's broker keeps them):

* **Shared** (the default): any number of producers, refused with ProducerBusy while an
  exclusive producer holds the topic or one waits for it.
* **Exclusive**: refused with ProducerFenced when any other producer is connected or
  waiting, or when it reconnects with a topic epoch older than the topic's (someone
  else held the topic in between).
* **WaitForExclusive**: queued (the client hears "not ready yet") while other producers
  are connected; granted in arrival order once the topic has no producer.
* **ExclusiveWithFencing**: takes the topic at once: queued producers are refused with
  ProducerFenced, connected ones are fenced (the broker closes them; an exclusive one
  that comes back with its old epoch is refused with ProducerFenced).
* Each grant of exclusive access to a new producer raises the topic epoch, answered in
  PRODUCER_SUCCESS; a producer reconnecting with the current epoch keeps it. The epoch
  lives in memory (after a restart it starts again from the first epoch a producer
  brings back).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from api.broker.errors import BrokerError, ProducerBusyError

__all__ = ["AccessMode", "Grant", "ProducerFencedError", "TopicAccess"]


class ProducerFencedError(BrokerError):
    """A producer lost, or cannot get, exclusive access (ProducerFenced)."""

    code = "ProducerFenced"


class AccessMode(enum.IntEnum):
    """The wire's ``ProducerAccessMode``."""

    SHARED = 0
    EXCLUSIVE = 1
    WAIT_FOR_EXCLUSIVE = 2
    EXCLUSIVE_WITH_FENCING = 3


@dataclass(frozen=True, slots=True)
class Grant:
    """What ``admit`` decided: ``queued`` (wait for ``on_ready``) or admitted now, with the
    topic epoch to answer (None: a shared producer, no epoch)."""

    queued: bool
    epoch: int | None = None


@dataclass(slots=True)
class _Waiter:
    owner: object
    on_ready: Callable[[int], None]
    on_refused: Callable[[BrokerError], None]


class TopicAccess:
    """The access state of one topic; all calls on the broker's event loop."""

    def __init__(self) -> None:
        self.epoch = 0
        self._exclusive: object | None = None
        self._waiting: deque[_Waiter] = deque()

    @property
    def exclusive(self) -> object | None:
        """The producer holding exclusive access, if any."""
        return self._exclusive

    def admit(self, owner: object, mode: AccessMode, topic_epoch: int | None, others: Iterable[object],
              fence: Callable[[object], None]) -> Grant:
        """Decide on a new producer ``owner`` while ``others`` are connected; raises
        ProducerBusyError or ProducerFencedError, fences ``others`` for
        ExclusiveWithFencing. A queued producer must then be given to ``wait``."""
        connected = [o for o in others if o is not owner]
        if mode is AccessMode.SHARED:
            if self._exclusive is not None or self._waiting:
                raise ProducerBusyError("Topic has an existing exclusive producer")
            return Grant(queued=False)
        if mode is AccessMode.EXCLUSIVE_WITH_FENCING:
            self._fence_all(connected, fence)
            return self._grant(owner, topic_epoch)
        if self._exclusive is not None and self._exclusive is not owner and mode is AccessMode.EXCLUSIVE:
            raise ProducerFencedError("Topic has an existing exclusive producer")
        if topic_epoch is not None and topic_epoch < self.epoch:
            raise ProducerFencedError(f"Topic epoch has already moved on: {topic_epoch} < {self.epoch}")
        if connected or self._waiting or self._exclusive not in (None, owner):
            if mode is AccessMode.EXCLUSIVE:
                raise ProducerFencedError("Topic has existing producers"
                                          if not self._waiting else "Topic has producers waiting for exclusive access")
            return Grant(queued=True)
        return self._grant(owner, topic_epoch)

    def wait(self, owner: object, on_ready: Callable[[int], None], on_refused: Callable[[BrokerError], None]) -> None:
        """Queue a WaitForExclusive producer: ``on_ready(epoch)`` when granted (it is then
        the exclusive holder), ``on_refused(error)`` when fenced out first."""
        self._waiting.append(_Waiter(owner, on_ready, on_refused))

    def detached(self, owner: object, *, producers_left: bool) -> None:
        """``owner`` left (closed, fenced or its connection went): a queued one leaves the
        queue; exclusive access is freed, and the first waiter gets it once the topic has
        no producer."""
        self._waiting = deque(w for w in self._waiting if w.owner is not owner)
        if self._exclusive is owner:
            self._exclusive = None
        if self._exclusive is None and not producers_left and self._waiting:
            waiter = self._waiting.popleft()
            grant = self._grant(waiter.owner, None)
            assert grant.epoch is not None
            waiter.on_ready(grant.epoch)

    def _fence_all(self, connected: list[object], fence: Callable[[object], None]) -> None:
        waiting, self._waiting = self._waiting, deque()
        for waiter in waiting:
            waiter.on_refused(ProducerFencedError("Fenced out by an ExclusiveWithFencing producer"))
        self._exclusive = None
        for other in connected:
            fence(other)

    def _grant(self, owner: object, topic_epoch: int | None) -> Grant:
        if topic_epoch is None or topic_epoch < self.epoch:
            self.epoch += 1
        else:
            self.epoch = topic_epoch
        self._exclusive = owner
        return Grant(queued=False, epoch=self.epoch)
