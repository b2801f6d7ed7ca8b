"""Fuzzing the frame decoder and every command handler: no input makes a handler fail.

Inputs are built from valid commands of every type a ``ServerConnection`` handles (and a
few it refuses), with ids, sequence ids, message ids and names drawn from small pools that
include the edges (0, 2**63, 2**64 - 1, control characters, invalid UTF-8), then mutated
at the byte level (bit flips, overwrites, insertions, deletions, truncations, splices) or
replaced by random bytes. They go through ``ServerConnection.data_received`` over a fake
transport (``harness``) into a real broker, so every handler runs against real topics,
cursors and ledgers. The contract checked: the "failed to handle" path (an exception a
handler did not expect) is never taken, nothing escapes ``data_received``, no loop
callback fails, and afterwards the broker still serves the real client over TCP.

``test_seeded_mutations`` runs ``FUZZ_INPUTS`` inputs (100 k; ``COMPACTD_FUZZ_INPUTS``
changes it) from a fixed seed, so a failure reproduces; hypothesis explores the command
fields structurally.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.broker.service import BrokerService
from api.config import Settings
from api.wire.frames import encode_command, encode_payload_command, make_command
from ledger.storage.base import SyncPolicy
from message.compression import compress
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import Wire, broker_service, settle

FUZZ_INPUTS = int(os.environ.get("COMPACTD_FUZZ_INPUTS", "100000"))
SEED = 20261124
U64 = (1 << 64) - 1
IDS = [0, 1, 2, 3, 7, 2**31, 2**63 - 1, 2**63, U64]
SEQUENCE_IDS = [0, 1, 2, 5, 100, 2**31, 2**63 - 1, 2**63, U64]
LEDGER_IDS = [0, 1, 2, 3, 2**63 - 1, 2**63, U64]
TOPICS = ["persistent://public/default/fuzz-a", "fuzz-b", "persistent://public/default/fuzz-c",
          "persistent://public/default/fuzz-a\n", "non-persistent://public/default/x", "bad//name", ""]
NAMES = ["sub", "s2", "reader-0123456789", "", "a\nb", "\x00", "__compaction", "__dedup", "é"]
NAMESPACES = ["public/default", "public", "public/default/x", "pub\x00lic/default", ""]


class _Failures(logging.Handler):
    """Records the "failed to handle" log of ``ServerConnection._handle``."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _message_id(rng: random.Random) -> pb.MessageIdData:
    message_id = pb.MessageIdData(ledgerId=rng.choice(LEDGER_IDS), entryId=rng.choice(LEDGER_IDS))
    if rng.random() < 0.3:
        message_id.batch_index = rng.choice([-1, 0, 1, 5, 2**31 - 1, -2**31])
    if rng.random() < 0.2:
        message_id.ack_set.extend(rng.choice([-1, 0, 1, 2**63 - 1, -2**63]) for _ in range(rng.randint(1, 3)))
    return message_id


def _entry(rng: random.Random) -> bytes:
    metadata = pb.MessageMetadata(producer_name=rng.choice(["p", "compactd-0", "q"]),
                                  sequence_id=rng.choice(SEQUENCE_IDS), publish_time=int(time.time() * 1000))
    if rng.random() < 0.3:
        metadata.partition_key = rng.choice(["k1", "k2", ""])
    codec = rng.choice([pb.NONE, pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY])
    if rng.random() < 0.4:
        slots = [(pb.SingleMessageMetadata(partition_key=f"k{i % 3}"), b"v" * rng.randint(0, 20))
                 for i in range(rng.randint(1, 5))]
        return encode_batch(metadata, slots, codec, with_checksum=False)
    value = b"x" * rng.randint(0, 50)
    if codec != pb.NONE:
        metadata.compression, metadata.uncompressed_size = codec, len(value)
    return encode_entry(metadata, compress(codec, value), with_checksum=False)


def _command(rng: random.Random) -> bytes:
    """One frame of a valid command, its fields drawn from the pools."""
    pick = rng.choice(_BUILDERS)
    return pick(rng)


