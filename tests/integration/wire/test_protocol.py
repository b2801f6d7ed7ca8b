"""The real pulsar-client (3.13.0, C++ core 4.2.0) against compactd: produce and consume.

Covers INTERFACES.md §2 beyond the smoke test: batching and every compression codec the
client offers, durable subscriptions across a broker restart, Exclusive's ConsumerBusy,
Shared + read_compacted refused, negative acknowledgement, producer de-duplication, and
``get_last_message_id`` / ``has_message_available`` at the end of a topic. Seek and
readers are in ``test_seek.py``; Failover, Shared and the table view in ``test_dispatch.py``.

Every wait is bounded: ``receive``/``read_next`` with small timeouts, ``Timeout`` meaning
"nothing more comes".
"""

from __future__ import annotations

import socket
import time
from typing import Any, Self

import pulsar
import pytest

from api.wire.frames import FrameDecoder, encode_command
from ledger.position import Position
from message.proto import pulsar_api_pb2 as pb
from tests.integration.wire.helpers import RECEIVE_MS, SILENCE_MS, wait_for_mark_delete, wait_until
from tests.integration.wire.helpers import drain as _drain
from tests.integration.wire.helpers import unique_topic as _topic

pytestmark = pytest.mark.integration





def _receive_n(consumer: Any, count: int) -> list[Any]:
    return [consumer.receive(RECEIVE_MS) for _ in range(count)]


def _read_all(reader: Any) -> list[Any]:
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(RECEIVE_MS))
    return out


def _send_batch(producer: Any, payloads: list[bytes], **kwargs: Any) -> list[Any]:
    """Send ``payloads`` asynchronously and flush, so that a batching producer puts them in
    one batch; returns their message ids in order."""
    ids: list[Any] = [None] * len(payloads)
    errors: list[Any] = []

    def done(index: int) -> Any:
        def callback(result: Any, message_id: Any) -> None:
            if result != pulsar.Result.Ok:
                errors.append(result)
            ids[index] = message_id
        return callback

    for index, payload in enumerate(payloads):
        producer.send_async(payload, done(index), **kwargs)
    producer.flush()
    assert not errors
    return ids


# -- produce/consume: batching x compression ----------------------------------------------

COMPRESSIONS = ["NONE", "LZ4", "ZLib", "ZSTD", "SNAPPY"]


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_produce_consume_every_compression(client: Any, compression: str, batched: bool) -> None:
    topic = _topic(f"codec-{compression.lower()}")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic, compression_type=getattr(pulsar.CompressionType, compression),
        batching_enabled=batched, batching_max_messages=1000, batching_max_publish_delay_ms=1000,
    )
    # Compressible payloads large enough for every codec to actually compress them.
    payloads = [(b"payload-%03d-" % i) * 40 for i in range(25)]
    if batched:
        ids = _send_batch(producer, payloads, partition_key="k", properties={"p": "v"})
        assert {(i.ledger_id(), i.entry_id()) for i in ids} == {(ids[0].ledger_id(), ids[0].entry_id())}
        assert [i.batch_index() for i in ids] == list(range(25))
    else:
        ids = [producer.send(p, partition_key="k", properties={"p": "v"}) for p in payloads]
        assert len({(i.ledger_id(), i.entry_id()) for i in ids}) == 25
        assert all(i.batch_index() == -1 for i in ids)

    received = _receive_n(consumer, 25)
    assert [m.data() for m in received] == payloads
    assert [m.message_id() for m in received] == ids
    assert all(m.partition_key() == "k" and m.properties() == {"p": "v"} for m in received)
    for message in received:
        consumer.acknowledge(message)
    assert _drain(consumer) == []
    # A reader from the start sees the same messages (stored bytes replayed verbatim).
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [m.data() for m in _read_all(reader)] == payloads


def test_batched_and_single_entries_mixed(client: Any) -> None:
    topic = _topic("mixed")
    single = client.create_producer(topic)
    batching = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000,
                                      compression_type=pulsar.CompressionType.LZ4)
    single.send(b"s0")
    _send_batch(batching, [b"b0", b"b1", b"b2"])
    single.send(b"s1")
    _send_batch(batching, [b"b3"])
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = _receive_n(consumer, 6)
    assert [m.data() for m in got] == [b"s0", b"b0", b"b1", b"b2", b"s1", b"b3"]
    consumer.acknowledge_cumulative(got[-1])
    assert _drain(consumer) == []


