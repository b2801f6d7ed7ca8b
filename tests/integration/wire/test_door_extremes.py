"""No stored value can make a later operation fail (issue 25, point 2).

A SEND or a PRODUCER with one integer field set to an extreme of its wire type (any field
of ``CommandSend``, ``CommandProducer``, ``MessageMetadata`` or a batch slot's
``SingleMessageMetadata``) is either refused at once (SEND_ERROR, or ERROR for the
PRODUCER) or stored, and then every path that touches it succeeds: compaction (the local
engine here, twice, as every later run would; the Spark engine in the slow test below over
every extreme the door stores), dispatch to real-client readers raw and read-compacted,
the topic's stats, internal stats and a peek, and a backup of the data dir. A PRODUCER
that was granted leaves the topic usable: a later Exclusive producer and a Shared one are
granted once it is gone, and a message goes through.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.config import Settings
from api.wire.frames import Frame, FrameDecoder, encode_command, make_command
from compactor.engine import EngineName
from ledger.backup import take_backup
from message.proto import pulsar_api_pb2 as pb
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import unique_topic
from tests.integration.wire.mutated_sends import send_frame

pytestmark = pytest.mark.integration

T = pb.BaseCommand
F = FieldDescriptor
ANSWER_TIMEOUT_S = 10.0
READ_MS = 300  # a message the client discarded is not waited for longer
_U32 = struct.Struct(">I")
_RANGES = {
    F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_INT64: (-(2**63), 2**63 - 1), F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_BOOL: (0, 1),
}
_PROBES = (0, 1, 2**31 - 1, 2**32 - 1, 2**53, 2**63 - 1, 2**63, 253_402_300_799_999, 253_402_300_800_000)


def _extremes(field: FieldDescriptor) -> list[int]:
    """The ends of ``field``'s wire type, and the values just inside the limits that matter."""
    if field.type == F.TYPE_ENUM:
        numbers = [value.number for value in field.enum_type.values]
        return sorted({min(numbers), max(numbers)})
    low, high = _RANGES[field.type]
    return sorted({low, high, high - 1, -1 if low < 0 else 0, *(v for v in _PROBES if low <= v <= high)})


def _integer_fields(message: type[Any], skip: tuple[str, ...] = ()) -> list[tuple[str, str, int]]:
    return [(message.DESCRIPTOR.name, field.name, value) for field in message.DESCRIPTOR.fields
            if field.type in (*_RANGES, F.TYPE_ENUM) and not field.is_repeated and field.name not in skip
            for value in _extremes(field)]


CASES = [
    *_integer_fields(pb.MessageMetadata),
    *_integer_fields(pb.SingleMessageMetadata),
    *_integer_fields(pb.CommandSend, skip=("producer_id",)),
    *_integer_fields(pb.CommandProducer, skip=("producer_id", "request_id")),
]
"""``(message, field, value)``: every integer field of what a SEND or PRODUCER carries, at each extreme."""


def _set(message: Any, name: str, value: int) -> None:
    field = message.DESCRIPTOR.fields_by_name[name]
    setattr(message, name, bool(value) if field.type == F.TYPE_BOOL else value)


class _Raw:
    """One hand-written connection: requests answered in order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []
        assert self.request(make_command(pb.CommandConnect(client_version="door", protocol_version=20))).type \
            == T.CONNECTED

    def receive(self) -> Frame:
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not self.frames:
            assert time.monotonic() < deadline, "no answer"
            data = self.sock.recv(1 << 16)
            assert data, "the broker closed the connection"
            self.frames.extend(f for f in self.decoder.feed(data) if f.type != T.PING)
        return self.frames.pop(0)

    def request(self, command: pb.BaseCommand) -> Frame:
        self.sock.sendall(encode_command(command))
        return self.receive()

    def close(self) -> None:
        self.sock.close()


def _send(raw: _Raw, case: tuple[str, str, int], producer: str, sequence_id: int) -> Frame:
    """One keyed batch of two slots with ``case`` applied, sent; the broker's answer."""
    where, name, value = case
    slots = [pb.SingleMessageMetadata(payload_size=1, partition_key=f"k{i}", sequence_id=i) for i in range(2)]
    if where == "SingleMessageMetadata":
        _set(slots[1], name, value)
    body = b"".join(_U32.pack(len(raw_slot)) + raw_slot + b"v" for raw_slot in
                    (slot.SerializePartialToString() for slot in slots))
    metadata = pb.MessageMetadata(producer_name=producer, sequence_id=sequence_id, publish_time=int(time.time() * 1000),
                                  num_messages_in_batch=2, uncompressed_size=len(body))
    if where == "MessageMetadata":
        _set(metadata, name, value)
    raw_metadata = metadata.SerializePartialToString()
    send = pb.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=2)
    if where == "CommandSend":
        _set(send, name, value)
    frame = bytearray(send_frame(1, 0, _U32.pack(len(raw_metadata)) + raw_metadata + body))
    command = make_command(send).SerializeToString()  # the SEND itself, as the case has it
    old_size = _U32.unpack_from(frame, 4)[0]
    frame[4:8 + old_size] = _U32.pack(len(command)) + command
    frame[0:4] = _U32.pack(len(frame) - 4)
    raw.sock.sendall(bytes(frame))
    return raw.receive()


