"""Admin operations on a topic's subscriptions and on its loading: what ``pulsar-admin
topics`` does beyond create, delete and compact.

``TopicOperations`` works over the ``Admin`` core (``api.broker.admin``) and raises the
broker's typed errors; the REST router ``api.routers.subscriptions`` only parses and shapes.

* ``stats``: Pulsar's ``TopicStats`` — counters and rates in and out (messages, not
  entries: ``api.broker.topic_stats``), the connected publishers and each subscription's
  consumers with their figures (readers' non-durable subscriptions too, ``isDurable``
  false), backlog, storage size and the compaction section.
* ``subscriptions``: the topic's subscription names (``__compaction`` among them, the
  de-duplication cursor not).
* ``peek``: the ``n``-th entry (1-based) a subscription has not acknowledged, after its
  mark-delete position, skipping individually acknowledged ones; it moves nothing.
* ``reset_cursor``: move a subscription to a position (a message id, or the first message
  published at or after a time). A subscription with consumers is sought as a client SEEK
  does (its consumers are disconnected and subscribe again from there).
* ``skip_all``: acknowledge everything published so far (``clear-backlog``).
* ``reset_cursor`` and ``skip_all`` return a future of the moment what they changed in a
  cursor is durable: the cursor store's thread commits it, never the event loop; the REST
  layer answers once it resolves.
* ``unload`` (a coroutine): disconnect the topic's producers and consumers (clients
  reconnect), drop it from the registry and seal its ledger off the loop; it returns once
  the seal and the cursor states are durable; the next use loads it again. Refused while
  a compaction of the topic is in flight.
* ``last_message_id``: the last stored message's id (a batch's last slot).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from api.broker.dedup import DEDUP_CURSOR
from api.broker.errors import PreconditionFailedError, SubscriptionNotFoundError
from api.broker.seek import find_by_publish_time
from api.broker.topic_stats import TopicCounters
from compactor.errors import CompactionInProgressError, MalformedEntryError
from cursor.cursor import ManagedCursor
from cursor.errors import CursorError
from ledger.position import Position
from message.entry import decoded_payload, is_batch, parse_entry, partition_key_of

if TYPE_CHECKING:
    from api.broker.registry import TopicRegistry
    from api.broker.topic import Topic
    from compactor.runs.runs import CompactionRuns

__all__ = ["AdminCore", "PeekedEntry", "TopicOperations", "shown_name"]

log = logging.getLogger(__name__)

PEEK_READ_ENTRIES = 100  # entries read at once while looking for the n-th unacknowledged one


class _Described(Protocol):
    def describe(self) -> dict[str, object]: ...


class _Broker(Protocol):
    registry: TopicRegistry
    runs: CompactionRuns

    async def unload_topic(self, topic: Topic) -> None: ...


class AdminCore(Protocol):
    """What these operations need of ``api.broker.admin.Admin`` (named here so that this
    module does not import it: ``Admin.stats`` calls this module)."""

    @property
    def broker(self) -> _Broker: ...

    def topic(self, text: str) -> Topic:
        """The existing topic ``text`` (loaded if needed); ``TopicNotFoundError`` otherwise."""


@dataclass(frozen=True, slots=True)
class PeekedEntry:
    """One entry as peek answers it: its position, its message metadata and payload
    (decompressed; a batch's whole body, ``batch_size`` its slot count)."""

    position: Position
    publish_time_ms: int
    producer_name: str
    key: str | None
    properties: dict[str, str]
    batch_size: int | None
    payload: bytes


class TopicOperations:
    """Subscription and load operations over one ``Admin``; call on the broker's loop."""

    def __init__(self, admin: AdminCore) -> None:
        self.admin = admin

    # -- stats ----------------------------------------------------------------------------

    def stats(self, text: str) -> dict[str, Any]:
        """Pulsar's ``TopicStats`` of the existing topic ``text``."""
        topic = self.admin.topic(text)
        counters = topic.counters
        readers = sorted(name for name, s in topic.subscriptions.items() if not s.cursor.durable)
        subscriptions = {shown_name(name): self._subscription_stats(topic, name)
                         for name in [*self.subscription_names(topic), *readers]}
        record = topic.compacted.record
        return {
            **counters.in_fields(), **counters.out_fields(counters.message_out),
            "storageSize": topic.ledger.total_size,
            "offloadedStorageSize": sum(r.size_bytes for r in topic.ledger.ledger_list() if r.offloaded),
            "backlogSize": max((s["backlogSize"] for s in subscriptions.values()), default=0),
            "publishers": [_describe(owner) or {"producerName": name, "producerId": -1, "msgRateIn": 0.0,
                                                "msgThroughputIn": 0.0}
                           for name, owner in topic.producers.items()],
            "waitingPublishers": 0,
            "subscriptions": subscriptions,
            "replication": {},
            "deduplicationStatus": "Enabled" if topic.dedup is not None else "Disabled",
            "compaction": {
                "lastCompactionRemovedEventCount": record.last_removed_events,
                "lastCompactionSucceedTimestamp": record.last_success_ms,
                "lastCompactionFailedTimestamp": record.last_failure_ms,
                "lastCompactionDurationTimeInMills": record.last_duration_ms,
            },
        }

    def _subscription_stats(self, topic: Topic, name: str) -> dict[str, Any]:
        cursor = self._cursor(topic, name)
        live = topic.subscriptions.get(name)
        consumers = [_describe(c) or {"consumerName": c.name} for c in (live.consumers if live else [])]
        return {
            **TopicCounters.out_fields(topic.counters.subscription(name)),
            "msgBacklog": cursor.backlog_entries(),
            "backlogSize": cursor.estimated_backlog_bytes(),
            "type": live.sub_type.pulsar_name if live else "Exclusive",
            "msgDelayed": live.delayed_count if live else 0,
            "isDurable": live.cursor.durable if live else True,
            "isReplicated": False,
            "consumers": consumers,
        }

    # -- subscriptions ------------------------------------------------------------------

    def subscriptions(self, text: str) -> list[str]:
        """The topic's subscription names (``__compaction`` included), as ``shown_name``."""
        return [shown_name(name) for name in self.subscription_names(self.admin.topic(text))]

    @staticmethod
    def subscription_names(topic: Topic) -> list[str]:
        """The durable subscriptions' names as stored (one stored by an old broker may be
        bytes), in the order of their shown names."""
        names = set(topic.cursors.list(str(topic.name)))
        names |= {name for name, s in topic.subscriptions.items() if s.cursor.durable}
        names.discard(DEDUP_CURSOR)
        return sorted(names, key=shown_name)

    def _existing(self, text: str, subscription: str) -> tuple[Topic, ManagedCursor]:
        """The topic and the cursor of the subscription shown as ``subscription``."""
        topic = self.admin.topic(text)
        stored = {shown_name(name): name for name in self.subscription_names(topic)}
        if subscription not in stored:
            raise SubscriptionNotFoundError(f"Subscription {subscription} not found on {topic.name}")
        return topic, self._cursor(topic, stored[subscription])

    @staticmethod
    def _cursor(topic: Topic, name: str) -> ManagedCursor:
        """The live subscription's cursor, else the persisted one, deferred as a live one
        (what it is asked to persist goes to the cursor store's thread)."""
        live = topic.subscriptions.get(name)
        if live is not None:
            return live.cursor
        return ManagedCursor.open_durable(topic.ledger, name, store=topic.cursors, deferred=True)

    def peek(self, text: str, subscription: str, n: int) -> PeekedEntry:
        """The ``n``-th unacknowledged entry of ``subscription`` (1-based)."""
        if n < 1:
            raise PreconditionFailedError(f"message position {n} is not valid: it starts at 1")
        topic, cursor = self._existing(text, subscription)
        ledger = topic.ledger
        position = ledger.next_valid_position(cursor.mark_delete_position)
        seen = 0
        while True:
            entries = ledger.read_entries(position, PEEK_READ_ENTRIES)
            if not entries:
                raise SubscriptionNotFoundError(
                    f"Message position {n} of subscription {subscription} is past the end of {topic.name}")
            for entry in entries:
                if not cursor.is_acknowledged(entry.position):
                    seen += 1
                    if seen == n:
                        return _peeked(entry.position, entry.data)
            position = ledger.next_valid_position(entries[-1].position)

    def reset_cursor(self, text: str, subscription: str, *, timestamp_ms: int | None = None,
                     position: Position | None = None, excluded: bool = False) -> Future[None]:
        """Move ``subscription`` to ``position`` (``excluded``: just after it) or to the first
        message published at or after ``timestamp_ms``; a future of the moment the new
        position is durable (the cursor store's thread writes it)."""
        topic, cursor = self._existing(text, subscription)
        if timestamp_ms is not None:
            target = find_by_publish_time(topic.ledger, timestamp_ms)
        else:
            assert position is not None
            target = topic.ledger.next_valid_position(position) if excluded else position.entry_position()
        live = topic.subscriptions.get(subscription)
        if live is not None:
            live.seek(target)  # its consumers are disconnected and subscribe again
        else:
            cursor.reset(target)
        log.info("subscription %s of %s reset to %s", subscription, topic.name, target)
        return cursor.when_written()

    def skip_all(self, text: str, subscription: str) -> Future[None]:
        """Acknowledge every message stored so far (``clear-backlog``); a future of the
        moment that is durable."""
        topic, cursor = self._existing(text, subscription)
        last = topic.ledger.last_confirmed_position()
        if last.entry_id < 0 or last <= cursor.mark_delete_position:
            return cursor.when_written()
        live = topic.subscriptions.get(subscription)
        try:
            if live is not None:
                live.acknowledge([last], cumulative=True)
                live.dispatch()
            else:
                cursor.mark_delete(last)
        except CursorError as error:
            raise PreconditionFailedError(f"cannot clear the backlog of {subscription}: {error}") from None
        return cursor.when_written()

    # -- the topic ------------------------------------------------------------------------

    async def unload(self, text: str) -> None:
        """Disconnect the topic's clients, drop it from the registry and close it: its seal
        on a worker thread and its queued cursor states by the cursor store's thread, both
        awaited (``BrokerService.unload_topic``: a load of the topic meanwhile waits for the
        close, then opens it again)."""
        topic = self.admin.topic(text)
        name = str(topic.name)
        broker = self.admin.broker
        if broker.runs.in_flight(name):
            raise CompactionInProgressError(f"Compaction of {name} is in progress; unload it afterwards")
        loaded = broker.registry.get(name)
        if loaded is None:
            return
        for owner in list(loaded.producers.values()):
            disconnect = getattr(owner, "disconnect", None)
            if disconnect is not None:
                disconnect()
        for subscription in list(loaded.subscriptions.values()):
            for consumer in list(subscription.consumers):
                consumer.disconnect()
                subscription.remove_consumer(consumer)
        await broker.unload_topic(loaded)
        log.info("topic %s unloaded", name)

    def last_message_id(self, text: str) -> dict[str, int]:
        """Pulsar's ``MessageIdImpl`` of the last stored message (``batchIndex`` for a batch)."""
        topic = self.admin.topic(text)
        last = topic.ledger.last_confirmed_position()
        answer = {"ledgerId": last.ledger_id, "entryId": last.entry_id, "partitionIndex": -1}
        if last.entry_id >= 0:
            entries = topic.ledger.read_entries(last, 1)
            size = _batch_size(entries[0].data) if entries else None
            if size is not None:
                answer["batchIndex"] = size - 1
        return answer


def shown_name(name: object) -> str:
    """A stored name as stats show it: text as is, bytes decoded with bad bytes escaped."""
    if isinstance(name, bytes):
        return name.decode("utf-8", "backslashreplace")
    return str(name)


def _describe(owner: object) -> dict[str, object]:
    describe = getattr(owner, "describe", None)
    if describe is None:
        return {}
    described: _Described = owner  # type: ignore[assignment]
    return described.describe()


def _batch_size(data: bytes) -> int | None:
    try:
        metadata = parse_entry(data).metadata
    except MalformedEntryError:
        return None
    return metadata.num_messages_in_batch if is_batch(metadata) else None


def _peeked(position: Position, data: bytes) -> PeekedEntry:
    try:
        parsed = parse_entry(data)
        payload = decoded_payload(parsed)
    except MalformedEntryError:
        return PeekedEntry(position, 0, "", None, {}, None, data)
    metadata = parsed.metadata
    return PeekedEntry(
        position, metadata.publish_time, metadata.producer_name, partition_key_of(metadata),
        {pair.key: pair.value for pair in metadata.properties},
        metadata.num_messages_in_batch if is_batch(metadata) else None, payload,
    )
