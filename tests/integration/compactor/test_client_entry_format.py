"""Entries exactly as the real pulsar-client (3.13.0, C++ core 4.2.0) sends them parse here.

pulsar-client exposes no serializer for message metadata, so this test stands up the
smallest broker the client will produce to: it answers the handshake, lookup and
producer creation with our generated protobuf code, captures the bytes after each SEND
command (``0x0e01 · crc32c · metadataSize · MessageMetadata · payload``) and answers with
a receipt. The captured bytes then go through ``parse_entry``/``iter_messages`` with and
without the checksum prefix, for every codec, batched and not, with keys, properties and
tombstones.
"""

from __future__ import annotations

import socketserver
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from message.entry import Message, is_batch, iter_messages, parse_entry
from message.proto import pulsar_api_pb2 as pb

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/entry-format"
CLIENT_TIMEOUT_S = 10
"""Every request here is answered at once; 10 s only bounds a broken test."""
SHUTDOWN_POLL_S = 0.02
"""How often the capture broker's accept loop looks for shutdown; keeps teardown fast."""
FRAME_BYTES_MAX = 5 * 1024 * 1024
"""The protocol's default maximum frame size."""


class _CaptureBroker(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Connection)
        self.sent: list[bytes] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.server_address[1]}"


class _Connection(socketserver.BaseRequestHandler):
    server: _CaptureBroker

    def handle(self) -> None:
        self.entry_id = 0
        try:
            while (frame := self._read_frame()) is not None:
                command_size = struct.unpack_from(">I", frame)[0]
                command = pb.BaseCommand.FromString(frame[4 : 4 + command_size])
                self._answer(command, frame[4 + command_size :])
        except (ConnectionError, OSError):
            return

    def _read_frame(self) -> bytes | None:
        header = self._read_exactly(4)
        if header is None:
            return None
        total_size = struct.unpack(">I", header)[0]
        assert total_size <= FRAME_BYTES_MAX
        return self._read_exactly(total_size)

    def _read_exactly(self, size: int) -> bytes | None:
        chunks = b""
        while len(chunks) < size:
            chunk = self.request.recv(size - len(chunks))
            if not chunk:
                return None
            chunks += chunk
        return chunks

    def _write(self, **fields: object) -> None:
        command = pb.BaseCommand(**fields)  # type: ignore[arg-type]
        body = command.SerializeToString()
        self.request.sendall(struct.pack(">II", len(body) + 4, len(body)) + body)

    def _answer(self, command: pb.BaseCommand, payload: bytes) -> None:
        kind = pb.BaseCommand
        if command.type == kind.CONNECT:
            connected = pb.CommandConnected(server_version="compactd-test", protocol_version=20)
            self._write(type=kind.CONNECTED, connected=connected)
        elif command.type == kind.PARTITIONED_METADATA:
            request_id = command.partitionMetadata.request_id
            response = pb.CommandPartitionedTopicMetadataResponse(
                request_id=request_id, partitions=0, response="Success"
            )
            self._write(type=kind.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=response)
        elif command.type == kind.LOOKUP:
            lookup = pb.CommandLookupTopicResponse(
                request_id=command.lookupTopic.request_id,
                response="Connect",
                brokerServiceUrl=self.server.url,
                authoritative=True,
            )
            self._write(type=kind.LOOKUP_RESPONSE, lookupTopicResponse=lookup)
        elif command.type == kind.PRODUCER:
            created = pb.CommandProducerSuccess(
                request_id=command.producer.request_id, producer_name="capture-producer"
            )
            self._write(type=kind.PRODUCER_SUCCESS, producer_success=created)
        elif command.type == kind.SEND:
            self._receive(command.send, payload)
        elif command.type == kind.CLOSE_PRODUCER:
            success = pb.CommandSuccess(request_id=command.close_producer.request_id)
            self._write(type=kind.SUCCESS, success=success)
        elif command.type == kind.PING:
            self._write(type=kind.PONG, pong=pb.CommandPong())

    def _receive(self, send: pb.CommandSend, payload: bytes) -> None:
        with self.server.lock:
            self.server.sent.append(payload)
        receipt = pb.CommandSendReceipt(
            producer_id=send.producer_id,
            sequence_id=send.sequence_id,
            highest_sequence_id=send.highest_sequence_id,
            message_id=pb.MessageIdData(ledgerId=1, entryId=self.entry_id),
        )
        self.entry_id += 1
        self._write(type=pb.BaseCommand.SEND_RECEIPT, send_receipt=receipt)


