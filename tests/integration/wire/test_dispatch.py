"""The real pulsar-client against compactd: Failover and Shared dispatch, the table view.

Failover (``managed-ledger.md`` §4.3): one active consumer, the first connected of the
best priority level; when it leaves, the next one starts again from the mark-delete
position, so whatever the first left unacknowledged is delivered again. Shared (§4.4):
round robin over consumers with permits, each message delivered once; a consumer that
leaves has its unacknowledged messages replayed to the others.
"""

from __future__ import annotations

import time
from typing import Any

import pulsar
import pytest

from tests.integration.wire.helpers import RECEIVE_MS, SILENCE_MS
from tests.integration.wire.helpers import drain as _drain
from tests.integration.wire.helpers import unique_topic as _topic

pytestmark = pytest.mark.integration





def _data(messages: list[Any]) -> list[bytes]:
    return [m.data() for m in messages]


def _m(*numbers: int) -> list[bytes]:
    return [b"m%d" % n for n in numbers]


def _produce(client: Any, topic: str, numbers: range) -> None:
    producer = client.create_producer(topic)
    for n in numbers:
        producer.send(b"m%d" % n)
    producer.close()


# -- Failover ---------------------------------------------------------------------------------


def _failover(client: Any, topic: str, name: str) -> Any:
    return client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Failover, consumer_name=name,
                            initial_position=pulsar.InitialPosition.Earliest)


def test_failover_only_the_active_consumer_receives_and_the_other_takes_over(client: Any) -> None:
    topic = _topic("failover")
    first = _failover(client, topic, "a")
    second = _failover(client, topic, "b")
    _produce(client, topic, range(10))

    got = [first.receive(RECEIVE_MS) for _ in range(10)]
    assert _data(got) == _m(*range(10))
    with pytest.raises(pulsar.Timeout):
        second.receive(SILENCE_MS)
    first.acknowledge_cumulative(got[4])  # m0..m4; m5..m9 stay unacknowledged
    first.close()  # flushes the acknowledgement first

    # The standby takes over from the mark-delete position: the unacknowledged come again.
    taken_over = _drain(second)
    assert _data(taken_over) == _m(5, 6, 7, 8, 9)
    second.acknowledge_cumulative(taken_over[-1])

    # A consumer joining later stays standby while the active one is connected.
    third = _failover(client, topic, "c")
    _produce(client, topic, range(10, 13))
    assert _data([second.receive(RECEIVE_MS) for _ in range(3)]) == _m(10, 11, 12)
    with pytest.raises(pulsar.Timeout):
        third.receive(SILENCE_MS)


def test_failover_takeover_honours_individual_acks(client: Any) -> None:
    """Everything the active consumer acknowledged stays acknowledged after a takeover;
    individual acks with holes are honoured too."""
    topic = _topic("failover-holes")
    first = _failover(client, topic, "a")
    second = _failover(client, topic, "b")
    _produce(client, topic, range(6))
    got = [first.receive(RECEIVE_MS) for _ in range(6)]
    for index in (0, 2, 5):
        first.acknowledge(got[index])
    first.close()
    assert _data(_drain(second)) == _m(1, 3, 4)


def test_failover_takeover_when_the_active_connection_drops(broker: Any, client: Any) -> None:
    """The broker loses the active consumer's connection (no CLOSE_CONSUMER): the standby
    takes over from the mark-delete position; the dropped one reconnects as standby."""
    topic = _topic("failover-drop")
    other_client = pulsar.Client(broker.url, operation_timeout_seconds=10,
                                 logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        first = _failover(other_client, topic, "a")
        second = _failover(client, topic, "b")
        _produce(client, topic, range(4))
        got = [first.receive(RECEIVE_MS) for _ in range(4)]
        first.acknowledge_cumulative(got[1])
        deadline = time.monotonic() + 5
        subscription = broker.service.registry.loaded[topic].subscriptions["sub"]
        while subscription.cursor.mark_delete_position.entry_id < got[1].message_id().entry_id():
            assert time.monotonic() < deadline, "the acknowledgement never arrived"
            time.sleep(0.02)

        active = next(c for c in subscription.consumers if c.name == "a")
        broker.loop.call_soon_threadsafe(active.connection.close)

        assert _data(_drain(second)) == _m(2, 3)
        _produce(client, topic, range(4, 6))
        assert _data(_drain(second)) == _m(4, 5)
        assert _drain(first) == []  # back, but standby
    finally:
        other_client.close()


# -- Shared ------------------------------------------------------------------------------------


def _shared(client: Any, topic: str, name: str, queue: int = 5) -> Any:
    return client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared, consumer_name=name,
                            receiver_queue_size=queue, initial_position=pulsar.InitialPosition.Earliest)


