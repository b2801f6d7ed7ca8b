"""The real pulsar-client against compactd: Key_Shared subscriptions (AUTO_SPLIT and STICKY).

Contract (``pulsar-partitions-schemas-keyshared.md`` §3): each key on exactly one consumer
at a time, in order; key-less messages on one consumer; a consumer that joins gets no
message of a key another consumer holds unacknowledged (unless out-of-order delivery is
allowed); a closing consumer's unacknowledged messages go to the others, in order; STICKY
routes exactly by declared hash range and refuses overlaps with ``ConsumerAssignError``;
mismatched modes are refused with ``ConsumerBusy``; acks are individual and durable.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pulsar
import pytest

from api.broker.key_shared import key_hash
from tests.integration.wire.helpers import RECEIVE_MS, SILENCE_MS, drain
from tests.integration.wire.helpers import unique_topic as _topic

pytestmark = pytest.mark.integration

FAST_FAIL_S = 5  # a refusal must come at once, never after the client's retry loop


def _key_shared(client: Any, topic: str, name: str, **policy: Any) -> Any:
    return client.subscribe(
        topic, "sub", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name,
        initial_position=pulsar.InitialPosition.Earliest,
        key_shared_policy=pulsar.ConsumerKeySharedPolicy(**policy) if policy else None)


def _sticky(client: Any, topic: str, name: str, *ranges: tuple[int, int]) -> Any:
    return _key_shared(client, topic, name, key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=list(ranges))


def _send(client: Any, topic: str, items: list[tuple[str | None, int]]) -> None:
    producer = client.create_producer(topic)
    for key, n in items:
        producer.send_async(b"%d" % n, None, partition_key=key)
    producer.flush()
    producer.close()


def _by_key(messages: list[Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for message in messages:
        out[message.partition_key()].append(int(message.data()))
    return out


def _receive_all(consumers: list[Any], count: int, *, ack: bool = True) -> list[list[Any]]:
    """Receive from every consumer until ``count`` messages came in all, acking them."""
    got: list[list[Any]] = [[] for _ in consumers]
    deadline = time.monotonic() + 30
    while sum(map(len, got)) < count:
        assert time.monotonic() < deadline, f"only {sum(map(len, got))} of {count} messages came"
        for i, consumer in enumerate(consumers):
            try:
                message = consumer.receive(10)
            except pulsar.Timeout:
                continue
            got[i].append(message)
            if ack:
                consumer.acknowledge(message)
    return got


def test_auto_split_puts_each_key_on_one_consumer_in_order_and_keyless_on_one(client: Any) -> None:
    topic = _topic("ks-auto")
    a, b = _key_shared(client, topic, "a"), _key_shared(client, topic, "b")
    items = [(f"key-{n % 50}", n) for n in range(600)]
    _send(client, topic, items)
    got_a, got_b = _receive_all([a, b], len(items))
    keys_a, keys_b = _by_key(got_a), _by_key(got_b)
    assert keys_a and keys_b  # both consumers got keys
    assert not set(keys_a) & set(keys_b)  # a key on exactly one consumer
    for numbers in (keys_a | keys_b).values():
        assert numbers == sorted(numbers)
    assert sorted(n for ns in (keys_a | keys_b).values() for n in ns) == list(range(600))

    _send(client, topic, [(None, n) for n in range(100)])  # key-less: one consumer takes all
    got_a, got_b = _receive_all([a, b], 100)
    assert sorted([len(got_a), len(got_b)]) == [0, 100]
    assert [int(m.data()) for m in got_a + got_b] == list(range(100))


def test_the_ordering_key_decides_over_the_partition_key(client: Any) -> None:
    topic = _topic("ks-ordering")
    consumers = [_key_shared(client, topic, name) for name in "abc"]
    producer = client.create_producer(topic)
    for n in range(60):
        producer.send_async(b"%d" % n, None, partition_key=f"p{n % 20}", ordering_key="one-order")
    producer.flush()
    got = _receive_all(consumers, 60)
    assert sorted(len(g) for g in got) == [0, 0, 60]
    assert [int(m.data()) for g in got for m in g] == list(range(60))


def test_sticky_routes_by_exact_hash_range_and_holds_what_nobody_covers(client: Any) -> None:
    topic = _topic("ks-sticky")
    low = _sticky(client, topic, "low", (0, 32767))
    keys = [f"user-{n}" for n in range(200)]
    _send(client, topic, [(key, n) for n, key in enumerate(keys)])
    lower = {k for k in keys if key_hash(k.encode()) <= 32767}
    got_low = _receive_all([low], len(lower))[0]
    assert {m.partition_key() for m in got_low} == lower
    with pytest.raises(pulsar.Timeout):  # the upper half waits for a consumer covering it
        low.receive(SILENCE_MS)
    high = _sticky(client, topic, "high", (32768, 65535))
    got_high = _receive_all([high], len(keys) - len(lower))[0]
    assert {m.partition_key() for m in got_high} == set(keys) - lower


def test_sticky_overlaps_and_mode_mismatches_are_refused_at_once(client: Any) -> None:
    topic = _topic("ks-refused")
    _sticky(client, topic, "a", (0, 32767))
    _sticky(client, topic, "b", (32768, 65535))
    started = time.monotonic()
    with pytest.raises(pulsar.ConsumerAssignError):
        _sticky(client, topic, "c", (30000, 40000))
    with pytest.raises(pulsar.ConsumerBusy):
        _key_shared(client, topic, "d")  # AUTO_SPLIT on a STICKY subscription
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    assert time.monotonic() - started < FAST_FAIL_S

    other = _topic("ks-ooo")
    _key_shared(client, other, "a")
    with pytest.raises(pulsar.ConsumerBusy):
        _key_shared(client, other, "b", allow_out_of_order_delivery=True)
    only_a = _topic("ks-free")
    _sticky(client, only_a, "a", (0, 32767))
    _sticky(client, only_a, "b", (40000, 50000)).close()  # no overlap: accepted


def test_a_joining_consumer_gets_no_key_another_holds_unacknowledged(client: Any) -> None:
    topic = _topic("ks-join")
    a = _key_shared(client, topic, "a")
    keys = [f"key-{k}" for k in range(20)]
    _send(client, topic, [(key, n) for n, key in enumerate(keys)])
    held_by_a = _receive_all([a], 20, ack=False)[0]  # a holds all 20 keys unacknowledged
    b = _key_shared(client, topic, "b")
    _send(client, topic, [(key, 100 + n) for n, key in enumerate(keys)])
    early = drain(b, SILENCE_MS)
    assert early == []  # every key is held by a
    second_round = drain(a, SILENCE_MS)  # what stays with a goes on to a
    for message in held_by_a + second_round:
        a.acknowledge(message)
    moved = _receive_all([b], 20 - len(second_round))[0]
    by_key = _by_key(held_by_a + second_round + moved)
    assert all(numbers == [n, 100 + n] for n, numbers in enumerate(by_key[k] for k in keys))
    assert moved  # the ring gave b some of the keys once a let go


def test_out_of_order_delivery_lets_a_joiner_take_its_keys_at_once(client: Any) -> None:
    topic = _topic("ks-ooo-join")
    a = _key_shared(client, topic, "a", allow_out_of_order_delivery=True)
    keys = [f"key-{k}" for k in range(40)]
    _send(client, topic, [(key, n) for n, key in enumerate(keys)])
    _receive_all([a], 40, ack=False)
    b = _key_shared(client, topic, "b", allow_out_of_order_delivery=True)
    _send(client, topic, [(key, 100 + n) for n, key in enumerate(keys)])
    _, got_b = _receive_all([a, b], 40, ack=False)
    assert got_b  # b was not held back by a's unacknowledged keys


def test_a_closing_consumers_unacknowledged_messages_move_on_in_order(client: Any) -> None:
    topic = _topic("ks-close")
    a, b = _key_shared(client, topic, "a"), _key_shared(client, topic, "b")
    items = [(f"key-{n % 10}", n) for n in range(200)]
    _send(client, topic, items)
    got_a, got_b = _receive_all([a, b], 200, ack=False)
    for message in got_b:
        b.acknowledge(message)
    a.close()
    moved = _receive_all([b], len(got_a))[0]
    assert _by_key(moved) == _by_key(got_a)  # same messages, same per-key order
    assert drain(b, SILENCE_MS) == []


def test_cumulative_acks_are_refused_and_individual_acks_survive_a_restart(broker: Any, client: Any) -> None:
    topic = _topic("ks-durable")
    a = _key_shared(client, topic, "a")
    _send(client, topic, [(f"key-{n % 7}", n) for n in range(50)])
    got = _receive_all([a], 50, ack=False)[0]
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        a.acknowledge_cumulative(got[-1])
    for message in got[::2]:
        a.acknowledge(message)
    a.close()  # flushes the acks
    broker.restart()
    again = _key_shared(client, topic, "a")
    rest = _receive_all([again], 25)[0]
    assert sorted(int(m.data()) for m in rest) == sorted(int(m.data()) for m in got[1::2])
    assert drain(again, SILENCE_MS) == []


def test_read_compacted_key_shared_is_refused_by_the_client(client: Any) -> None:
    """The client 3.13.0 refuses readCompacted on anything but Exclusive and Failover
    before it sends a SUBSCRIBE; the broker refuses it the same way (NotAllowed)."""
    topic = _topic("ks-compacted")
    with pytest.raises(pulsar.InvalidConfiguration):
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.KeyShared, is_read_compacted=True)


def test_a_negatively_acknowledged_message_comes_back_to_the_consumer_of_its_key(client: Any) -> None:
    topic = _topic("ks-nack")
    consumers = [client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name,
                                  negative_ack_redelivery_delay_ms=100) for name in "ab"]
    _send(client, topic, [(f"key-{n % 4}", n) for n in range(20)])
    got = _receive_all(consumers, 20, ack=False)
    owner = 0 if got[0] else 1
    nacked = got[owner][0]
    consumers[owner].negative_acknowledge(nacked)
    for i, messages in enumerate(got):
        for message in messages:
            if message is not nacked:
                consumers[i].acknowledge(message)
    again = consumers[owner].receive(RECEIVE_MS)
    assert again.data() == nacked.data() and again.redelivery_count() == 1
    assert drain(consumers[1 - owner], SILENCE_MS) == []