def _read_everything(client: Any, topic: str) -> int:
    """Every message of ``topic`` read by a raw and a read-compacted reader, each touched."""
    count = 0
    for compacted in (False, True):
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
        while reader.has_message_available():
            try:
                message = reader.read_next(READ_MS)
            except pulsar.Timeout:  # the client discarded what is left
                break
            message.data(), message.partition_key(), message.properties(), message.event_timestamp()
            message.publish_timestamp(), str(message.message_id())
            count += 1
        reader.close()
    return count


def _touch_every_path(broker: BrokerHarness, client: Any, topic: str, backup_dir: Path) -> None:
    for _ in range(2):  # a stored value must not fail this run, nor any later one
        broker.compact(topic)
    _read_everything(client, topic)
    consumer = client.subscribe(topic, "door", initial_position=pulsar.InitialPosition.Earliest)
    try:
        admin = broker.service.admin  # type: ignore[union-attr]

        async def stats() -> None:
            admin.stats(topic)
            admin.internal_stats(topic)
        broker.call(stats())
    finally:
        consumer.close()
    assert broker.data_dir is not None
    take_backup(broker.data_dir, str(backup_dir / f"backup-{time.monotonic_ns()}"))


def _producer_case(raw: _Raw, broker: BrokerHarness, client: Any, case: tuple[str, str, int], topic: str) -> None:
    _, name, value = case
    request = pb.CommandProducer(topic=topic, producer_id=1, request_id=1, producer_access_mode=pb.Exclusive)
    _set(request, name, value)
    answer = raw.request(make_command(request))
    if answer.type == T.ERROR:
        return  # refused at the door, or by the access-mode rules: nothing held
    assert answer.type == T.PRODUCER_SUCCESS, answer
    if answer.command.producer_success.producer_ready:
        assert raw.request(make_command(pb.CommandCloseProducer(producer_id=1, request_id=2))).type == T.SUCCESS
    for mode in (pulsar.ProducerAccessMode.Exclusive, pulsar.ProducerAccessMode.Shared):
        producer = client.create_producer(topic, access_mode=mode)
        producer.send(b"after")
        producer.close()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerHarness, Any, Path]]:
    base = tmp_path_factory.mktemp("door")
    harness = BrokerHarness(base / "data")
    client = pulsar.Client(harness.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield harness, client, base
    client.close()
    harness.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES))
def test_an_extreme_value_is_refused_or_every_path_takes_it(shared_broker: tuple[BrokerHarness, Any, Path],
                                                           case: tuple[str, str, int]) -> None:
    broker, client, base = shared_broker
    topic = unique_topic("extreme")
    raw = _Raw(broker.port)
    try:
        if case[0] == "CommandProducer":
            _producer_case(raw, broker, client, case, topic)
            return
        success = raw.request(make_command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1)))
        assert success.type == T.PRODUCER_SUCCESS
        answer = _send(raw, case, success.command.producer_success.producer_name, 0)
        assert answer.type in (T.SEND_RECEIPT, T.SEND_ERROR), answer
    finally:
        raw.close()
    if answer.type == T.SEND_RECEIPT:
        _touch_every_path(broker, client, topic, base)


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.slow)])
def test_every_extreme_the_door_stores_is_compacted_by_each_engine(tmp_path: Path, engine: EngineName) -> None:
    """Every SEND case of ``CASES`` on one topic; what is stored is compacted by
    ``engine`` (Spark on local[1]), then again after one more message, and read back raw
    and read-compacted."""
    broker = BrokerHarness(tmp_path / "data", dataclasses.replace(
        Settings(), compaction_engine=engine, spark_master="local[1]"))
    client = pulsar.Client(broker.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        topic = unique_topic(f"extreme-{engine}")
        raw = _Raw(broker.port)
        try:
            success = raw.request(make_command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1)))
            name = success.command.producer_success.producer_name
            answers = [_send(raw, case, name, sequence_id).type
                       for sequence_id, case in enumerate(c for c in CASES if c[0] != "CommandProducer")]
        finally:
            raw.close()
        assert T.SEND_RECEIPT in answers and T.SEND_ERROR in answers
        assert broker.compact(topic).engine == engine
        producer = client.create_producer(topic)
        producer.send(b"later", partition_key="k0")
        producer.close()
        assert broker.compact(topic).engine == engine  # a later run reads the stored values again
        assert _read_everything(client, topic) > 0
    finally:
        client.close()
        broker.close()