def _send(rng: random.Random) -> bytes:
    command = make_command(pb.CommandSend(producer_id=rng.choice(IDS[:4]), sequence_id=rng.choice(SEQUENCE_IDS),
                                          num_messages=rng.choice([1, 2, 0, -1])))
    if rng.random() < 0.2:
        command.send.highest_sequence_id = rng.choice(SEQUENCE_IDS)
    return encode_payload_command(command, _entry(rng), with_checksum=rng.random() < 0.9)


def _subscribe(rng: random.Random) -> bytes:
    request = pb.CommandSubscribe(
        topic=rng.choice(TOPICS), subscription=rng.choice(NAMES), subType=rng.choice([0, 1, 2, 3]),
        consumer_id=rng.choice(IDS[:4]), request_id=rng.choice(IDS), consumer_name=rng.choice(NAMES),
        initialPosition=rng.choice([0, 1]), read_compacted=rng.random() < 0.3)
    if rng.random() < 0.3:
        request.durable = False
        request.start_message_id.CopyFrom(_message_id(rng))
    if rng.random() < 0.1:
        request.priority_level = rng.choice([0, 1, -1, 2**31 - 1])
    return encode_command(make_command(request))


def _ack(rng: random.Random) -> bytes:
    request = pb.CommandAck(consumer_id=rng.choice(IDS[:4]), ack_type=rng.choice([0, 1]))
    request.message_id.extend(_message_id(rng) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.3:
        request.request_id = rng.choice(IDS)
    return encode_command(make_command(request))


def _seek(rng: random.Random) -> bytes:
    request = pb.CommandSeek(consumer_id=rng.choice(IDS[:4]), request_id=rng.choice(IDS))
    if rng.random() < 0.5:
        request.message_publish_time = rng.choice([0, 1, int(time.time() * 1000), 2**63, U64])
    else:
        request.message_id.CopyFrom(_message_id(rng))
    return encode_command(make_command(request))


def _redeliver(rng: random.Random) -> bytes:
    request = pb.CommandRedeliverUnacknowledgedMessages(consumer_id=rng.choice(IDS[:4]))
    request.message_ids.extend(_message_id(rng) for _ in range(rng.randint(0, 3)))
    return encode_command(make_command(request))


def _simple(build: Callable[[random.Random], Any]) -> Callable[[random.Random], bytes]:
    return lambda rng: encode_command(make_command(build(rng)))


_BUILDERS: list[Callable[[random.Random], bytes]] = [
    _simple(lambda r: pb.CommandConnect(client_version=r.choice(NAMES), protocol_version=r.choice([0, 6, 20, 99]))),
    _simple(lambda r: pb.CommandPartitionedTopicMetadata(topic=r.choice(TOPICS), request_id=r.choice(IDS))),
    _simple(lambda r: pb.CommandLookupTopic(topic=r.choice(TOPICS), request_id=r.choice(IDS),
                                            authoritative=r.random() < 0.5)),
    _simple(lambda r: pb.CommandProducer(topic=r.choice(TOPICS), producer_id=r.choice(IDS[:4]),
                                         request_id=r.choice(IDS), producer_name=r.choice(NAMES + ["p"]))),
    _simple(lambda r: pb.CommandProducer(topic=r.choice(TOPICS), producer_id=r.choice(IDS[:4]),
                                         request_id=r.choice(IDS))),
    _send, _send, _send, _subscribe, _subscribe,
    _simple(lambda r: pb.CommandFlow(consumer_id=r.choice(IDS[:4]), messagePermits=r.choice([0, 1, 10, 2**32 - 1]))),
    _ack, _redeliver, _seek,
    _simple(lambda r: pb.CommandGetLastMessageId(consumer_id=r.choice(IDS[:4]), request_id=r.choice(IDS))),
    _simple(lambda r: pb.CommandUnsubscribe(consumer_id=r.choice(IDS[:4]), request_id=r.choice(IDS))),
    _simple(lambda r: pb.CommandCloseProducer(producer_id=r.choice(IDS[:4]), request_id=r.choice(IDS))),
    _simple(lambda r: pb.CommandCloseConsumer(consumer_id=r.choice(IDS[:4]), request_id=r.choice(IDS))),
    _simple(lambda r: pb.CommandPing()), _simple(lambda r: pb.CommandPong()),
    _simple(lambda r: pb.CommandGetTopicsOfNamespace(namespace=r.choice(NAMESPACES), request_id=r.choice(IDS))),
    _simple(lambda r: pb.CommandConsumerStats(request_id=r.choice(IDS), consumer_id=r.choice(IDS[:4]))),
    _simple(lambda r: pb.CommandSuccess(request_id=r.choice(IDS))),  # broker-only: closes
]


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        operation = rng.randrange(6)
        position = rng.randrange(len(data)) if data else 0
        if operation == 0 and data:  # flip a bit
            data[position] ^= 1 << rng.randrange(8)
        elif operation == 1 and data:  # overwrite a byte with an interesting one
            data[position] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, rng.randrange(256)])
        elif operation == 2:  # insert bytes
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif operation == 3 and data:  # delete bytes
            del data[position:position + rng.randint(1, 4)]
        elif operation == 4:  # truncate
            del data[position:]
        else:  # splice in part of another frame
            other = _command(rng)
            cut = rng.randrange(len(other))
            data[position:] = other[cut:]
    if rng.random() < 0.85 and len(data) >= 8:  # keep the lengths consistent, so the body is what is fuzzed
        struct.pack_into(">I", data, 0, len(data) - 4)
    return bytes(data)


