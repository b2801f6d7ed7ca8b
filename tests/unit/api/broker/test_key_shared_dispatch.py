"""Key_Shared dispatch in the core: the hash, the selectors, and order across joins and leaves.

A real managed ledger and cursor; consumers are in memory. The property test drives a
subscription through random joins, leaves, acks, redeliveries and permits and checks
Key_Shared's contract after every step: a key is pending on one consumer at a time, a
message is never delivered before an earlier message of its key that was not yet
acknowledged, and once everyone acknowledges everything, every message was delivered.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.broker.dispatch import Consumer, Delivery, Subscription, SubType
from api.broker.errors import ConsumerBusyError, NotAllowedError
from api.broker.key_shared import (
    HASH_RANGE,
    ConsumerAssignError,
    KeySharedMode,
    KeySharedPolicy,
    entry_hash,
    key_hash,
    murmur3_32,
    sticky_key,
)
from compactor.view.topic import CompactedTopic
from cursor.cursor import ManagedCursor
from cursor.store import CursorStore
from ledger import DataDir, ManagedLedger
from ledger.position import EARLIEST, Position
from ledger.storage.base import SyncPolicy
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/key-shared"
KEYS = [f"k{i}" for i in range(6)]
MESSAGES = 60


class _Consumer(Consumer):
    def __init__(self, consumer_id: int, name: str, policy: KeySharedPolicy | None = None) -> None:
        super().__init__(consumer_id, name)
        self.key_shared_policy = policy
        self.received: list[Delivery] = []

    def send(self, delivery: Delivery) -> None:
        self.received.append(delivery)


def test_murmur3_matches_the_reference_implementation() -> None:
    # values from the mmh3 package (MurmurHash3 x86_32, seed 0, unsigned)
    expected = {b"": 0, b"hello": 613153351, b"NONE_KEY": 2652225187, b"key-1": 2561742240,
                b"abcd": 1139631978, b"abc": 3017643002, b"ab": 2613040991, b"a" * 37: 3605985107}
    assert {data: murmur3_32(data) for data in expected} == expected
    assert key_hash(b"hello") == (613153351 & 0x7FFFFFFF) % HASH_RANGE


def test_the_sticky_key_is_the_ordering_key_then_the_partition_key_then_none_key() -> None:
    assert sticky_key(pb.MessageMetadata(ordering_key=b"o", partition_key="p")) == b"o"
    assert sticky_key(pb.MessageMetadata(partition_key="p")) == b"p"
    encoded = base64.b64encode(b"\x00\xff").decode()
    assert sticky_key(pb.MessageMetadata(partition_key=encoded, partition_key_b64_encoded=True)) == b"\x00\xff"
    assert sticky_key(pb.MessageMetadata()) == b"NONE_KEY"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[tuple[ManagedLedger, CursorStore]]:
    data_dir = DataDir.open(str(tmp_path), sync=SyncPolicy.NONE)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    futures = []
    for n in range(MESSAGES):
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=n, publish_time=1, partition_key=KEYS[n % 5 * n % 6])
        futures.append(ledger.append(encode_entry(metadata, b"m%d" % n, with_checksum=False)))
    for future in futures:
        future.result(timeout=30)
    try:
        yield ledger, CursorStore(data_dir.database)
    finally:
        data_dir.close()


def _subscription(ledger: ManagedLedger, cursors: CursorStore, name: str = "sub") -> Subscription:
    cursor = ManagedCursor.open_non_durable(ledger, name, EARLIEST)
    return Subscription(name, cursor, CompactedTopic.restore(ledger, cursors), SubType.KEY_SHARED)


def _sticky(*ranges: tuple[int, int]) -> KeySharedPolicy:
    return KeySharedPolicy(KeySharedMode.STICKY, tuple(ranges))


def test_sticky_routes_exactly_by_range_and_holds_what_nobody_covers(
        ledger: tuple[ManagedLedger, CursorStore]) -> None:
    subscription = _subscription(*ledger)
    low = _Consumer(1, "low", _sticky((0, 32767)))
    subscription.add_consumer(low, SubType.KEY_SHARED)
    subscription.flow(low, 1000)
    assert low.received
    assert all(entry_hash(d.data) <= 32767 for d in low.received)
    high = _Consumer(2, "high", _sticky((32768, HASH_RANGE - 1)))
    subscription.add_consumer(high, SubType.KEY_SHARED)
    subscription.flow(high, 1000)
    assert high.received
    assert all(entry_hash(d.data) > 32767 for d in high.received)
    assert len(low.received) + len(high.received) == MESSAGES


def test_sticky_conflicts_bad_ranges_and_mismatched_modes_are_refused(
        ledger: tuple[ManagedLedger, CursorStore]) -> None:
    subscription = _subscription(*ledger)
    subscription.add_consumer(_Consumer(1, "a", _sticky((0, 32767))), SubType.KEY_SHARED)
    with pytest.raises(ConsumerAssignError, match="Range conflict with consumer a"):
        subscription.add_consumer(_Consumer(2, "b", _sticky((30000, 40000))), SubType.KEY_SHARED)
    with pytest.raises(ConsumerAssignError):
        subscription.add_consumer(_Consumer(3, "c", _sticky((40000, 70000))), SubType.KEY_SHARED)
    with pytest.raises(ConsumerBusyError, match="different key_shared mode"):
        subscription.add_consumer(_Consumer(4, "d"), SubType.KEY_SHARED)
    assert [c.name for c in subscription.consumers] == ["a"]
    subscription.add_consumer(_Consumer(5, "e", _sticky((40000, 50000))), SubType.KEY_SHARED)
    with pytest.raises(NotAllowedError):
        subscription.acknowledge_message_ids([(Position(0, 0), ())], cumulative=True)


def test_out_of_order_settings_must_agree(ledger: tuple[ManagedLedger, CursorStore]) -> None:
    subscription = _subscription(*ledger)
    subscription.add_consumer(_Consumer(1, "a"), SubType.KEY_SHARED)
    with pytest.raises(ConsumerBusyError, match="does not allow out of order"):
        subscription.add_consumer(_Consumer(2, "b", KeySharedPolicy(allow_out_of_order=True)), SubType.KEY_SHARED)


_OPS = st.lists(st.tuples(st.sampled_from(["join", "leave", "ack", "nack", "flow"]), st.integers(0, 3),
                          st.integers(1, 7)), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_a_key_is_never_ahead_of_its_unacknowledged_past_nor_on_two_consumers(
        ledger: tuple[ManagedLedger, CursorStore], ops: list[tuple[str, int, int]]) -> None:
    subscription = _subscription(*ledger, name=f"prop-{id(ops)}")
    consumers: dict[int, _Consumer] = {}
    pending: dict[int, dict[Position, int]] = {}  # consumer -> position -> hash
    acked: set[Position] = set()
    delivered: set[Position] = set()
    hashes = {}
    serial = 0

    def check_new(consumer: _Consumer, before: int) -> None:
        for delivery in consumer.received[before:]:
            h = entry_hash(delivery.data)
            hashes[delivery.position] = h
            # no other consumer holds this key unacknowledged
            assert not any(h in p.values() for cid, p in pending.items() if cid != consumer.consumer_id)
            # nothing earlier of this key is still waiting to be delivered
            earlier = [p for p, hh in hashes.items() if hh == h and p < delivery.position]
            assert all(p in delivered or p in acked for p in earlier)
            pending.setdefault(consumer.consumer_id, {})[delivery.position] = h
            delivered.add(delivery.position)

    def step(action: str, which: int, amount: int) -> None:
        nonlocal serial
        counts = {cid: len(c.received) for cid, c in consumers.items()}
        if action == "join" or not consumers:
            serial += 1
            consumer = _Consumer(serial, f"c{serial}")
            consumers[serial] = consumer
            counts[serial] = 0
            subscription.add_consumer(consumer, SubType.KEY_SHARED)
            subscription.flow(consumer, amount)
        else:
            consumer = list(consumers.values())[which % len(consumers)]
            mine = pending.get(consumer.consumer_id, {})
            if action == "leave":
                del consumers[consumer.consumer_id]
                for position in pending.pop(consumer.consumer_id, {}):
                    delivered.discard(position)
                subscription.remove_consumer(consumer)
                subscription.dispatch()
            elif action == "ack" and mine:
                positions = sorted(mine)[:amount]
                for position in positions:
                    del mine[position]
                    acked.add(position)
                subscription.acknowledge(positions, cumulative=False)
                subscription.flow(consumer, len(positions))
            elif action == "nack" and mine:
                position = max(mine)
                del mine[position]
                delivered.discard(position)
                subscription.redeliver(consumer, [position])
            else:
                subscription.flow(consumer, amount)
        for cid, consumer in consumers.items():
            check_new(consumer, counts.get(cid, 0))

    for op in ops:
        step(*op)
    # Everyone acknowledges everything until nothing is left: every message was delivered.
    if not consumers:
        step("join", 0, 1)
    for _ in range(MESSAGES):
        for index in range(len(consumers)):
            step("ack", index, 100)
            step("flow", index, 100)
    assert len(acked) == MESSAGES
