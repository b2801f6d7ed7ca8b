"""A loaded topic in the broker: its log, compaction state, subscriptions and producers.

* **Publishing** appends the entry bytes verbatim; the returned future resolves to the
  position once the entry is durable, or fails (the wire answers SEND_ERROR) when the
  append fails — also when it fails at once, e.g. on a fenced ledger. ``publish`` never
  raises.
* **Producers** are registered by name: a second producer with a name already attached
  is refused (``ProducerBusyError``), as Pulsar does.
* **De-duplication** (``api.broker.dedup``) is off unless enabled for the topic (broker
  setting, namespace or topic policy); ``set_deduplication`` turns it on or off at run time.
  ``switch_deduplication`` (a policy changed through the admin) starts its state (the
  cursor's creation, a replay) on a worker thread; meanwhile the topic holds every send
  and appends them in order through de-duplication once it has started (as Pulsar holds
  producers while de-duplication initialises), so no send of the switch is stored
  unchecked and none is lost; a failed start leaves it off (the held sends are stored).
* **Subscribing** creates durable subscriptions (a persisted cursor, ``initial_position``
  used only on creation) or non-durable ones (readers: a cursor in memory, positioned at
  the start message id inclusive — the client filters what it does not want).
* **Acknowledgements persist on a schedule.** A durable subscription's cursor is
  ``deferred``: an ack changes the cursor in memory and is written by the cursor store's
  background thread, at most ``managed_ledger_mark_delete_rate_limit`` times a second per
  cursor (``cursor.store``), never on the event loop. When a subscription's last consumer
  leaves, its state is written at once (in the background); ``close`` makes every queued
  state of the topic due now and returns a future of their write, ``delete`` forgets
  them, so a clean stop loses no acknowledgement and a deleted topic gets no cursor row back.
* **No cursor commit on the event loop.** A subscription's creation, a seek, an
  unsubscribe and a subscription delete change memory and queue the cursor's new state
  (or deletion) for the store's thread; the caller answers once ``cursor.when_written()`` (or
  the future ``delete_subscription`` returns) resolves, so an answered subscribe, seek or
  unsubscribe is durable. The de-duplication cursor's snapshots are queued the same way
  (a snapshot lost in a crash only means a longer replay at the next load).
* The ``__compaction`` cursor is created with the topic (by ``CompactedTopic.restore``,
  which owns it), at the earliest entry, so that nothing is trimmed before a compaction has
  covered it (Pulsar only pre-creates it when a compaction threshold is set; compactd
  always does).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from dataclasses import dataclass

from api.broker.access_mode import TopicAccess
from api.broker.dedup import DEDUP_CURSOR, Deduplication, ProducerSession, Send, describe_send
from api.broker.dispatch import Consumer, Subscription, SubType
from api.broker.errors import NotAllowedError, ProducerBusyError, SubscriptionNotFoundError
from api.broker.off_loop import submit_off_loop
from api.broker.topic_name import TopicName
from api.broker.topic_stats import TopicCounters
from compactor.view.topic import COMPACTION_SUBSCRIPTION, CompactedTopic
from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.managed_ledger import ManagedLedger
from ledger.position import EARLIEST, LATEST, Position

__all__ = ["Topic"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _HeldSend:
    """A send held while de-duplication starts: ``publish``'s arguments."""

    args: tuple[ProducerSession, str, int, int, bytes]
    messages: int


def _chain(source: Future[Position], target: Future[Position]) -> None:
    """``target`` settles as ``source`` does."""
    def settle(done: Future[Position]) -> None:
        error = done.exception()
        if error is None:
            target.set_result(done.result())
        else:
            target.set_exception(error)

    source.add_done_callback(settle)