# -- durable subscriptions across a restart -------------------------------------------------


def test_durable_subscription_resumes_after_restart(broker: Any, client: Any) -> None:
    topic = _topic("durable")
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(b"m%d" % i)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    got = _receive_n(consumer, 10)
    consumer.acknowledge_cumulative(got[3])  # m0..m3
    consumer.acknowledge(got[6])  # a hole: m6 acked, m4, m5, m7.. not
    consumer.close()  # flushes the client's grouped acks
    producer.close()

    broker.restart()

    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    again = _drain(consumer)
    assert [m.data() for m in again] == [b"m4", b"m5", b"m7", b"m8", b"m9"]
    for message in again:
        consumer.acknowledge(message)
    consumer.close()

    broker.restart()

    # Everything acknowledged, persisted: nothing comes back; new messages do.
    consumer = client.subscribe(topic, "sub")
    assert _drain(consumer) == []
    client.create_producer(topic).send(b"m10")
    assert consumer.receive(RECEIVE_MS).data() == b"m10"


def test_durable_subscription_keeps_what_was_published_while_nobody_listened(broker: Any, client: Any) -> None:
    topic = _topic("durable-latest")
    client.create_producer(topic).send(b"before")  # before the subscription: not for it
    client.subscribe(topic, "sub").close()  # created at Latest
    producer = client.create_producer(topic)
    producer.send(b"m0")
    broker.restart()
    producer.send(b"m1")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in _drain(consumer)] == [b"m0", b"m1"]  # initial position ignored


def test_redeliver_unacknowledged_messages(broker: Any, client: Any) -> None:
    topic = _topic("redeliver")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic)
    for i in range(4):
        producer.send(b"m%d" % i)
    got = _receive_n(consumer, 4)
    consumer.acknowledge(got[0])
    consumer.acknowledge(got[2])
    # The client sends acks grouped (every 100 ms) but REDELIVER at once: an ack still in the
    # client's group when the redelivered copy arrives is at-least-once territory (Pulsar's
    # too). What the broker had applied must not come again.
    _wait_for_acks(broker, topic, "sub", [got[0].message_id(), got[2].message_id()])
    consumer.redeliver_unacknowledged_messages()
    assert [m.data() for m in _drain(consumer)] == [b"m1", b"m3"]


def test_live_consumer_survives_broker_restart(broker: Any, client: Any) -> None:
    """The broker goes away under a connected consumer and producer: both reconnect, the
    unacknowledged messages come again, the acknowledged ones do not."""
    topic = _topic("live-restart")
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(6):
        producer.send(b"m%d" % i)
    got = _receive_n(consumer, 6)
    consumer.acknowledge_cumulative(got[2])  # m0..m2
    # The client groups acks for up to 100 ms; wait until the broker has applied them.
    wait_for_mark_delete(broker, topic, "sub", got[2].message_id())

    broker.restart()

    producer.send(b"m6")  # reconnects the producer
    seen = [m.data() for m in _drain(consumer, 2_000)]
    assert b"m6" in seen
    assert b"m0" not in seen and b"m1" not in seen and b"m2" not in seen
    # Unacknowledged ones the client had not been told were consumed come again.
    assert set(seen) >= {b"m3", b"m4", b"m5", b"m6"}


def _wait_for_acks(broker: Any, topic: str, subscription: str, message_ids: list[Any]) -> None:
    """Until the broker has applied an acknowledgement of each of ``message_ids``."""
    wanted = [Position(m.ledger_id(), m.entry_id()) for m in message_ids]

    def applied() -> bool:
        loaded = broker.service.registry.loaded.get(topic)
        sub = loaded.subscriptions.get(subscription) if loaded else None
        return sub is not None and all(sub.cursor.is_acknowledged(p) for p in wanted)

    wait_until(applied, "the broker applying the acknowledgements")