def _input(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.45:
        return _command(rng)
    if roll < 0.97:
        return _mutate(rng, _command(rng))
    return bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))


_SETUP = b"".join(encode_command(make_command(body)) for body in (
    pb.CommandProducer(topic=TOPICS[0], producer_id=0, request_id=1),
    pb.CommandProducer(topic=TOPICS[2], producer_id=1, request_id=2, producer_name="p"),
    pb.CommandSubscribe(topic=TOPICS[0], subscription="shared", subType=pb.CommandSubscribe.Shared,
                        consumer_id=0, request_id=3, initialPosition=pb.CommandSubscribe.Earliest),
    pb.CommandSubscribe(topic=TOPICS[2], subscription="failover", subType=pb.CommandSubscribe.Failover,
                        consumer_id=1, request_id=4, initialPosition=pb.CommandSubscribe.Earliest),
    pb.CommandFlow(consumer_id=0, messagePermits=1000), pb.CommandFlow(consumer_id=1, messagePermits=1000),
))
"""What each new connection starts with, so that inputs meet live producers and consumers."""


def _connection(broker: BrokerService) -> Wire:
    wire = Wire(broker)
    wire.feed(_SETUP)
    return wire


async def _fuzz(broker: BrokerService, inputs: list[bytes], failures: _Failures) -> int:
    """Feed ``inputs``, each on the current connection (a new one when it closed);
    returns how many connections were used."""
    wire = _connection(broker)
    connections = 1
    for index, data in enumerate(inputs):
        if wire.closed:
            wire = _connection(broker)
            connections += 1
        if len(wire.transport.frames) > 1000:
            wire.transport.frames.clear()
        wire.feed(data)
        if wire.protocol.decoder.buffered:  # an incomplete frame would swallow what follows:
            wire.close()  # the client goes away mid-frame instead
        if index % 64 == 0:
            await asyncio.sleep(0)  # completions of appends, closed connections
        assert not failures.records, _describe(failures, data)
    await settle()
    return connections


def _describe(failures: _Failures, data: bytes) -> str:
    record = failures.records[0]
    return f"{record.getMessage()} on input {data!r}\n" + (logging.Formatter().formatException(record.exc_info)
                                                          if record.exc_info else "")


def _loop_errors(loop: asyncio.AbstractEventLoop) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    return errors


def _with_failure_log(body: Callable[[_Failures], None]) -> None:
    failures = _Failures()
    logger = logging.getLogger("api.wire.connection")
    logger.addHandler(failures)
    try:
        body(failures)
    finally:
        logger.removeHandler(failures)


