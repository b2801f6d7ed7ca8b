"""Key_Shared dispatch: which consumer of a subscription gets each key, and when.

Owns a Key_Shared subscription's consumer selector, its pending map (delivered, not yet
acknowledged: position -> consumer and key hash) and its held set (read or handed back,
not yet delivered). Rules (reference ``pulsar-partitions-schemas-keyshared.md`` §3.2):

* **Sticky key**: the message's ``ordering_key``, else its ``partition_key`` (base64
  decoded when flagged), else the bytes ``NONE_KEY``, so key-less messages all go to one
  consumer. A batch entry goes whole, under its outer metadata's key. The **hash** is
  Murmur3 x86_32 (seed 0) of the key, ``& 0x7FFFFFFF``, modulo ``HASH_RANGE`` (65536).
* **AUTO_SPLIT**: a consistent-hash ring, ``RING_POINTS`` points per consumer; a hash goes
  to the consumer owning the first point at or after it, wrapping around. **STICKY**: the
  consumer whose declared inclusive ranges contain the hash; a range outside
  [0, 65535] or overlapping another consumer's is refused with ConsumerAssignError; a hash
  no consumer covers is held until one does.
* **All consumers agree**: same mode and same ``allowOutOfOrderDelivery``, or the newcomer
  is refused with ConsumerBusy (Pulsar's texts).
* **One consumer at a time per key** (PIP-379): unless out-of-order delivery is allowed, a
  message is not sent to its selected consumer while another consumer holds unacknowledged
  messages of the same hash; it is held and sent once those are acknowledged or handed
  back. So a consumer that joins never gets a key ahead of what another consumer still
  holds, and per-key order survives joins and leaves.
* **Order among held messages**: held messages go out in position order before anything
  new is read, and once a hash has a message held in a round every later message of that
  hash waits too. A message whose consumer has no permits is held, never given to
  another consumer. At most ``HELD_ENTRIES_MAX`` entries are held; then reading stops
  until some go out (a stuck key stalls new reads, never reorders them).
* A consumer that leaves, or asks for redelivery, has its pending messages held again
  (redelivery counts as Shared's).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from api.broker.consumer import Consumer, Delivery, KeySharedMode, KeySharedPolicy
from api.broker.errors import BrokerError, ConsumerBusyError
from ledger.position import Position
from message.entry import parse_header
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

__all__ = [
    "HASH_RANGE",
    "ConsumerAssignError",
    "KeySharedDispatcher",
    "KeySharedMode",
    "KeySharedPolicy",
    "key_hash",
    "murmur3_32",
    "sticky_key",
]

log = logging.getLogger(__name__)

HASH_RANGE = 65536  # Pulsar's DEFAULT_RANGE_SIZE (2 << 15)
RING_POINTS = 100  # points per consumer on the AUTO_SPLIT ring (Pulsar's default)
HELD_ENTRIES_MAX = 1000  # held entries beyond which no new entry is read
NONE_KEY = b"NONE_KEY"


class ConsumerAssignError(BrokerError):
    """A STICKY consumer's ranges are invalid or overlap another consumer's."""

    code = "ConsumerAssignError"


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 of ``data``, unsigned (what Java's ``Murmur3_32Hash`` computes)."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        h ^= (k * c2) & mask
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[whole:]
    if tail:
        k = (int.from_bytes(tail, "little") * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        h ^= (k * c2) & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


def key_hash(key: bytes) -> int:
    """The slot in [0, HASH_RANGE) a sticky key falls in."""
    return (murmur3_32(key) & 0x7FFFFFFF) % HASH_RANGE


def sticky_key(metadata: pb.MessageMetadata) -> bytes:
    """The key Key_Shared dispatches a message by (see the module docstring)."""
    if metadata.HasField("ordering_key"):
        return bytes(metadata.ordering_key)
    if metadata.HasField("partition_key"):
        if metadata.partition_key_b64_encoded:
            try:
                return base64.b64decode(metadata.partition_key, validate=True)
            except (binascii.Error, ValueError):
                pass
        return metadata.partition_key.encode()
    return NONE_KEY


def entry_hash(data: bytes) -> int:
    """The hash of a stored entry's sticky key (an entry that does not parse: NONE_KEY's)."""
    try:
        metadata = parse_header(bytes(data))[0]
    except MalformedEntryError:
        return key_hash(NONE_KEY)
    return key_hash(sticky_key(metadata))


# -- selectors --------------------------------------------------------------------------------


class _Selector:
    """Maps a hash to a consumer; ``add`` refuses a consumer it cannot take."""

    def add(self, consumer: Consumer, policy: KeySharedPolicy) -> None:
        raise NotImplementedError

    def remove(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def select(self, hash_: int) -> Consumer | None:
        raise NotImplementedError


class _AutoSplitSelector(_Selector):
    """Consistent hashing: ``RING_POINTS`` points per consumer, placed by Murmur3 of the
    consumer's name and its serial number in this subscription (so equal names differ)."""

    def __init__(self) -> None:
        self._serial = 0
        self._points: list[tuple[int, int]] = []  # (point, serial), sorted
        self._consumers: dict[int, Consumer] = {}  # serial -> consumer

    def add(self, consumer: Consumer, policy: KeySharedPolicy) -> None:
        self._serial += 1
        self._consumers[self._serial] = consumer
        for i in range(RING_POINTS):
            point = key_hash(f"{consumer.name}#{self._serial}#{i}".encode())
            bisect.insort(self._points, (point, self._serial))

    def remove(self, consumer: Consumer) -> None:
        serials = {s for s, c in self._consumers.items() if c is consumer}
        self._points = [p for p in self._points if p[1] not in serials]
        for serial in serials:
            del self._consumers[serial]

    def select(self, hash_: int) -> Consumer | None:
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, (hash_, 0))
        return self._consumers[self._points[i % len(self._points)][1]]


