"""Hostile but legal input never poisons state: each bad value is refused for its command.

Driven through ``ServerConnection`` over a real broker (``harness``): the answer is the
one the command expects (ERROR with its request id, a failed lookup, SEND_ERROR), the
connection stays usable, and nothing was created — no cursor, no entry, no sequence id.
"""

from __future__ import annotations

import asyncio
import struct
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.broker.service import BrokerService
from api.wire.frames import encode_command, encode_payload_command, make_command
from api.wire.validate import SIGNED_64_MAX, entry_problem
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import T, Wire, broker_service, settle

TOPIC = "persistent://public/default/validated"


def _metadata(producer: str = "p", sequence_id: int = 0, **fields: object) -> pb.MessageMetadata:
    return pb.MessageMetadata(producer_name=producer, sequence_id=sequence_id,
                              publish_time=int(time.time() * 1000), **fields)


def _send(wire: Wire, sequence_id: int, entry: bytes, *, producer_id: int = 1) -> bytes:
    command = make_command(pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=1))
    return encode_payload_command(command, entry)


def _with_bad_utf8(command: pb.BaseCommand, text: str) -> bytes:
    """The frame of ``command`` with the UTF-8 of ``text`` (in some string field) made
    invalid: its first byte becomes 0xff."""
    from api.wire.frames import encode_command

    raw = encode_command(command)
    encoded = text.encode()
    assert raw.count(encoded) == 1, "choose a text that occurs once"
    return raw.replace(encoded, b"\xff" + encoded[1:])


def _run(path: Path, body: object) -> None:
    async def main() -> None:
        with broker_service(path) as broker:
            await body(broker)  # type: ignore[operator]
    asyncio.run(main())


def _producer(wire: Wire, topic: str = TOPIC, name: str | None = None) -> pb.CommandProducerSuccess:
    command = pb.CommandProducer(topic=topic, producer_id=1, request_id=1)
    if name is not None:
        command.producer_name = name
    answer = wire.request(make_command(command))
    assert [frame.type for frame in answer] == [T.PRODUCER_SUCCESS], answer
    return answer[0].command.producer_success


