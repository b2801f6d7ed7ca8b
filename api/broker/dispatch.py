"""Subscriptions and dispatch: which consumer gets which entry, under FLOW permits.

A consumer, to the core, is anything with permits that accepts deliveries (``Consumer``);
the wire layer implements it over a connection, tests implement it in memory. Rules
(reference ``managed-ledger.md`` §4, ``pulsar-protocol.md`` §2):

* **Permits count messages.** A batch entry uses as many permits as it has slots; an entry
  is never split, so permits may go negative until the next FLOW.
* **Exclusive**: one consumer (a second is refused with ConsumerBusy). **Failover**: several,
  one active — the first connected among the best priority level; every consumer hears
  ``set_active``. When the active consumer changes, or one (re)connects, the cursor rewinds
  so everything unacknowledged is delivered again from the mark-delete position.
* **Shared**: round robin over consumers with permits; each delivered position is pending
  on its consumer until acknowledged; a consumer that leaves has its pending positions
  replayed to the others, before any new entry; when the last one has left, the next
  consumer starts again from the mark-delete position.
* **Key_Shared**: Shared's rules, with the consumer of each entry chosen by its key and
  per-key order kept across joins and leaves (``api.broker.key_shared``, which owns its
  pending and held entries). Cumulative acks are refused.
* **Delayed delivery** (Shared and Key_Shared): an entry not yet due is indexed and
  skipped, and delivered like a replayed entry once due (``api.broker.delayed``).
* **Bounded rounds.** Whatever permits a consumer grants (up to 2**32 - 1), one call of
  ``dispatch`` sends at most ``DISPATCH_ROUND_ENTRIES_MAX`` entries and about
  ``DISPATCH_ROUND_BYTES_MAX`` bytes, reading in slices sized from the entries seen so
  far; when permits and entries remain, the next round is scheduled on the event loop, so
  other connections and the REST API are served in between. A consumer that is not
  ``writable`` (its connection's write buffer is over its high-water mark) gets nothing
  until its connection drains and dispatches again, so what waits for a slow consumer is
  bounded by its transport's buffer, not by its permits.
* **Reading** goes through the subscription's ``compactor.view.reader.CompactedReader``, which
  owns where the subscription reads: rewinds, seeks, and for **read-compacted**
  subscriptions (Exclusive and Failover only) the first-read-from-earliest rule, the
  sought position, the read position and index in the topic's compacted view (then the raw
  tail), and the surviving-slot masks (``ack_set``) sent with compacted batches, which
  decide what a batch-index ack acknowledges (``acknowledge_message_ids``). Their acks are
  kept like any other: compacted entries already acknowledged are skipped, and the cursor
  counts compacted entries whose raw ledgers were trimmed as entries, so a re-subscribe or
  a restart delivers exactly what was not acknowledged. The subscription itself keeps no
  read state but Shared's pending and replayed positions.
* **A corrupt entry is never served, never skipped.** A read that fails (a record whose
  CRC32C does not match: ``CorruptEntryError``) stops dispatch of that subscription where
  it is, logged once; its consumers get nothing past it until the subscription is moved
  (seek, reset) or the data is repaired. Other subscriptions and topics are not affected.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterable, Sequence

from api.broker.consumer import Consumer, Delivery
from api.broker.delayed import DelayedDeliveryTracker
from api.broker.entry_facts import entry_facts
from api.broker.errors import ConsumerBusyError, NotAllowedError
from api.broker.key_shared import KeySharedDispatcher, KeySharedPolicy
from compactor.view.reader import CompactedReader
from compactor.view.topic import CompactedTopic
from cursor.cursor import ManagedCursor
from cursor.errors import CursorError
from ledger.errors import LedgerError
from ledger.position import Position
from message.entry import MESSAGE_BYTES_MAX

__all__ = ["Consumer", "Delivery", "SubType", "Subscription"]

log = logging.getLogger(__name__)

# Pulsar's dispatcherMaxReadBatchSize: entries read at once.
DISPATCH_ENTRIES_MAX = 100
# One dispatch round sends at most this much before yielding to the event loop (Pulsar's
# dispatcherMaxReadSizeBytes is 5 MB a read).
DISPATCH_ROUND_ENTRIES_MAX = 1000
DISPATCH_ROUND_BYTES_MAX = 5 * 1024 * 1024
# Size assumed for an entry before any was read: the largest a client may send, so the
# first read of a subscription is one entry and the next ones are sized from what came.
ENTRY_BYTES_ASSUMED = MESSAGE_BYTES_MAX


class SubType(enum.Enum):
    """Subscription types compactd dispatches (the wire's ``CommandSubscribe.SubType``)."""

    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3

    @property
    def pulsar_name(self) -> str:
        """The name Pulsar's stats show (``Key_Shared``, ``Shared``...)."""
        return "Key_Shared" if self is SubType.KEY_SHARED else self.name.capitalize()


# Several consumers at once, each entry to one of them; delayed delivery applies.
_MULTI = (SubType.SHARED, SubType.KEY_SHARED)


class _Round:
    """What one dispatch round may still send."""

    __slots__ = ("bytes_left", "entries_left")

    def __init__(self) -> None:
        self.entries_left = DISPATCH_ROUND_ENTRIES_MAX
        self.bytes_left = DISPATCH_ROUND_BYTES_MAX

    @property
    def spent(self) -> bool:
        return self.entries_left <= 0 or self.bytes_left <= 0

    def charge(self, delivery: Delivery) -> None:
        self.entries_left -= 1
        self.bytes_left -= len(delivery.data)


class Subscription:
    """One subscription of a topic: its cursor, its consumers, and dispatch.

    ``first_read_from_earliest``: the subscribing consumer asked for the earliest message;
    whether its first read takes the whole compacted view is the reader's rule
    (``CompactedReader.subscribing``). Every read, rewind and seek goes through ``reader``.
    """

    def __init__(
        self, name: str, cursor: ManagedCursor, compacted: CompactedTopic, sub_type: SubType,
        *, read_compacted: bool = False, first_read_from_earliest: bool = False,
    ) -> None:
        if read_compacted and sub_type in _MULTI:
            raise NotAllowedError("readCompacted only allowed on failover or exclusive subscriptions")
        self.name = name
        self.cursor = cursor
        self.compacted = compacted
        self.sub_type = sub_type
        self.reader = CompactedReader(compacted, cursor, enabled=read_compacted, from_earliest=first_read_from_earliest)
        self.consumers: list[Consumer] = []
        self._active: Consumer | None = None
        self._pending: dict[Position, Consumer] = {}  # Shared: delivered, not yet acknowledged
        self._replay: set[Position] = set()
        self._redeliveries: dict[Position, int] = {}
        self._round_robin = 0
        self._entry_bytes = ENTRY_BYTES_ASSUMED  # largest entry of the last read
        self._next_round: asyncio.Handle | None = None
        self._stalled_on: str | None = None  # the read error dispatch stopped at, logged once
        self._key_shared: KeySharedDispatcher | None = None
        self._delayed = DelayedDeliveryTracker(self.dispatch)
        self._scan_more = False  # a read passed over a round's worth of delayed entries only

    @property
    def delayed_count(self) -> int:
        """Entries waiting in the delay index (Pulsar's ``msgDelayed``)."""
        return len(self._delayed)

    @property
    def read_compacted(self) -> bool:
        """The consumers read the compacted view (the latest SUBSCRIBE says so)."""
        return self.reader.enabled

    @read_compacted.setter
    def read_compacted(self, value: bool) -> None:
        self.reader.enabled = value

    # -- consumers ----------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer, sub_type: SubType) -> None:
        """Attach ``consumer``; Exclusive refuses a second, types must match."""
        if sub_type is not self.sub_type and self.consumers:
            raise ConsumerBusyError(f"subscription {self.name} is of type {self.sub_type.name}")
        if self.sub_type is SubType.EXCLUSIVE and self.consumers:
            raise ConsumerBusyError("Exclusive consumer is already connected")
        first = not self.consumers
        if sub_type is SubType.KEY_SHARED:  # may refuse: before anything changes
            policy = consumer.key_shared_policy or KeySharedPolicy()
            if first or self._key_shared is None:
                self._key_shared = KeySharedDispatcher(policy, self._reread)
            self._key_shared.add_consumer(consumer, policy)
        elif first:
            self._key_shared = None
        self.sub_type = sub_type
        self.consumers.append(consumer)
        if self.sub_type not in _MULTI:
            self._choose_active()
        elif first:  # what the last consumer left unacknowledged comes again (as in Pulsar)
            self.rewind()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``: its pending positions are replayed (Shared), or the next
        active consumer starts again from the mark-delete position (Failover)."""
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        if self._key_shared is not None:
            self._key_shared.remove_consumer(consumer)
        for position, owner in list(self._pending.items()):
            if owner is consumer:
                del self._pending[position]
                self._replay.add(position)
        if not self.consumers:
            self._replay.clear()
            self._active = None
            if self._key_shared is not None:
                self._key_shared.clear()
        elif self.sub_type not in _MULTI:
            self._choose_active()

    def _choose_active(self) -> None:
        best = min(c.priority_level for c in self.consumers)
        active = next(c for c in self.consumers if c.priority_level == best)
        changed = active is not self._active
        self._active = active
        for consumer in self.consumers:
            consumer.set_active(consumer is active)
        if changed:
            self.rewind()

    def rewind(self) -> None:
        """Deliver everything unacknowledged again, from the mark-delete position on."""
        self.reader.rewind()  # after a seek: from the sought position
        self._delayed.clear()  # delayed and held entries are read again
        if self._key_shared is not None:
            self._key_shared.clear()

    def last_message_id(self) -> Position:
        """``get_last_message_id`` for this subscription's consumers (compacted or raw)."""
        return self.reader.last_message_id()

    # -- dispatch -----------------------------------------------------------------------

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.permits += permits
        self.dispatch()

    def dispatch(self) -> None:
        """Send one bounded round of what permits allow (see "Bounded rounds"); call after
        FLOW, acks, redelivery, new entries and a consumer becoming writable."""
        if self._next_round is not None:
            self._next_round.cancel()
            self._next_round = None
        while self._dispatch_round_or_stall():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a synchronous caller, no event loop: nobody else to serve
                continue
            self._next_round = loop.call_soon(self._run_next_round)
            return

    def _dispatch_round_or_stall(self) -> bool:
        """One round; a read that fails stalls the subscription (see "A corrupt entry")."""
        try:
            more = self._dispatch_round(_Round())
        except LedgerError as error:
            if str(error) != self._stalled_on:
                log.error("subscription %s: dispatch stopped: %s", self.name, error)
            self._stalled_on = str(error)
            return False
        self._stalled_on = None
        return more

    def _dispatch_round(self, budget: _Round) -> bool:
        """One round; True when it ended with permits and entries left."""
        self._scan_more = False
        return self._dispatch_by_type(budget) or self._scan_more

    def _dispatch_by_type(self, budget: _Round) -> bool:
        if self.sub_type is SubType.KEY_SHARED and self._key_shared is not None:
            self._key_shared.hold(self._delayed.pop_due())
            return self._key_shared.dispatch_round(self.consumers, budget, self._read,
                                                   lambda permits: self._read_size(permits, budget))
        if self.sub_type is SubType.SHARED:
            self._replay.update(self._delayed.pop_due())
            return self._dispatch_shared(budget)
        return self._dispatch_active(budget)

    def _dispatch_active(self, budget: _Round) -> bool:
        """Exclusive/Failover; True when the round ended with permits and entries left."""
        active = self._active
        while active is not None and active.permits > 0 and active.writable:
            if budget.spent:
                return True
            deliveries = self._read(self._read_size(active.permits, budget))
            if not deliveries:
                return False
            for delivery in deliveries:
                active.permits -= delivery.messages
                budget.charge(delivery)
                active.send(delivery)
        return False

    def _dispatch_shared(self, budget: _Round) -> bool:
        while True:
            ready = [c for c in self.consumers if c.permits > 0 and c.writable]
            if not ready:
                return False
            if budget.spent:
                return True
            consumer = ready[self._round_robin % len(ready)]
            self._round_robin += 1
            size = self._read_size(consumer.permits, budget)
            deliveries = self._replayed(size) or self._read(size)
            if not deliveries:
                return False
            for delivery in deliveries:
                self._pending[delivery.position] = consumer
                consumer.permits -= delivery.messages
                budget.charge(delivery)
                consumer.send(delivery)

    def _read_size(self, permits: int, budget: _Round) -> int:
        """Entries to read next: within permits and the round, sized from the largest
        entry of the last read so that one read stays near the round's bytes."""
        by_bytes = max(1, budget.bytes_left // max(1, self._entry_bytes))
        return max(1, min(permits, DISPATCH_ENTRIES_MAX, budget.entries_left, by_bytes))

    def _run_next_round(self) -> None:
        self._next_round = None
        self.dispatch()

    def _replayed(self, max_entries: int) -> list[Delivery]:
        out: list[Delivery] = []
        for position in sorted(self._replay)[:max_entries]:
            self._replay.discard(position)
            delivery = self._reread(position, self._redeliveries.get(position, 0))
            if delivery is not None:
                out.append(delivery)
        return out

    def _reread(self, position: Position, redelivery_count: int) -> Delivery | None:
        """Entry ``position`` read again (replay); None when acknowledged or gone."""
        if self.cursor.is_acknowledged(position):
            return None
        entries = self.cursor.ledger.read_entries(position, 1, end=position)
        if not entries:
            return None
        data = entries[0].data
        return Delivery(position, data, entry_facts(data)[0], redelivery_count=redelivery_count)

    def _read(self, max_entries: int) -> list[Delivery]:
        """The next entries of the reader; on Shared and Key_Shared, entries not yet due
        go into the delay index instead (see "Delayed delivery") and the read goes on past
        them, up to ``DISPATCH_ROUND_ENTRIES_MAX`` entries; when that many were all
        delayed, the round asks for a next one (``_scan_more``)."""
        reader = self.reader
        scanned = 0
        while True:
            read = reader.read(max_entries)
            if not read:
                return []
            multi = self.sub_type in _MULTI  # one parse: permits and due time (when it matters)
            facts = [entry_facts(e.data) if multi or not e.batch_size else (e.batch_size, None) for e in read]
            deliveries = [Delivery(e.position, e.data, e.batch_size or messages, reader.ack_set(e.position))
                          for e, (messages, _) in zip(read, facts, strict=True)]
            self._entry_bytes = max(len(d.data) for d in deliveries)
            if not multi:
                return deliveries
            scanned += len(deliveries)
            due = [d for d, (_, deliver_at) in zip(deliveries, facts, strict=True)
                   if not self._delayed.defer(d.position, deliver_at or 0)]
            if due:
                return due
            if scanned >= DISPATCH_ROUND_ENTRIES_MAX:
                self._scan_more = True
                return []

    # -- acknowledgements and redelivery --------------------------------------------------

    def acknowledge_message_ids(self, message_ids: Iterable[tuple[Position, Sequence[int]]], *,
                                cumulative: bool) -> None:
        """Apply an ACK of ``(position, ack_set)`` message ids: what each acknowledges is
        the reader's to say (``CompactedReader.acknowledged_entry``: a batch-index ack
        still naming slots the consumer was sent is partial). Key_Shared refuses cumulative
        acks (the client refuses them first)."""
        if cumulative and self.sub_type is SubType.KEY_SHARED:
            raise NotAllowedError("Cumulative acknowledgement is not allowed on a Key_Shared subscription")
        positions = [entry for position, ack_set in message_ids
                     if (entry := self.reader.acknowledged_entry(position, ack_set, cumulative=cumulative)) is not None]
        if positions:
            self.acknowledge(positions, cumulative=cumulative)

    def acknowledge(self, positions: Iterable[Position], *, cumulative: bool) -> None:
        """Apply an ACK; positions outside what the cursor accepts are ignored (logged)."""
        entries = [p.entry_position() for p in positions]
        try:
            if cumulative:
                self.cursor.mark_delete(max(entries))
            else:
                self.cursor.delete(entries)
        except CursorError as error:
            log.debug("subscription %s: ack ignored: %s", self.name, error)
        for entry in entries:
            self._pending.pop(entry, None)
            self._redeliveries.pop(entry, None)
        self.reader.acknowledged(entries, cumulative=cumulative)
        self._delayed.discard(entries)
        if cumulative:
            for position in [p for p in self._pending if p <= max(entries)]:
                del self._pending[position]
        if self._key_shared is not None:
            self._key_shared.acknowledged(entries)
            if self._key_shared.held_count:  # a key may be free to move on
                self.dispatch()

    def redeliver(self, consumer: Consumer, positions: Iterable[Position] | None) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES: the given positions (Shared) or everything
        unacknowledged (no positions, or Exclusive/Failover)."""
        if self.sub_type is SubType.KEY_SHARED and self._key_shared is not None:
            self._key_shared.redeliver(consumer, positions)
        elif self.sub_type is SubType.SHARED:
            wanted = None if positions is None else {p.entry_position() for p in positions}
            for position, owner in list(self._pending.items()):
                if owner is consumer and (wanted is None or position in wanted):
                    del self._pending[position]
                    self._replay.add(position)
                    self._redeliveries[position] = self._redeliveries.get(position, 0) + 1
        else:
            self.rewind()
        self.dispatch()

    def seek(self, position: Position) -> None:
        """Reset the cursor so the next read starts at ``position``; the broker then drops
        every consumer (they subscribe again)."""
        self.reader.seek(position)
        self._pending.clear()
        self._replay.clear()
        self._delayed.clear()
        if self._key_shared is not None:
            self._key_shared.clear()
        for consumer in list(self.consumers):
            consumer.disconnect()
        self.consumers.clear()
        self._active = None