class _StickySelector(_Selector):
    """Exact declared ranges; a hash nobody covers has no consumer."""

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int, Consumer]] = []  # sorted by start

    def add(self, consumer: Consumer, policy: KeySharedPolicy) -> None:
        if not policy.ranges:
            raise ConsumerAssignError("Ranges for KeyShared policy must not be empty.")
        for start, end in policy.ranges:
            if not 0 <= start <= end < HASH_RANGE:
                raise ConsumerAssignError(f"Invalid range [{start}, {end}]: must be within [0, {HASH_RANGE - 1}]")
            for other_start, other_end, other in self._ranges:
                if start <= other_end and other_start <= end:
                    raise ConsumerAssignError(f"Range conflict with consumer {other.name}")
        for start, end in policy.ranges:
            bisect.insort(self._ranges, (start, end, consumer), key=lambda r: (r[0], r[1]))

    def remove(self, consumer: Consumer) -> None:
        self._ranges = [r for r in self._ranges if r[2] is not consumer]

    def select(self, hash_: int) -> Consumer | None:
        i = bisect.bisect_right(self._ranges, hash_, key=lambda r: r[0]) - 1
        if i >= 0 and self._ranges[i][0] <= hash_ <= self._ranges[i][1]:
            return self._ranges[i][2]
        return None


# -- the dispatcher ---------------------------------------------------------------------------


class Budget(Protocol):
    """What one dispatch round may still send (``dispatch._Round``)."""

    @property
    def spent(self) -> bool: ...
    def charge(self, delivery: Delivery) -> None: ...