def test_a_subscription_name_that_is_not_utf8_is_refused_and_creates_no_cursor(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        wire = Wire(broker)
        subscribe = make_command(pb.CommandSubscribe(
            topic=TOPIC, subscription="ghost-sub", subType=pb.CommandSubscribe.Exclusive,
            consumer_id=7, request_id=42))
        answer = wire.request_bytes(_with_bad_utf8(subscribe, "ghost-sub"))
        assert [frame.type for frame in answer] == [T.ERROR]
        assert answer[0].command.error.request_id == 42
        assert "UTF-8" in answer[0].command.error.message
        assert broker.cursors.list(TOPIC) == []  # not even the topic was made
        assert not wire.protocol.consumers
        assert not wire.closed
        assert [f.type for f in wire.request(make_command(pb.CommandPing()))] == [T.PONG]
    _run(tmp_path, body)


@pytest.mark.parametrize("door", ["lookup", "partitioned-metadata", "producer", "subscribe", "namespace"])
@pytest.mark.parametrize("bad", ["persistent://public/default/t\n", "t\n", "persistent://public/default/a\tb",
                                 "persistent://public/default/\x00"])
def test_topic_names_with_control_characters_are_refused_on_every_wire_door(
    tmp_path: Path, door: str, bad: str,
) -> None:
    async def body(broker: BrokerService) -> None:
        wire = Wire(broker)
        if door == "lookup":
            answer = wire.request(make_command(pb.CommandLookupTopic(topic=bad, request_id=5)))
            assert answer[0].command.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
            assert answer[0].command.lookupTopicResponse.error == pb.InvalidTopicName
        elif door == "partitioned-metadata":
            answer = wire.request(make_command(pb.CommandPartitionedTopicMetadata(topic=bad, request_id=5)))
            response = answer[0].command.partitionMetadataResponse
            assert response.response == pb.CommandPartitionedTopicMetadataResponse.Failed
            assert response.error == pb.InvalidTopicName
        elif door == "producer":
            answer = wire.request(make_command(pb.CommandProducer(topic=bad, producer_id=1, request_id=5)))
            assert answer[0].command.error.error == pb.InvalidTopicName
        elif door == "subscribe":
            answer = wire.request(make_command(pb.CommandSubscribe(
                topic=bad, subscription="s", subType=0, consumer_id=1, request_id=5)))
            assert answer[0].command.error.error == pb.InvalidTopicName
        else:
            namespace = bad.removeprefix("persistent://").rsplit("/", 1)[0] + "\n"
            answer = wire.request(make_command(pb.CommandGetTopicsOfNamespace(namespace=namespace, request_id=5)))
            assert answer[0].command.error.error == pb.InvalidTopicName
        assert len(answer) == 1 and not wire.closed
        assert broker.registry.loaded == {}
        assert broker.data_dir.metadata.list_topics() == []
    _run(tmp_path, body)


def test_a_send_with_a_sequence_id_above_int64_is_refused_and_the_producer_name_stays_usable(
    tmp_path: Path,
) -> None:
    async def body(broker: BrokerService) -> None:
        wire = Wire(broker)
        _producer(wire, name="big")
        for sequence_id in (SIGNED_64_MAX + 1, (1 << 64) - 1):
            answer = wire.request_bytes(_send(wire, sequence_id, encode_entry(
                _metadata("big", 0), b"v", with_checksum=False)))
            assert [frame.type for frame in answer] == [T.SEND_ERROR]
            assert answer[0].command.send_error.sequence_id == sequence_id
        # the same in the entry's own metadata (replayed into de-duplication after a restart)
        answer = wire.request_bytes(_send(wire, 0, encode_entry(
            _metadata("big", SIGNED_64_MAX + 1), b"v", with_checksum=False)))
        assert [frame.type for frame in answer] == [T.SEND_ERROR]
        assert broker.registry.loaded[TOPIC].ledger.entries_added_counter == 0
        assert broker.registry.loaded[TOPIC].last_sequence_id("big") == -1
        # a later producer of that name works (once this one closed), and so does a send
        closed = wire.request_bytes(encode_command(make_command(pb.CommandCloseProducer(producer_id=1, request_id=99))))
        assert [frame.type for frame in closed] == [T.SUCCESS]
        other = Wire(broker)
        success = _producer(other, name="big")
        assert success.last_sequence_id == -1
        other.feed(_send(other, 0, encode_entry(_metadata("big", 0), b"ok", with_checksum=False)))
        await settle(lambda: any(f.type == T.SEND_RECEIPT for f in other.answers()))
    _run(tmp_path, body)


def _corrupt_entries() -> dict[str, bytes]:
    body = b"x" * 100
    single = pb.SingleMessageMetadata(payload_size=5)
    slot = struct.pack(">I", single.ByteSize()) + single.SerializeToString() + b"hello"
    return {
        "zlib-garbage": encode_entry(_metadata(compression=pb.ZLIB, uncompressed_size=100),
                                     b"not zlib at all", with_checksum=False),
        "zlib-wrong-size": encode_entry(_metadata(compression=pb.ZLIB, uncompressed_size=99),
                                        zlib.compress(body), with_checksum=False),
        "lz4-garbage": encode_entry(_metadata(compression=pb.LZ4, uncompressed_size=100),
                                    b"\xff" * 20, with_checksum=False),
        "batch-count-too-high": encode_entry(_metadata(num_messages_in_batch=3), slot, with_checksum=False),
        "batch-slot-overruns": encode_entry(_metadata(num_messages_in_batch=1), slot[:-2], with_checksum=False),
        "batch-count-huge": encode_entry(_metadata(num_messages_in_batch=2**31 - 1), slot, with_checksum=False),
        "metadata-without-required-fields": b"\x00\x00\x00\x02\x08\x01" + b"payload",
        "producer-name-not-utf8": encode_entry(_metadata("\u00e9t\u00e9"), b"v", with_checksum=False).replace(
            "\u00e9t\u00e9".encode(), b"\xff\xfet\xff\xfe"),
    }


@pytest.mark.parametrize("case", list(_corrupt_entries()))
def test_a_send_whose_payload_does_not_decode_is_refused_and_stores_nothing(tmp_path: Path, case: str) -> None:
    async def body(broker: BrokerService) -> None:
        wire = Wire(broker)
        _producer(wire)
        entry = _corrupt_entries()[case]  # the frame carries a checksum that matches it
        answer = wire.request_bytes(_send(wire, 0, entry))
        assert [frame.type for frame in answer] == [T.SEND_ERROR]
        assert answer[0].command.send_error.error == pb.ChecksumError
        assert not wire.closed
        good = encode_entry(_metadata("p", 1), b"good", with_checksum=False)
        wire.feed(_send(wire, 1, good))
        await settle(lambda: any(f.type == T.SEND_RECEIPT for f in wire.answers()))
        entries = broker.registry.loaded[TOPIC].ledger.read_entries(broker.registry.loaded[TOPIC].ledger.first_position(), 10)
        assert [e.data for e in entries] == [good]
    _run(tmp_path, body)


_CODECS = st.sampled_from([pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY])
_VALUES = st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=8)), st.binary(max_size=64)),
                   min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(codec=_CODECS, messages=_VALUES, batched=st.booleans(), sequence_id=st.integers(0, SIGNED_64_MAX))
def test_every_entry_a_producer_writes_passes(
    codec: pb.CompressionType, messages: list[tuple[str | None, bytes]], batched: bool, sequence_id: int,
) -> None:
    """No false refusal: what the encoder writes as a producer would is always accepted."""
    template = _metadata("producer-\u00e9", sequence_id)
    if batched:
        slots = [(pb.SingleMessageMetadata(partition_key=key) if key is not None else pb.SingleMessageMetadata(),
                  value) for key, value in messages]
        entry = encode_batch(template, slots, codec, with_checksum=False)
    else:
        from message.compression import compress
        value = messages[0][1]
        template.compression, template.uncompressed_size = codec, len(value)
        entry = encode_entry(template, compress(codec, value), with_checksum=False)
    assert entry_problem(entry) is None


@pytest.mark.parametrize("field", ["subscription", "consumer_name", "producer_name"])
@pytest.mark.parametrize("bad", ["a\nb", "tab\there", "\x00", "del\x7f"])
def test_names_with_control_characters_are_refused_and_create_nothing(tmp_path: Path, field: str, bad: str) -> None:
    async def body(broker: BrokerService) -> None:
        wire = Wire(broker)
        if field == "producer_name":
            command = make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=9, producer_name=bad))
        else:
            names = {"subscription": "sub", "consumer_name": "c", field: bad}
            command = make_command(pb.CommandSubscribe(
                topic=TOPIC, subType=0, consumer_id=1, request_id=9, **names))
        answer = wire.request(command)
        assert [frame.type for frame in answer] == [T.ERROR]
        assert answer[0].command.error.request_id == 9
        assert answer[0].command.error.error == pb.NotAllowedError
        assert not wire.protocol.producers and not wire.protocol.consumers
        assert broker.cursors.list(TOPIC) == []
    _run(tmp_path, body)