def test_tombstones_and_empty_payloads_reach_consumers(client: Any) -> None:
    """Without compaction, a tombstone is an ordinary message with a null value; an empty
    payload is not a tombstone."""
    topic = _topic("tombstones")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    client.create_producer(topic).send(None, partition_key="k")
    client.create_producer(topic).send(b"", partition_key="k")
    batching = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000)
    batching.send_async(None, None, partition_key="k")
    batching.send_async(b"v", None, partition_key="k")
    batching.flush()
    got = _receive_n(consumer, 4)
    assert [m.has_null_value() for m in got] == [True, False, True, False]
    assert [m.data() for m in got] == [b"", b"", b"", b"v"]
    assert {m.partition_key() for m in got} == {"k"}


def test_non_persistent_topics_are_refused(client: Any) -> None:
    """compactd only has persistent topics; the refusal (NotAllowed) is one the client
    does not retry, so it fails at once."""
    started = time.monotonic()
    with pytest.raises(pulsar.NotAllowedError):
        client.create_producer("non-persistent://public/default/np")
    assert time.monotonic() - started < 5
    client.create_producer(_topic("fine")).send(b"x")  # the connection is still usable


# -- refusals ----------------------------------------------------------------------------------


def test_exclusive_second_consumer_is_refused(client: Any) -> None:
    topic = _topic("exclusive")
    first = client.subscribe(topic, "sub")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "sub")
    # A different type on the same subscription is refused too.
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    # Once the first closes the subscription takes a new consumer.
    first.close()
    second = client.subscribe(topic, "sub")
    client.create_producer(topic).send(b"x")
    assert second.receive(RECEIVE_MS).data() == b"x"


def test_shared_read_compacted_is_refused(broker: Any, client: Any) -> None:
    """The C++ client refuses Shared + read_compacted itself (InvalidConfiguration), so the
    broker's own refusal is checked with a hand-written SUBSCRIBE over TCP."""
    topic = _topic("shared-compacted")
    with pytest.raises(pulsar.InvalidConfiguration):
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared, is_read_compacted=True)
    with _RawClient(broker.url) as raw:
        answer = raw.request(pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE, subscribe=pb.CommandSubscribe(
            topic=topic, subscription="sub", subType=pb.CommandSubscribe.Shared, consumer_id=0,
            request_id=7, read_compacted=True)))
        assert answer.type == pb.BaseCommand.ERROR
        assert answer.error.request_id == 7
        assert answer.error.error == pb.NotAllowedError
        assert "readCompacted" in answer.error.message
    # Exclusive and Failover may read compacted.
    client.subscribe(topic, "a", is_read_compacted=True).close()
    client.subscribe(topic, "b", consumer_type=pulsar.ConsumerType.Failover, is_read_compacted=True).close()


def test_a_refused_subscribe_is_answered_cleanly(client: Any) -> None:
    """A refused request is answered with an ERROR the client can map (here ConsumerBusy:
    a STICKY Key_Shared consumer on an AUTO_SPLIT subscription), not by dropping the
    connection (which would make the client retry until its timeout)."""
    topic = _topic("key-shared")
    client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.KeyShared)
    started = time.monotonic()
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.KeyShared,
                         key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                             key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 100)]))
    assert time.monotonic() - started < 5
    # The connection is still good for everything else.
    consumer = client.subscribe(topic, "sub2")
    client.create_producer(topic).send(b"x")
    assert consumer.receive(RECEIVE_MS).data() == b"x"


def test_ack_with_request_id_gets_an_ack_response(broker: Any, client: Any) -> None:
    """Ack receipts: the Python client does not offer ``ack_receipt_enabled`` (3.13.0), so
    a hand-written ACK carrying a request id checks the ACK_RESPONSE, and that the ack is
    applied (the real client then sees nothing redelivered)."""
    topic = _topic("ack-receipt")
    message_id = client.create_producer(topic).send(b"m0")
    with _RawClient(broker.url) as raw:
        answer = raw.request(pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE, subscribe=pb.CommandSubscribe(
            topic=topic, subscription="sub", subType=pb.CommandSubscribe.Exclusive, consumer_id=3,
            request_id=1, initialPosition=pb.CommandSubscribe.Earliest)))
        assert answer.type == pb.BaseCommand.SUCCESS
        ack = pb.CommandAck(consumer_id=3, ack_type=pb.CommandAck.Individual, request_id=42)
        ack.message_id.add(ledgerId=message_id.ledger_id(), entryId=message_id.entry_id())
        answer = raw.request(pb.BaseCommand(type=pb.BaseCommand.ACK, ack=ack))
        assert answer.type == pb.BaseCommand.ACK_RESPONSE
        assert (answer.ackResponse.consumer_id, answer.ackResponse.request_id) == (3, 42)
        assert not answer.ackResponse.HasField("error")
    consumer = client.subscribe(topic, "sub")
    assert _drain(consumer) == []