class Topic:
    """One loaded topic; all methods run on the broker's event loop."""

    def __init__(self, name: TopicName, ledger: ManagedLedger, loop: asyncio.AbstractEventLoop,
                 *, cursors: CursorStore, deduplication: bool = False,
                 compacted_grace_period_s: float = 0.0) -> None:
        self.name = name
        self.ledger = ledger
        self.cursors = cursors  # where the topic's durable cursors persist
        self.compacted = CompactedTopic.restore(ledger, cursors, create_cursor=True,
                                                grace_period_s=compacted_grace_period_s)
        self.subscriptions: dict[str, Subscription] = {}
        self.producers: dict[str, object] = {}  # producer name -> its owner (a wire producer)
        self.access = TopicAccess()  # producer access modes (api.broker.access_mode)
        self._loop = loop
        self._dispatch_scheduled = False
        self.dedup: Deduplication | None = None
        self._dedup_wanted = deduplication
        self._held: list[tuple[_HeldSend, Future[Position]]] | None = None  # sends held while dedup starts
        self._dedup_starting: asyncio.Future[None]  # set with _held
        self._set_deduplication_now(deduplication)
        self.closed = False
        self.counters = TopicCounters()  # messages in and out since the topic was loaded
        ledger.add_listener(self._on_durable)

    # -- producers ----------------------------------------------------------------------

    def attach_producer(self, name: str, owner: object) -> None:
        """Register producer ``name``; ``ProducerBusyError`` when another owner has it."""
        holder = self.producers.get(name)
        if holder is not None and holder is not owner:
            raise ProducerBusyError(f"Producer with name '{name}' is already connected to topic {self.name}")
        self.producers[name] = owner

    def detach_producer(self, name: str, owner: object) -> None:
        """Forget producer ``name`` if ``owner`` still holds it."""
        if self.producers.get(name) is owner:
            del self.producers[name]
        self.access.detached(owner, producers_left=bool(self.producers))

    def producers_connected(self) -> bool:
        """True while a producer is attached."""
        return bool(self.producers)

    # -- publishing ---------------------------------------------------------------------

    def set_deduplication(self, enabled: bool) -> None:
        """Turn de-duplication on (state loaded, or started at the end of the log) or off
        (its cursor deleted), on the caller's thread (``switch_deduplication``: off the loop)."""
        self._dedup_wanted = enabled
        if self._held is None:  # else starting: its end applies what is wanted then
            self._set_deduplication_now(enabled)

    def switch_deduplication(self, enabled: bool) -> asyncio.Future[None]:
        """On the loop: ``set_deduplication`` with the start (its cursor's creation, a
        replay) on a worker thread while sends are held; a future of the switch's end."""
        self._dedup_wanted = enabled
        if self._held is not None:  # starting: its end applies what is wanted then
            return self._dedup_starting
        if enabled and self.dedup is None:
            self._held = []
            self._dedup_starting = self._loop.create_task(self._start_deduplication())
            return self._dedup_starting
        if not enabled:
            self._set_deduplication_now(False)
        done: asyncio.Future[None] = self._loop.create_future()
        done.set_result(None)
        return done

    @property
    def deduplication_starting(self) -> bool:
        """De-duplication is starting off the loop (sends are held meanwhile)."""
        return self._held is not None

    async def deduplication_settled(self) -> None:
        """Wait for a de-duplication start in flight to end: a close or a delete of the
        topic, and a producer's PRODUCER_SUCCESS (its ``last_sequence_id``), come after it."""
        if self._held is not None and self._dedup_starting is not None:
            await asyncio.shield(self._dedup_starting)

    async def _start_deduplication(self) -> None:
        """Start de-duplication off the loop, then append the sends held meanwhile."""
        dedup: Deduplication | None = None
        try:
            dedup = await asyncio.to_thread(Deduplication, self.ledger, self.cursors)
        except Exception as error:  # noqa: BLE001 - it stays off; the next policy change tries again
            log.warning("topic %s: de-duplication could not start: %s", self.name, error)
        held, self._held = self._held or [], None
        if dedup is not None:
            if not self._dedup_wanted:
                dedup.delete()
            elif not self.closed:  # closed: the next load replays it
                self.dedup = dedup
        for send, future in held:
            _chain(self.publish(*send.args, messages=send.messages), future)

    def _set_deduplication_now(self, enabled: bool) -> None:
        if enabled and self.dedup is None:
            self.dedup = Deduplication(self.ledger, self.cursors)
        elif not enabled:
            if self.dedup is not None:
                self.dedup.delete()
            elif DEDUP_CURSOR in self.cursors.list(self.ledger.name):
                self.cursors.delete_later(self.ledger.name, DEDUP_CURSOR)
            self.dedup = None

    def last_sequence_id(self, producer_name: str) -> int:
        """What PRODUCER_SUCCESS answers: the highest sequence id pushed by the producer
        when de-duplication is on; -1 when it is off (as Pulsar)."""
        return self.dedup.last_sequence_id(producer_name) if self.dedup is not None else -1

    def publish(self, session: ProducerSession, producer_name: str, sequence_id: int, highest_sequence_id: int,
                entry: bytes, *, messages: int = 1) -> Future[Position]:
        """Append ``entry`` (``messages`` messages: a batch's count) sent by ``producer_name``
        in ``session``; the future resolves to where it is stored (for a re-send that
        de-duplication recognises: where the original is) or fails. Stored messages count
        in ``counters`` once durable."""
        if self._held is not None:  # de-duplication is starting: appended once it has
            held: Future[Position] = Future()
            self._held.append((_HeldSend((session, producer_name, sequence_id, highest_sequence_id, entry), messages),
                               held))
            return held
        dedup = self.dedup
        if dedup is None:
            return self._counted(self._append(entry), messages, len(entry))
        send = describe_send(producer_name, sequence_id, highest_sequence_id, entry)
        duplicate = dedup.find_duplicate(session, send)
        if duplicate is not None:
            return duplicate
        appended = self._counted(self._append(entry), messages, len(entry))
        future: Future[Position] = Future()  # resolved on the loop, after the bookkeeping
        dedup.pushed_send(send, future)
        if appended.done():  # refused at once: settle now, before the next send is taken
            self._appended(dedup, appended, send, future)
        else:
            appended.add_done_callback(lambda done: self._loop.call_soon_threadsafe(
                self._appended, dedup, done, send, future))
        return future

    def _append(self, entry: bytes) -> Future[Position]:
        try:
            return self.ledger.append(entry)
        except Exception as error:  # noqa: BLE001 - a refused append is a failed send, never silence
            failed: Future[Position] = Future()
            failed.set_exception(error)
            return failed

    def _counted(self, appended: Future[Position], messages: int, size: int) -> Future[Position]:
        """``appended``, whose messages count in once it succeeds."""
        def count(done: Future[Position]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.counters.record_in(messages, size)

        appended.add_done_callback(count)
        return appended

    def _appended(self, dedup: Deduplication, done: Future[Position], send: Send, future: Future[Position]) -> None:
        """On the loop: a durable entry enters the de-duplication state; a failed one is
        forgotten, so the client's re-send is stored; then ``future`` tells the sender."""
        error = done.exception()
        if not self.closed and dedup is self.dedup:  # else: replayed from the log at the next load
            if error is None:
                dedup.durable(send, done.result(), future)
            else:
                dedup.failed(send, future)
        if error is None:
            future.set_result(done.result())
        else:
            future.set_exception(error)

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
        if read_compacted and sub_type in (SubType.SHARED, SubType.KEY_SHARED):
            raise NotAllowedError("readCompacted only allowed on failover or exclusive subscriptions")
        subscription = self.subscriptions.get(subscription_name)
        if subscription is None:
            subscription = self._create_subscription(
                subscription_name, sub_type, durable, initial_position, start, read_compacted)
        elif durable:  # the first-read rule again (#21187: nothing acked in the raw ledgers left)
            subscription.reader.subscribing(initial_position is InitialPosition.EARLIEST)
        subscription.read_compacted = read_compacted
        subscription.add_consumer(consumer, sub_type)
        self.subscriptions[subscription_name] = subscription
        return subscription

    def _create_subscription(
        self, name: str, sub_type: SubType, durable: bool, initial_position: InitialPosition,
        start: Position | None, read_compacted: bool,
    ) -> Subscription:
        if durable:
            cursor = ManagedCursor.open_durable(self.ledger, name, initial_position, store=self.cursors,
                                                deferred=True)
            from_earliest = initial_position is InitialPosition.EARLIEST
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
        if not subscription.consumers:
            if subscription.cursor.durable:
                subscription.cursor.flush_soon()
            else:
                self.subscriptions.pop(subscription.name, None)
        subscription.dispatch()

    def unsubscribe(self, subscription: Subscription, consumer: Consumer) -> None:
        """Delete the subscription; only its sole consumer may. The deletion is queued:
        ``subscription.cursor.when_written()`` tells when it is durable."""
        if subscription.consumers != [consumer]:
            raise NotAllowedError(f"subscription {subscription.name} has other consumers")
        subscription.remove_consumer(consumer)
        subscription.cursor.delete_durable()
        self.subscriptions.pop(subscription.name, None)

    def delete_subscription(self, name: str) -> Future[None]:
        """Admin delete of a subscription; a future of the moment the deletion is durable
        (written by the cursor store's thread). ``__compaction`` drops the compacted view:
        out of memory now, its transaction and files on the metadata writer thread
        (``CompactedTopic.detach_view``)."""
        if name == COMPACTION_SUBSCRIPTION:
            if name not in self.cursors.list(str(self.name)):  # deleted, not opened again by a run yet
                raise SubscriptionNotFoundError(f"subscription {name} not found")
            return submit_off_loop(self.compacted.detach_view())
        subscription = self.subscriptions.pop(name, None)
        if subscription is None and name not in self.cursors.list(str(self.name)):
            raise SubscriptionNotFoundError(f"subscription {name} not found")
        for consumer in list(subscription.consumers if subscription else []):
            consumer.disconnect()
        self.cursors.delete_later(str(self.name), name)
        self.counters.forget(name)
        return self.cursors.when_written(str(self.name), name)

    def close(self) -> Future[None]:
        """Seal the current ledger; the topic takes no more appends; the queued cursor
        states of its subscriptions are made due now: the future resolves once they are
        written (or fails: the broker's stop tries again)."""
        self.ledger.remove_listener(self._on_durable)
        self.ledger.close()  # pending appends complete first; their callbacks are queued
        return self.closed_ledger()

    async def close_off_loop(self) -> None:
        """``close`` with the seal (its fsyncs and metadata commit) on a worker thread and
        the cursor writes on the store's, awaited: for the broker's stop, once no client
        can reach the topic (raises as ``close``'s future). A de-duplication start and a
        ``__compaction`` deletion in flight end first."""
        await self.deduplication_settled()
        self.ledger.remove_listener(self._on_durable)
        await asyncio.to_thread(self._seal)
        await asyncio.wrap_future(self.closed_ledger())

    def _seal(self) -> None:
        self.compacted.wait_for_drop()  # else a load right after could restore the dropped view
        self.ledger.close()

    def closed_ledger(self) -> Future[None]:
        """What ``close`` does once the ledger is sealed (the broker's stop seals it off
        the loop): the last de-duplication snapshot and the cursor states, queued; the
        future of their write."""
        if self.dedup is not None:
            self.dedup.snapshot()
        self.closed = True
        return self.cursors.flush_later(str(self.name))

    def delete(self) -> None:
        """Delete the topic: compacted view and ledger, then every ledger and cursor."""
        self.ledger.remove_listener(self._on_durable)
        self.cursors.discard(str(self.name))
        self.closed = True
        self.compacted.delete()