def _drain_both(first: Any, second: Any) -> tuple[list[Any], list[Any]]:
    """Receive alternately from both until neither has had anything for a while."""
    a: list[Any] = []
    b: list[Any] = []
    idle = 0
    while idle < 2:
        got_any = False
        for consumer, sink in ((first, a), (second, b)):
            try:
                message = consumer.receive(SILENCE_MS // 2)
            except pulsar.Timeout:
                continue
            sink.append(message)
            consumer.acknowledge(message)
            got_any = True
        idle = 0 if got_any else idle + 1
    return a, b


def test_shared_both_consumers_receive_everything_once(client: Any) -> None:
    topic = _topic("shared")
    first = _shared(client, topic, "a")
    second = _shared(client, topic, "b")
    _produce(client, topic, range(40))
    a, b = _drain_both(first, second)
    assert a and b, "both consumers get messages"
    assert sorted(_data(a) + _data(b)) == sorted(_m(*range(40)))  # everything, exactly once
    assert all(m.redelivery_count() == 0 for m in a + b)
    assert _drain(first) == [] and _drain(second) == []


def test_shared_consumer_closing_with_unacked_messages_hands_them_over(client: Any) -> None:
    topic = _topic("shared-close")
    first = _shared(client, topic, "a", queue=10)
    second = _shared(client, topic, "b", queue=10)
    _produce(client, topic, range(20))
    # The first takes three and acknowledges one; more sit unread in its receiver queue.
    taken = [first.receive(RECEIVE_MS) for _ in range(3)]
    first.acknowledge(taken[0])
    first.close()

    rest = []
    while True:
        try:
            message = second.receive(SILENCE_MS)
        except pulsar.Timeout:
            break
        rest.append(message)
        second.acknowledge(message)
    assert sorted(_data(rest)) == sorted(set(_m(*range(20))) - {taken[0].data()})
    assert len(rest) == 19  # no duplicates
    assert taken[1].data() in _data(rest) and taken[2].data() in _data(rest)
    # A consumer leaving is not a redelivery request: the count stays 0 (Pulsar's
    # dispatcher only registers such positions with its redelivery tracker).
    assert [m.redelivery_count() for m in rest] == [0] * 19


def test_shared_negative_ack_goes_to_either_consumer(client: Any) -> None:
    topic = _topic("shared-nack")
    first = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                             negative_ack_redelivery_delay_ms=100)
    second = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                              negative_ack_redelivery_delay_ms=100)
    _produce(client, topic, range(1))
    for consumer in (first, second):
        try:
            message = consumer.receive(1_000)
            break
        except pulsar.Timeout:
            continue
    else:
        raise AssertionError("nobody received m0")
    consumer.negative_acknowledge(message)
    deadline = time.monotonic() + 5
    again = None
    while again is None and time.monotonic() < deadline:
        for candidate in (first, second):
            try:
                again = candidate.receive(100)
                break
            except pulsar.Timeout:
                continue
    assert again is not None and again.data() == b"m0"
    assert again.redelivery_count() == 1


# -- table view ------------------------------------------------------------------------------------


def test_table_view_reads_the_compacted_topic_and_follows_updates(broker: Any, client: Any) -> None:
    topic = _topic("table")
    producer = client.create_producer(topic)
    for round_ in range(3):
        for key in ("a", "b", "c"):
            producer.send(f"{key}{round_}".encode(), partition_key=key)
    producer.send(None, partition_key="b")  # tombstone
    broker.compact(topic)
    producer.send(b"c-tail", partition_key="c")  # after the compaction horizon
    batching = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000)
    batching.send_async(b"d0", None, partition_key="d")
    batching.send_async(b"a-batched", None, partition_key="a")
    batching.flush()

    view = client.create_table_view(topic)
    try:
        assert len(view) == 3
        assert view.get("a") == b"a-batched"
        assert view.get("b") is None
        assert view.get("c") == b"c-tail"
        assert view.get("d") == b"d0"
        seen: dict[str, bytes] = {}
        view.for_each(lambda key, value: seen.__setitem__(key, value))
        assert seen == {"a": b"a-batched", "c": b"c-tail", "d": b"d0"}

        # Live updates reach the view.
        producer.send(b"e0", partition_key="e")
        producer.send(None, partition_key="a")
        deadline = time.monotonic() + 5
        while (view.get("e") is None or view.get("a") is not None) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert view.get("e") == b"e0"
        assert view.get("a") is None
    finally:
        view.close()


# -- acknowledgements and flow control ------------------------------------------------------------


def _produce_batch(client: Any, topic: str, numbers: range) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000,
                                      batching_max_messages=1000)
    for n in numbers:
        producer.send_async(b"m%d" % n, None)
    producer.flush()
    producer.close()