class _RawClient:
    """A minimal hand-written Pulsar connection, for what the Python client cannot send."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("pulsar://").rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=5)
        self.decoder = FrameDecoder()
        self.pending: list[pb.BaseCommand] = []
        connected = self.request(pb.BaseCommand(type=pb.BaseCommand.CONNECT, connect=pb.CommandConnect(
            client_version="raw-test", protocol_version=20)))
        assert connected.type == pb.BaseCommand.CONNECTED

    def request(self, command: pb.BaseCommand) -> pb.BaseCommand:
        """Send ``command`` and return the next command from the broker that is not a PING."""
        self.socket.sendall(encode_command(command))
        while True:
            while not self.pending:
                data = self.socket.recv(65536)
                assert data, "the broker closed the connection"
                self.pending.extend(frame.command for frame in self.decoder.feed(data))
            answer = self.pending.pop(0)
            if answer.type != pb.BaseCommand.PING:
                return answer

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.socket.close()


# -- negative acknowledgement ------------------------------------------------------------------


@pytest.mark.parametrize("consumer_type", ["Exclusive", "Shared", "Failover"])
def test_negative_ack_redelivers(client: Any, consumer_type: str) -> None:
    topic = _topic("nack")
    consumer = client.subscribe(
        topic, "sub", consumer_type=getattr(pulsar.ConsumerType, consumer_type),
        negative_ack_redelivery_delay_ms=100, initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(b"m%d" % i)
    got = _receive_n(consumer, 3)
    consumer.acknowledge(got[0])
    consumer.acknowledge(got[2])
    consumer.negative_acknowledge(got[1])
    again = consumer.receive(RECEIVE_MS)
    assert again.data() == b"m1"
    assert again.message_id() == got[1].message_id()
    if consumer_type == "Shared":  # the broker counts redeliveries on Shared subscriptions
        assert again.redelivery_count() == 1
    consumer.acknowledge(again)
    assert _drain(consumer) == []


# -- producer de-duplication ---------------------------------------------------------------------


def _enable_deduplication(broker: Any) -> None:
    """Turn de-duplication on for the namespace (a policy, persisted like Pulsar's)."""
    async def enable() -> None:
        await broker.service.admin.set_policy("public/default", "deduplicationEnabled", True)
    broker.call(enable())


def test_deduplication_is_off_by_default_and_every_send_is_stored(client: Any) -> None:
    topic = _topic("dedup-off")
    producer = client.create_producer(topic, producer_name="fixed")
    first = producer.send(b"a", sequence_id=5)
    producer.close()
    producer = client.create_producer(topic, producer_name="fixed")
    assert producer.last_sequence_id() == -1  # Pulsar answers -1 with de-duplication off
    second = producer.send(b"a", sequence_id=5)
    assert second != first
    assert [m.data() for m in _read_all(client.create_reader(topic, pulsar.MessageId.earliest))] == [b"a", b"a"]


def test_producer_deduplication_by_name_and_sequence_id(broker: Any, client: Any) -> None:
    _enable_deduplication(broker)
    topic = _topic("dedup")
    producer = client.create_producer(topic, producer_name="fixed")
    assert producer.last_sequence_id() == -1
    a = producer.send(b"a", sequence_id=5)
    producer.send(b"b", sequence_id=6)
    producer.close()

    # Reconnect under the same name: the broker tells the producer where it stands, and a
    # re-send of a stored message is answered with the stored message's id.
    producer = client.create_producer(topic, producer_name="fixed")
    assert producer.last_sequence_id() == 6
    assert producer.send(b"a", sequence_id=5) == a
    producer.send(b"c", sequence_id=7)
    assert producer.last_sequence_id() == 7
    # A sequence id reused within one session is no re-send: a new message, stored.
    producer.send(b"b-again", sequence_id=6)
    producer.close()
    # A producer that lets the client number its messages continues after the stored ones
    # (the client starts at last_sequence_id + 1).
    producer = client.create_producer(topic, producer_name="fixed")
    assert producer.last_sequence_id() == 7
    producer.send(b"d")
    assert producer.last_sequence_id() == 8
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = _read_all(reader)
    assert [m.data() for m in got] == [b"a", b"b", b"c", b"b-again", b"d"]
    assert [m.producer_name() for m in got] == ["fixed"] * 5


def test_producer_deduplication_survives_a_broker_restart(broker: Any, client: Any) -> None:
    _enable_deduplication(broker)
    topic = _topic("dedup-restart")
    producer = client.create_producer(topic, producer_name="fixed")
    ids = [producer.send(b"m%d" % sequence_id, sequence_id=sequence_id) for sequence_id in range(3)]
    producer.close()
    broker.restart()
    producer = client.create_producer(topic, producer_name="fixed")
    assert producer.send(b"m2", sequence_id=2) == ids[2]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [m.data() for m in _read_all(reader)] == [b"m0", b"m1", b"m2"]
    assert producer.last_sequence_id() == 2


# -- get_last_message_id / has_message_available --------------------------------------------------


def test_last_message_id_and_has_message_available_on_empty_topic(client: Any) -> None:
    topic = _topic("empty")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    last = consumer.get_last_message_id()
    assert last.entry_id() == -1
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    latest_reader = client.create_reader(topic, pulsar.MessageId.latest)
    assert not latest_reader.has_message_available()
    with pytest.raises(pulsar.Timeout):
        reader.read_next(SILENCE_MS)
    # The first message makes both readers see it.
    message_id = client.create_producer(topic).send(b"first")
    assert reader.has_message_available()
    assert reader.read_next(RECEIVE_MS).message_id() == message_id
    assert not reader.has_message_available()
    assert latest_reader.has_message_available()
    assert latest_reader.read_next(RECEIVE_MS).data() == b"first"
    assert consumer.get_last_message_id() == message_id


def test_has_message_available_after_consuming_everything(client: Any) -> None:
    topic = _topic("consumed")
    producer = client.create_producer(topic)
    ids = [producer.send(b"m%d" % i) for i in range(5)]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [m.message_id() for m in _read_all(reader)] == ids
    assert not reader.has_message_available()
    # A reader from latest on a non-empty topic has nothing either (mark-delete == last).
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    assert not latest.has_message_available()
    latest_inclusive = client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert latest_inclusive.has_message_available()
    assert latest_inclusive.read_next(RECEIVE_MS).message_id() == ids[-1]
    assert not latest_inclusive.has_message_available()
    # A reader starting exclusively at the last message has nothing; inclusively, one.
    assert not client.create_reader(topic, ids[-1]).has_message_available()
    inclusive = client.create_reader(topic, ids[-1], start_message_id_inclusive=True)
    assert inclusive.has_message_available()
    assert inclusive.read_next(RECEIVE_MS).message_id() == ids[-1]
    assert not inclusive.has_message_available()

    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    assert consumer.get_last_message_id() == ids[-1]
    consumer.acknowledge_cumulative(_receive_n(consumer, 5)[-1])
    assert consumer.get_last_message_id() == ids[-1]


def test_last_message_id_of_a_batched_last_entry(client: Any) -> None:
    topic = _topic("batched-last")
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000)
    client.create_producer(topic).send(b"single")
    ids = _send_batch(producer, [b"b%d" % i for i in range(5)])
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id(), last.batch_index()) == (
        ids[-1].ledger_id(), ids[-1].entry_id(), 4)

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = _read_all(reader)
    assert [m.data() for m in got] == [b"single"] + [b"b%d" % i for i in range(5)]
    assert not reader.has_message_available()
    # Starting inside the batch: exclusive skips up to and including the start slot.
    middle = client.create_reader(topic, ids[2])
    assert [m.data() for m in _read_all(middle)] == [b"b3", b"b4"]
    at_last = client.create_reader(topic, ids[4])
    assert not at_last.has_message_available()
    # A reader at latest: mark-delete is the last entry (no batch index), so nothing left.
    assert not client.create_reader(topic, pulsar.MessageId.latest).has_message_available()
    # Latest, inclusive: the client starts at the last message itself.
    latest_inclusive = client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert latest_inclusive.has_message_available()
    assert latest_inclusive.read_next(RECEIVE_MS).data() == b"b4"
    assert not latest_inclusive.has_message_available()