class KeySharedDispatcher:
    """The Key_Shared state of one subscription (see the module docstring).

    ``reread(position, redelivery_count)`` reads one entry again (None: gone or
    acknowledged); reads of new entries are passed to ``dispatch_round``.
    """

    def __init__(self, policy: KeySharedPolicy, reread: Callable[[Position, int], Delivery | None]) -> None:
        self.policy = policy
        self._selector: _Selector = _StickySelector() if policy.mode is KeySharedMode.STICKY else _AutoSplitSelector()
        self._reread = reread
        self._pending: dict[Position, tuple[Consumer, int]] = {}
        self._owners: dict[int, dict[Consumer, int]] = {}  # hash -> consumer -> pending count
        self._held: dict[Position, int] = {}  # position -> hash
        self._redeliveries: dict[Position, int] = {}

    @property
    def held_count(self) -> int:
        """Entries read or handed back and not yet delivered."""
        return len(self._held)

    def add_consumer(self, consumer: Consumer, policy: KeySharedPolicy) -> None:
        """Take ``consumer``: ConsumerBusy when its mode or ordering differs from the
        subscription's, ConsumerAssignError when its STICKY ranges do not fit."""
        if policy.mode is not self.policy.mode:
            raise ConsumerBusyError("Subscription is of different key_shared mode")
        if policy.allow_out_of_order != self.policy.allow_out_of_order:
            raise ConsumerBusyError("Subscription does not allow out of order delivery"
                                    if policy.allow_out_of_order else "Subscription allows out of order delivery")
        self._selector.add(consumer, policy)

    def remove_consumer(self, consumer: Consumer) -> None:
        """``consumer`` left: what it held unacknowledged is held for the others."""
        self._selector.remove(consumer)
        self._hand_back(consumer, None, count=False)

    def redeliver(self, consumer: Consumer, positions: Iterable[Position] | None) -> None:
        """The consumer asked for ``positions`` (None: all it holds) again."""
        self._hand_back(consumer, None if positions is None else {p.entry_position() for p in positions}, count=True)

    def acknowledged(self, positions: Iterable[Position]) -> None:
        """Entries acknowledged: no longer pending (their hashes may move on)."""
        for position in positions:
            self._held.pop(position, None)
            self._redeliveries.pop(position, None)
            owner = self._pending.pop(position, None)
            if owner is not None:
                self._release(*owner)

    def clear(self) -> None:
        """Forget pending and held entries (the cursor re-reads them: a rewind or seek)."""
        self._pending.clear()
        self._owners.clear()
        self._held.clear()

    def hold(self, positions: Iterable[Position]) -> None:
        """Entries that became deliverable again outside a read (a delay ran out)."""
        for position in positions:
            delivery = self._reread(position, 0)
            if delivery is not None:
                self._held[position] = entry_hash(delivery.data)

    def _hand_back(self, consumer: Consumer, wanted: set[Position] | None, *, count: bool) -> None:
        for position, (owner, hash_) in list(self._pending.items()):
            if owner is consumer and (wanted is None or position in wanted):
                del self._pending[position]
                self._release(owner, hash_)
                self._held[position] = hash_
                if count:
                    self._redeliveries[position] = self._redeliveries.get(position, 0) + 1

    def _release(self, consumer: Consumer, hash_: int) -> None:
        owners = self._owners.get(hash_)
        if owners is None:
            return
        left = owners.get(consumer, 0) - 1
        if left > 0:
            owners[consumer] = left
        else:
            owners.pop(consumer, None)
            if not owners:
                del self._owners[hash_]

    # -- dispatch -----------------------------------------------------------------------

    def target(self, hash_: int) -> Consumer | None:
        """The consumer that may take a message of ``hash_`` now, or None (hold it)."""
        consumer = self._selector.select(hash_)
        if consumer is None or consumer.permits <= 0 or not consumer.writable:
            return None
        owners = self._owners.get(hash_)
        if owners and not self.policy.allow_out_of_order and any(c is not consumer for c in owners):
            return None
        return consumer

    def dispatch_round(self, consumers: list[Consumer], budget: Budget,
                       read: Callable[[int], list[Delivery]], read_size: Callable[[int], int]) -> bool:
        """Send held entries, then new ones; True when the round's budget ran out first."""
        blocked: set[int] = set()
        for position in sorted(self._held):
            if budget.spent:
                return True
            hash_ = self._held[position]
            consumer = None if hash_ in blocked else self.target(hash_)
            if consumer is None:
                blocked.add(hash_)
                continue
            del self._held[position]
            delivery = self._reread(position, self._redeliveries.get(position, 0))
            if delivery is not None:
                self._send(consumer, delivery, hash_, budget)
        while len(self._held) < HELD_ENTRIES_MAX:
            permits = sum(c.permits for c in consumers if c.permits > 0 and c.writable)
            if permits <= 0:
                return False
            if budget.spent:
                return True
            deliveries = read(read_size(permits))
            if not deliveries:
                return False
            for delivery in deliveries:
                hash_ = entry_hash(delivery.data)
                consumer = None if hash_ in blocked else self.target(hash_)
                if consumer is None:
                    blocked.add(hash_)
                    self._held[delivery.position] = hash_
                else:
                    self._send(consumer, delivery, hash_, budget)
        return False

    def _send(self, consumer: Consumer, delivery: Delivery, hash_: int, budget: Budget) -> None:
        self._pending[delivery.position] = (consumer, hash_)
        owners = self._owners.setdefault(hash_, {})
        owners[consumer] = owners.get(consumer, 0) + 1
        consumer.permits -= delivery.messages
        budget.charge(delivery)
        consumer.send(delivery)