@pytest.mark.parametrize("batch_index_ack", [False, True], ids=["entry-acks", "batch-index-acks"])
def test_batch_acknowledged_slot_by_slot_is_not_redelivered(client: Any, batch_index_ack: bool) -> None:
    """With batch-index acks on, the client sends each slot's ack with an ack set; the
    broker ignores the partial ones and takes the entry as acknowledged when none is left."""
    topic = _topic("batch-acks")
    _produce_batch(client, topic, range(5))
    _produce_batch(client, topic, range(5, 10))
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest,
                                batch_index_ack_enabled=batch_index_ack)
    got = [consumer.receive(RECEIVE_MS) for _ in range(10)]
    for message in got[:5]:  # the whole first batch, one slot at a time
        consumer.acknowledge(message)
    for message in got[5:8]:  # part of the second batch
        consumer.acknowledge(message)
    consumer.close()
    consumer = client.subscribe(topic, "sub", batch_index_ack_enabled=batch_index_ack)
    # The first batch is gone; the partly acknowledged one comes again whole (the broker
    # does not track batch-index acks: the client only acks an entry once it is complete).
    assert _data(_drain(consumer)) == _m(5, 6, 7, 8, 9)


def test_cumulative_ack_in_the_middle_of_a_batch_loses_nothing(broker: Any, client: Any) -> None:
    topic = _topic("batch-cumulative")
    _produce_batch(client, topic, range(3))
    _produce_batch(client, topic, range(3, 8))
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(RECEIVE_MS) for _ in range(8)]
    consumer.acknowledge_cumulative(got[5])  # m0..m5: the first batch and part of the second
    consumer.close()
    broker.restart()
    consumer = client.subscribe(topic, "sub")
    again = _data(_drain(consumer))
    assert not set(again) & set(_m(0, 1, 2)), "the fully acknowledged batch is not redelivered"
    assert set(again) >= set(_m(6, 7)), "the unacknowledged slots are redelivered"


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_small_receiver_queue_gets_everything(client: Any, batched: bool) -> None:
    """Permits count messages; a batch bigger than the permits is still delivered whole
    (permits go negative), and later FLOWs keep the consumer going."""
    topic = _topic("small-queue")
    consumer = client.subscribe(topic, "sub", receiver_queue_size=2,
                                initial_position=pulsar.InitialPosition.Earliest)
    for start in range(0, 30, 10):
        if batched:
            _produce_batch(client, topic, range(start, start + 10))
        else:
            _produce(client, topic, range(start, start + 10))
    got = _drain(consumer)
    assert _data(got) == _m(*range(30))


def test_backlog_larger_than_the_receiver_queue(client: Any) -> None:
    topic = _topic("backlog")
    producer = client.create_producer(topic, block_if_queue_full=True)
    for n in range(2_500):
        producer.send_async(b"m%d" % n, None)
    producer.flush()
    consumer = client.subscribe(topic, "sub", receiver_queue_size=1000,
                                initial_position=pulsar.InitialPosition.Earliest)
    got = []
    for _ in range(2_500):
        got.append(consumer.receive(RECEIVE_MS).data())
    assert got == _m(*range(2_500))
    with pytest.raises(pulsar.Timeout):
        consumer.receive(SILENCE_MS)


def test_unsubscribe_then_subscribe_again_starts_afresh(client: Any) -> None:
    topic = _topic("unsubscribe")
    _produce(client, topic, range(3))
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    consumer.acknowledge_cumulative([consumer.receive(RECEIVE_MS) for _ in range(3)][-1])
    consumer.unsubscribe()
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    assert _data(_drain(consumer)) == _m(0, 1, 2)


def test_seek_on_a_shared_subscription_resets_every_consumer(client: Any) -> None:
    topic = _topic("shared-seek")
    first = _shared(client, topic, "a")
    second = _shared(client, topic, "b")
    _produce(client, topic, range(10))
    a, b = _drain_both(first, second)
    assert len(a) + len(b) == 10
    first.seek(pulsar.MessageId.earliest)
    a, b = _drain_both(first, second)
    assert sorted(_data(a) + _data(b)) == sorted(_m(*range(10)))


def test_messages_keep_metadata(client: Any) -> None:
    topic = _topic("metadata")
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, producer_name="meta-producer")
    sent = producer.send(b"body", properties={"a": "1", "b": "2"}, partition_key="pk", ordering_key="ok",
                         event_timestamp=1_234_567)
    message = consumer.receive(RECEIVE_MS)
    assert message.message_id() == sent
    assert message.properties() == {"a": "1", "b": "2"}
    assert message.partition_key() == "pk"
    assert message.ordering_key() == "ok"
    assert message.event_timestamp() == 1_234_567
    assert message.producer_name() == "meta-producer"
    assert abs(message.publish_timestamp() - time.time() * 1000) < 60_000
    assert message.topic_name() == topic


def test_largest_message(client: Any) -> None:
    """An entry of almost the advertised maximum (5 MiB) goes through both ways."""
    topic = _topic("large")
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic)
    payload = bytes(range(256)) * ((5 * 1024 * 1024 - 1024) // 256)
    producer.send(payload)
    assert consumer.receive(RECEIVE_MS).data() == payload
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(payload + bytes(2048))
