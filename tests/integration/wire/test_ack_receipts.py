"""What an ack receipt (ACK_RESPONSE) promises across kill -9, under each persist setting.

A real ``compactd serve``; a bare-protocol Shared consumer (pulsar-client 3.13's Python API
cannot ask for ack receipts) receives every message, then acknowledges them one ACK each,
each with a ``request_id`` (a receipt asked for), leaving some unacknowledged, and notes
when each ACK_RESPONSE came. The broker is killed with SIGKILL in the middle of the
stream, right after a receipt of the latest acks arrived; what the socket still held is
read to its end. The restarted broker's redeliveries are checked against the receipts:

* ``--managed-ledger-mark-delete-rate-limit 0``: no message whose ACK_RESPONSE was received
  is ever delivered again (the receipt waits for the commit);
* the default (1 a second): every receipted message delivered again had its receipt
  within the documented window before the kill — one persist interval (1 s) plus the
  subscription's cursor writes (``COMMITS_ALLOWANCE_S``) — while the stream ran longer
  than that window, so acks before it are shown to be kept.

Either way every message never acknowledged comes again (at least once).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from api.wire.frames import Frame, FrameDecoder, encode_command, make_command
from message.proto import pulsar_api_pb2 as pb
from tests.integration.wire.helpers import RECEIVE_MS, drain, unique_topic
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
T = pb.BaseCommand
SUB = "receipts"
MESSAGES = 600
ACKED_BEFORE_KILL = 480  # by index: the acks of later messages are never sent
CHUNK = 12  # acks sent together
PACED_CHUNK_S = 0.1  # the default-rate stream: a chunk every 0.1 s (~4 s of acks)
INTERVAL_S = 1.0  # the default persist interval: 1 / managedLedgerDefaultMarkDeleteRateLimit
COMMITS_ALLOWANCE_S = 1.0  # the subscription's cursor writes around the interval (ms when idle)
RECEIPT_WAIT_S = 10.0

Entry = tuple[int, int]


def _unacked(index: int) -> bool:
    return index % 7 == 3


class ReceiptConsumer:
    """A Shared consumer over the bare protocol that asks a receipt for each ACK."""

    def __init__(self, url: str, topic: str) -> None:
        host, port = url.removeprefix("pulsar://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=RECEIVE_MS / 1000)
        self.decoder = FrameDecoder(max_frame_bytes=64 * 1024 * 1024)
        self.receipts: dict[int, float] = {}  # request id -> when its ACK_RESPONSE was read
        self.failed: list[pb.CommandAckResponse] = []  # receipts that carry an error
        self.request(pb.CommandConnect(client_version="ack-receipts", protocol_version=20), T.CONNECTED)
        self.request(pb.CommandSubscribe(topic=topic, subscription=SUB, subType=pb.CommandSubscribe.Shared,
                                         consumer_id=1, request_id=1), T.SUCCESS)

    def _frames(self, data: bytes) -> list[Frame]:
        frames = self.decoder.feed(data)
        now = time.monotonic()
        for frame in frames:
            if frame.type == T.ACK_RESPONSE:
                response = frame.command.ackResponse
                if response.HasField("error"):
                    self.failed.append(response)
                else:
                    self.receipts[response.request_id] = now
        return frames

    def frames(self) -> list[Frame]:
        data = self.sock.recv(1 << 20)
        assert data, "the broker closed the connection"
        return self._frames(data)

    def request(self, body: object, answer: int) -> None:
        self.sock.sendall(encode_command(make_command(body)))  # type: ignore[arg-type]
        while not any(frame.type == answer for frame in self.frames()):
            pass

    def receive(self, count: int) -> dict[int, pb.MessageIdData]:
        """``count`` messages: their message ids by index (the payload is ``b"m<index>"``)."""
        self.sock.sendall(encode_command(make_command(pb.CommandFlow(consumer_id=1, messagePermits=count))))
        received: dict[int, pb.MessageIdData] = {}
        while len(received) < count:
            for frame in self.frames():
                if frame.type == T.MESSAGE:
                    assert frame.entry is not None
                    received[int(frame.entry.rsplit(b"m", 1)[1])] = frame.command.message.message_id
        return received

    def acknowledge(self, acks: dict[int, pb.MessageIdData]) -> None:
        """One ACK per message, its request id the key, all sent at once."""
        frames = []
        for request_id, message_id in acks.items():
            ack = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, request_id=request_id)
            ack.message_id.add().CopyFrom(message_id)
            frames.append(encode_command(make_command(ack)))
        self.sock.sendall(b"".join(frames))

    def read_ready(self) -> None:
        """Read what the socket holds now, without waiting."""
        self.sock.setblocking(False)
        try:
            while data := self.sock.recv(1 << 20):
                self._frames(data)
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(RECEIVE_MS / 1000)

    def wait_for_any(self, request_ids: set[int]) -> None:
        """Until one of ``request_ids`` is receipted."""
        deadline = time.monotonic() + RECEIPT_WAIT_S
        while not request_ids & self.receipts.keys():
            assert time.monotonic() < deadline, "no ack receipt came"
            self.frames()

    def read_to_end(self) -> None:
        """Every frame left on the socket of a killed broker (receipts it sent count)."""
        try:
            while data := self.sock.recv(1 << 20):
                self._frames(data)
        except ConnectionResetError:
            pass

    def close(self) -> None:
        self.sock.close()


def _entry(message_id: pb.MessageIdData) -> Entry:
    return message_id.ledgerId, message_id.entryId


@pytest.mark.slow
@pytest.mark.parametrize("rate_limit", ["0", "default"])
def test_an_ack_receipt_survives_kill_9_as_the_readme_says(tmp_path: Path, rate_limit: str) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    flags = () if rate_limit == "default" else ("--managed-ledger-mark-delete-rate-limit", rate_limit)
    topic = unique_topic("ack-receipts")
    serve = ServeProcess(data_dir, log_path, *flags)
    try:
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared).close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(MESSAGES):
            producer.send_async(b"m%d" % i, None)
        producer.flush()
        client.close()
        consumer = ReceiptConsumer(serve.broker_url, topic)
        try:
            message_ids = consumer.receive(MESSAGES)
            to_ack = [i for i in range(ACKED_BEFORE_KILL) if not _unacked(i)]
            chunks = [to_ack[start:start + CHUNK] for start in range(0, len(to_ack), CHUNK)]
            for chunk in chunks:
                consumer.acknowledge({1000 + i: message_ids[i] for i in chunk})
                if rate_limit == "default":
                    time.sleep(PACED_CHUNK_S)  # pacing the stream, not waiting for a result
                consumer.read_ready()
            consumer.wait_for_any({1000 + i for i in chunks[-1]})
            killed_at = time.monotonic()
            serve.kill()  # mid-stream: the last chunk's acks just applied
            consumer.read_to_end()
        finally:
            consumer.close()
    finally:
        serve.kill()
    assert not consumer.failed, consumer.failed
    receipted = {_entry(message_ids[request_id - 1000]): at for request_id, at in consumer.receipts.items()}
    never_acked = {_entry(message_ids[i]) for i in set(range(MESSAGES)) - set(to_ack)}

    serve = ServeProcess(data_dir, log_path, *flags)
    try:
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        try:
            again = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
            redelivered = {(m.message_id().ledger_id(), m.message_id().entry_id()) for m in drain(again, 1000)}
        finally:
            client.close()
    finally:
        assert serve.terminate() == 0, log_path.read_text()
    assert never_acked <= redelivered, "a message never acknowledged was lost"
    receipted_again = {entry: at for entry, at in receipted.items() if entry in redelivered}
    if rate_limit == "0":
        assert not receipted_again, f"{len(receipted_again)} receipted acks were delivered again"
    else:
        window_s = INTERVAL_S + COMMITS_ALLOWANCE_S
        assert min(receipted.values()) < killed_at - window_s, "the stream must outlast the window"
        outside = {entry: round(killed_at - at, 3) for entry, at in receipted_again.items()
                   if at < killed_at - window_s}
        assert not outside, f"receipted acks delivered again, seconds before the kill: {outside}"
