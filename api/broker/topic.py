"""A loaded topic in the broker: its log, compaction state, subscriptions and producers.

* **Publishing** appends the entry bytes verbatim; the returned future resolves to the
  position once the entry is durable. Producers are de-duplicated by producer name and
  sequence id (Pulsar's message de-duplication): a send whose highest sequence id is
  not above the last one persisted for that producer name is a duplicate and is not
  appended again.
* **Subscribing** creates durable subscriptions (a persisted cursor, ``initial_position``
  used only on creation) or non-durable ones (readers: a cursor in memory, positioned at
  the start message id inclusive — the client filters what it does not want).
* De-duplication state survives restarts (``api.broker.dedup``).
* The ``__compaction`` cursor is created with the topic, at the earliest entry, so that
  nothing is trimmed before a compaction has covered it (Pulsar only pre-creates it when a
  compaction threshold is set; compactd always does).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future

from api.broker.dedup import DEDUP_CURSOR, Deduplication
from api.broker.dispatch import Consumer, Subscription, SubType
from api.broker.errors import NotAllowedError, SubscriptionNotFoundError
from api.broker.topic_name import TopicName
from compactor.topic import COMPACTION_SUBSCRIPTION, CompactedTopic
from cursor.cursor import InitialPosition, ManagedCursor
from ledger.managed_ledger import ManagedLedger
from ledger.position import EARLIEST, LATEST, Position

__all__ = ["DUPLICATE", "Topic"]

log = logging.getLogger(__name__)

DUPLICATE = Position(-1, -1)
"""The position a duplicate send is acknowledged with (Pulsar answers -1:-1)."""


class Topic:
    """One loaded topic; all methods run on the broker's event loop."""

    def __init__(self, name: TopicName, ledger: ManagedLedger, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.ledger = ledger
        self.compacted = CompactedTopic.restore(ledger)
        self.subscriptions: dict[str, Subscription] = {}
        self.producer_count = 0  # producers attached over connections
        self._last_sequence_ids: dict[str, int] = {}
        self._loop = loop
        self._dispatch_scheduled = False
        ManagedCursor.open_durable(ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST)
        self._dedup = Deduplication(ledger)
        self.closed = False
        ledger.add_listener(self._on_durable)

    # -- publishing ---------------------------------------------------------------------

    def last_sequence_id(self, producer_name: str) -> int:
        """Highest sequence id sent by ``producer_name`` (durable or in flight); -1 if none."""
        return self._last_sequence_ids.get(producer_name, self._dedup.sequence_ids.get(producer_name, -1))

    def publish(self, producer_name: str, highest_sequence_id: int, entry: bytes) -> Future[Position]:
        """Append ``entry``; a duplicate resolves at once to ``DUPLICATE``."""
        if highest_sequence_id <= self.last_sequence_id(producer_name):
            duplicate: Future[Position] = Future()
            duplicate.set_result(DUPLICATE)
            return duplicate
        self._last_sequence_ids[producer_name] = highest_sequence_id
        future = self.ledger.append(entry)
        future.add_done_callback(lambda done: self._loop.call_soon_threadsafe(
            self._appended, done, producer_name, highest_sequence_id))
        return future

    def _appended(self, done: Future[Position], producer_name: str, sequence_id: int) -> None:
        """On the loop: a durable entry enters the de-duplication state; a failed one is
        forgotten, so the client's resend is not taken for a duplicate."""
        if self.closed:
            return  # replayed from the log at the next load
        if done.exception() is None:
            self._dedup.durable(producer_name, sequence_id, done.result())
        elif self._last_sequence_ids.get(producer_name) == sequence_id:
            del self._last_sequence_ids[producer_name]

    def _on_durable(self, position: Position) -> None:
        """Listener on the flusher thread: schedule one dispatch round on the loop."""
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            self._loop.call_soon_threadsafe(self._dispatch_all)

    def _dispatch_all(self) -> None:
        self._dispatch_scheduled = False
        for subscription in list(self.subscriptions.values()):
            subscription.dispatch()

    # -- subscribing --------------------------------------------------------------------

    def subscribe(
        self, subscription_name: str, consumer: Consumer, sub_type: SubType, *,
        durable: bool = True, initial_position: InitialPosition = InitialPosition.LATEST,
        start: Position | None = None, read_compacted: bool = False,
    ) -> Subscription:
        """Attach ``consumer`` to ``subscription_name`` (created when missing)."""
        if subscription_name in (COMPACTION_SUBSCRIPTION, DEDUP_CURSOR):
            raise NotAllowedError(f"the {subscription_name} subscription is internal to the broker")
        if read_compacted and sub_type is SubType.SHARED:
            raise NotAllowedError("readCompacted only allowed on failover or exclusive subscriptions")
        subscription = self.subscriptions.get(subscription_name)
        if subscription is None:
            subscription = self._create_subscription(
                subscription_name, sub_type, durable, initial_position, start, read_compacted)
        elif durable and initial_position is InitialPosition.EARLIEST and not subscription.sought \
                and subscription.cursor.mark_delete_position.entry_id == -1:
            subscription.first_read_from_earliest = True  # #21187: nothing acked in the raw ledgers left
        subscription.read_compacted = read_compacted
        subscription.add_consumer(consumer, sub_type)
        self.subscriptions[subscription_name] = subscription
        return subscription

    def _create_subscription(
        self, name: str, sub_type: SubType, durable: bool, initial_position: InitialPosition,
        start: Position | None, read_compacted: bool,
    ) -> Subscription:
        if durable:
            cursor = ManagedCursor.open_durable(self.ledger, name, initial_position)
            from_earliest = (initial_position is InitialPosition.EARLIEST
                             and cursor.mark_delete_position.entry_id == -1)
        else:
            start = start if start is not None else (
                EARLIEST if initial_position is InitialPosition.EARLIEST else LATEST)
            cursor = ManagedCursor.open_non_durable(self.ledger, name, start)
            from_earliest = start.ledger_id < 0
        return Subscription(name, cursor, self.compacted, sub_type,
                            read_compacted=read_compacted, first_read_from_earliest=from_earliest)

    def remove_consumer(self, subscription: Subscription, consumer: Consumer) -> None:
        """A consumer closed or vanished; a reader's subscription goes with its last consumer."""
        subscription.remove_consumer(consumer)
        if not subscription.consumers and not subscription.cursor.durable:
            self.subscriptions.pop(subscription.name, None)
        subscription.dispatch()

    def unsubscribe(self, subscription: Subscription, consumer: Consumer) -> None:
        """Delete the subscription; only its sole consumer may."""
        if subscription.consumers != [consumer]:
            raise NotAllowedError(f"subscription {subscription.name} has other consumers")
        subscription.remove_consumer(consumer)
        subscription.cursor.delete_durable()
        self.subscriptions.pop(subscription.name, None)

    def delete_subscription(self, name: str) -> None:
        """Admin delete of a subscription (``__compaction`` drops the compacted view)."""
        if name == COMPACTION_SUBSCRIPTION:
            self.compacted.drop_view()
            return
        subscription = self.subscriptions.pop(name, None)
        if subscription is None and name not in self.ledger.metadata.list_cursors(str(self.name)):
            raise SubscriptionNotFoundError(f"subscription {name} not found")
        for consumer in list(subscription.consumers if subscription else []):
            consumer.disconnect()
        self.ledger.metadata.delete_cursor(str(self.name), name)

    def close(self) -> None:
        """Seal the current ledger; the topic takes no more appends."""
        self.ledger.remove_listener(self._on_durable)
        self.ledger.close()  # pending appends complete first; their callbacks are queued
        self._dedup.snapshot()
        self.closed = True

    def producers_connected(self) -> bool:
        """True while a producer is attached."""
        return self.producer_count > 0

    def delete(self) -> None:
        """Delete the topic: compacted view and ledger, then every ledger and cursor."""
        self.ledger.remove_listener(self._on_durable)
        self.closed = True
        self.compacted.delete()