@pytest.fixture
def broker() -> Iterator[_CaptureBroker]:
    server = _CaptureBroker()
    thread = threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL_S,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(CLIENT_TIMEOUT_S)


def _produce(broker: _CaptureBroker, compression: object, *, batching: bool) -> list[bytes]:
    client = pulsar.Client(
        broker.url,
        operation_timeout_seconds=CLIENT_TIMEOUT_S,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        producer = client.create_producer(
            TOPIC,
            compression_type=compression,
            batching_enabled=batching,
            batching_max_messages=4,
            batching_max_publish_delay_ms=60_000,
        )
        sends: list[dict[str, Any]] = [
            {"content": b"value-a1" * 20, "partition_key": "a", "properties": {"p": "1"}},
            {"content": b"value-b1", "partition_key": "b", "event_timestamp": 1234},
            {"content": b"", "partition_key": "a"},
            {"content": b"keyless"},
        ]
        if batching:
            for fields in sends:
                producer.send_async(callback=lambda result, message_id: None, **fields)
            producer.flush()
        else:
            for fields in sends:
                producer.send(**fields)
        producer.close()
    finally:
        client.close()
    with broker.lock:
        return list(broker.sent)


CODECS = [
    ("NONE", pb.NONE),
    ("LZ4", pb.LZ4),
    ("ZLib", pb.ZLIB),
    ("ZSTD", pb.ZSTD),
    ("SNAPPY", pb.SNAPPY),
]


def _check_messages(found: list[Message]) -> None:
    assert [m.key for m in found] == ["a", "b", "a", None]
    assert found[0].payload == b"value-a1" * 20
    assert found[0].properties == {"p": "1"}
    assert found[1].event_time == 1234
    assert [m.is_tombstone for m in found] == [False, False, True, False]
    assert found[3].payload == b"keyless"


@pytest.mark.parametrize(("client_codec", "codec"), CODECS)
def test_non_batched_entries(broker: _CaptureBroker, client_codec: str, codec: int) -> None:
    sent = _produce(broker, getattr(pulsar.CompressionType, client_codec), batching=False)
    assert len(sent) == 4
    found = []
    for data in sent:
        assert data[:2] == b"\x0e\x01"  # the client checksums every SEND
        with_checksum, stored = parse_entry(data), parse_entry(data[6:])
        assert with_checksum.has_checksum and not stored.has_checksum
        assert with_checksum.metadata == stored.metadata
        assert not is_batch(stored.metadata)
        assert stored.metadata.producer_name == "capture-producer"
        [message] = iter_messages(stored)
        assert message.batch_index == -1
        found.append(message)
    _check_messages(found)
    assert {parse_entry(data).metadata.compression for data in sent} == {codec}


@pytest.mark.parametrize(("client_codec", "codec"), CODECS)
def test_batched_entry(broker: _CaptureBroker, client_codec: str, codec: int) -> None:
    sent = _produce(broker, getattr(pulsar.CompressionType, client_codec), batching=True)
    assert len(sent) == 1
    entry = parse_entry(sent[0])
    assert entry.has_checksum
    assert is_batch(entry.metadata)
    assert entry.metadata.num_messages_in_batch == 4
    assert entry.metadata.compression == codec
    found = list(iter_messages(entry))
    assert [m.batch_index for m in found] == [0, 1, 2, 3]
    _check_messages(found)


def test_null_value_tombstone(broker: _CaptureBroker) -> None:
    client = pulsar.Client(
        broker.url,
        operation_timeout_seconds=CLIENT_TIMEOUT_S,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        producer = client.create_producer(TOPIC)
        producer.send(None, partition_key="gone")
        producer.close()
    finally:
        client.close()
    [message] = iter_messages(parse_entry(broker.sent[0]))
    assert message.key == "gone"
    assert message.null_value
    assert message.is_tombstone

