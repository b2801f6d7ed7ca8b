"""What a subscription hands entries to: a ``Delivery`` (one entry on its way) and a
``Consumer`` (the core's view of one consumer), with the ``KeySharedPolicy`` a Key_Shared
consumer asked for. ``api.broker.dispatch`` and ``api.broker.key_shared`` both work on these;
this module owns them so that neither imports the other's internals.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass

from ledger.position import Position
from message.proto import pulsar_api_pb2 as pb

__all__ = ["Consumer", "Delivery", "KeySharedMode", "KeySharedPolicy"]


class KeySharedMode(enum.Enum):
    AUTO_SPLIT = 0
    STICKY = 1


@dataclass(frozen=True, slots=True)
class KeySharedPolicy:
    """What a Key_Shared SUBSCRIBE asked for; ``ranges`` are inclusive (STICKY only)."""

    mode: KeySharedMode = KeySharedMode.AUTO_SPLIT
    ranges: tuple[tuple[int, int], ...] = ()
    allow_out_of_order: bool = False

    @classmethod
    def from_wire(cls, meta: pb.KeySharedMeta | None) -> KeySharedPolicy:
        """The policy of a SUBSCRIBE's ``keySharedMeta`` (absent: AUTO_SPLIT, in order)."""
        if meta is None:
            return cls()
        mode = KeySharedMode.STICKY if meta.keySharedMode == pb.STICKY else KeySharedMode.AUTO_SPLIT
        return cls(mode, tuple((r.start, r.end) for r in meta.hashRanges), meta.allowOutOfOrderDelivery)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One entry on its way to a consumer.

    Attributes:
        position: the entry's original position.
        data: ``metadataSize · metadata · payload``, as stored.
        messages: permits it uses: the batch's slot count, else 1.
        ack_set: words of the slots to deliver (empty: every slot).
        redelivery_count: times redelivery was requested for it (Shared; a consumer
            leaving is not counted, as in Pulsar).
    """

    position: Position
    data: bytes
    messages: int
    ack_set: tuple[int, ...] = ()
    redelivery_count: int = 0


class Consumer(abc.ABC):
    """The core's view of a consumer; ``permits`` is changed by the subscription only.
    ``key_shared_policy`` is what a Key_Shared consumer asked for (None: the default)."""

    key_shared_policy: KeySharedPolicy | None = None

    def __init__(self, consumer_id: int, name: str, priority_level: int = 0) -> None:
        self.consumer_id = consumer_id
        self.name = name
        self.priority_level = priority_level
        self.permits = 0

    @property
    def writable(self) -> bool:
        """False while the consumer cannot take more now (its outgoing buffer is full); it
        then calls ``Subscription.dispatch`` again once it can (default: always True)."""
        return True

    @abc.abstractmethod
    def send(self, delivery: Delivery) -> None:
        """Hand one entry to the consumer (must not block)."""

    def set_active(self, active: bool) -> None:
        """Failover: this consumer became active or inactive (default: ignore)."""

    def disconnect(self) -> None:
        """The broker drops the consumer (seek): it will subscribe again (default: ignore)."""