def _real_client_round_trip(url: str) -> None:
    client = pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        topic = "persistent://public/default/fuzz-a"
        consumer = client.subscribe(topic, "after-fuzz", initial_position=pulsar.InitialPosition.Latest)
        producer = client.create_producer(topic)
        producer.send(b"still serving")
        assert consumer.receive(10_000).data() == b"still serving"
    finally:
        client.close()


@pytest.mark.slow
def test_seeded_mutations_never_reach_the_failed_to_handle_path(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    inputs = [_input(rng) for _ in range(FUZZ_INPUTS)]

    def body(failures: _Failures) -> None:
        async def main() -> None:
            errors = _loop_errors(asyncio.get_running_loop())
            with broker_service(tmp_path / "data", Settings(compaction_monitor_interval_seconds=0),
                                sync=SyncPolicy.NONE) as broker:
                connections = await _fuzz(broker, inputs, failures)
                assert connections > 100  # the mutations also exercised closing connections
                assert len(broker.registry.loaded) >= 2  # and valid commands reached real topics
                port = await broker.start("127.0.0.1", 0)
                await asyncio.to_thread(_real_client_round_trip, f"pulsar://127.0.0.1:{port}")
            assert not errors, errors[:3]
        asyncio.run(main())

    _with_failure_log(body)


_FIELD_INTS = st.sampled_from([0, 1, 2, 2**31, 2**32 - 1, 2**63 - 1, 2**63, U64]) | st.integers(0, U64)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commands=st.lists(st.tuples(st.integers(0, len(_BUILDERS) - 1), st.integers(0, 2**32), _FIELD_INTS,
                                   st.binary(max_size=6)), min_size=1, max_size=30))
def test_structured_commands_never_reach_the_failed_to_handle_path(
    tmp_path_factory: pytest.TempPathFactory, commands: list[tuple[int, int, int, bytes]],
) -> None:
    """Each command from one builder, with one integer field of its body replaced by an
    arbitrary uint64-range value and arbitrary bytes appended to one string field."""
    def body(failures: _Failures) -> None:
        async def main() -> None:
            errors = _loop_errors(asyncio.get_running_loop())
            with broker_service(tmp_path_factory.mktemp("data"), sync=SyncPolicy.NONE) as broker:
                await _fuzz(broker, [_structured(*command) for command in commands], failures)
            assert not errors, errors[:3]
        asyncio.run(main())

    _with_failure_log(body)


def _structured(builder: int, seed: int, value: int, text: bytes) -> bytes:
    frame = _BUILDERS[builder](random.Random(seed))
    command_size = struct.unpack_from(">I", frame, 4)[0]
    command = pb.BaseCommand.FromString(frame[8:8 + command_size])
    inner = getattr(command, command.DESCRIPTOR.fields_by_number[command.type].name)
    integers = [f for f in inner.DESCRIPTOR.fields if f.cpp_type in (f.CPPTYPE_UINT64, f.CPPTYPE_UINT32)
                and not f.is_repeated]
    if integers:
        field = integers[seed % len(integers)]
        limit = U64 if field.cpp_type == field.CPPTYPE_UINT64 else 2**32 - 1
        setattr(inner, field.name, value & limit)
    rebuilt = command.SerializeToString()
    strings = [f for f in inner.DESCRIPTOR.fields if f.type == f.TYPE_STRING and inner.HasField(f.name)]
    if strings and text:
        old = getattr(inner, strings[seed % len(strings)].name)
        old_bytes = old.encode() if isinstance(old, str) else old
        if old_bytes and rebuilt.count(old_bytes) == 1:
            # same length, so every enclosing length prefix stays right
            replacement = (text * len(old_bytes))[: len(old_bytes)]
            rebuilt = rebuilt.replace(old_bytes, replacement)
    rest = frame[8 + command_size:]
    return struct.pack(">II", 4 + len(rebuilt) + len(rest), len(rebuilt)) + rebuilt + rest
