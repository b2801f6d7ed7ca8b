"""One ACK command per message (a client with ack grouping off): what was persisted survives kill -9.

The hot path builds a deferred cursor's record only when the store writes it (a snapshot
queued per ack, ``CursorStore.save_later_from``), moves the mark-delete position without
asking the managed ledger inside a ledger, and batches the frames a connection writes.
Against a real ``compactd serve`` (default persist schedule: once a second per cursor), a
bare-protocol consumer acknowledges each message with its own ACK, leaving some
unacknowledged; the first half must reach the data dir within the schedule's bound, then
the rest is acknowledged and the broker is killed with SIGKILL at once. The restarted
broker delivers again exactly what the persisted state does not cover: every
unacknowledged message (no loss) and the acks after the last persist (the window), and
nothing acknowledged before it.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from api.wire.frames import Frame, FrameDecoder, encode_command, make_command
from message.proto import pulsar_api_pb2 as pb
from tests.integration.wire.helpers import RECEIVE_MS, drain, unique_topic
from tests.integration.wire.test_ack_persistence import (
    PERSIST_BOUND_S,
    POLL_S,
    QUIET,
    SUB,
    Entry,
    _covered,
    _entry,
    _persisted,
    _unacked,
    _wait_for_backlog,
)
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

MESSAGES = 400
T = pb.BaseCommand


class RawConsumer:
    """A Shared consumer over the bare protocol that acknowledges with one ACK per message."""

    def __init__(self, url: str, topic: str) -> None:
        host, port = url.removeprefix("pulsar://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=RECEIVE_MS / 1000)
        self.decoder = FrameDecoder(max_frame_bytes=64 * 1024 * 1024)
        self.request(pb.CommandConnect(client_version="raw-acks", protocol_version=20), T.CONNECTED)
        self.request(pb.CommandSubscribe(topic=topic, subscription=SUB, subType=pb.CommandSubscribe.Shared,
                                         consumer_id=1, request_id=1), T.SUCCESS)

    def frames(self) -> list[Frame]:
        data = self.sock.recv(1 << 20)
        assert data, "the broker closed the connection"
        return self.decoder.feed(data)

    def request(self, body: object, answer: int) -> None:
        self.sock.sendall(encode_command(make_command(body)))  # type: ignore[arg-type]
        while not any(frame.type == answer for frame in self.frames()):
            pass

    def receive(self, count: int) -> list[tuple[Entry, int, pb.MessageIdData]]:
        """``count`` messages as (entry, index in the payload, message id)."""
        self.sock.sendall(encode_command(make_command(pb.CommandFlow(consumer_id=1, messagePermits=count))))
        received: list[tuple[Entry, int, pb.MessageIdData]] = []
        while len(received) < count:
            for frame in self.frames():
                if frame.type == T.MESSAGE:
                    message_id = frame.command.message.message_id
                    assert frame.entry is not None
                    index = int(frame.entry.rsplit(b"m", 1)[1])  # the payload is b"m<index>"
                    received.append(((message_id.ledgerId, message_id.entryId), index, message_id))
        return received

    def acknowledge_each(self, message_ids: list[pb.MessageIdData]) -> None:
        """One ACK command per message, all sent at once."""
        frames = []
        for message_id in message_ids:
            ack = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual)
            ack.message_id.add().CopyFrom(message_id)
            frames.append(encode_command(make_command(ack)))
        self.sock.sendall(b"".join(frames))

    def close(self) -> None:
        self.sock.close()


@pytest.mark.slow
def test_per_command_acks_persisted_before_a_kill_are_never_redelivered_and_none_unacked_is_lost(
        tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    topic = unique_topic("raw-ack-persistence")
    serve = ServeProcess(data_dir, log_path)
    try:
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared).close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(MESSAGES):
            producer.send_async(b"m%d" % i, None)
        producer.flush()
        client.close()
        raw = RawConsumer(serve.broker_url, topic)
        try:
            received = raw.receive(MESSAGES)
            index_of = {entry: index for entry, index, _ in received}
            unacked = {entry for entry, index in index_of.items() if _unacked(index)}
            first = [(e, m) for e, i, m in received if i < MESSAGES // 2 and not _unacked(i)]
            raw.acknowledge_each([m for _, m in first])
            first_half = {e for e, _ in first}
            deadline = time.monotonic() + PERSIST_BOUND_S
            while not first_half <= _covered(_persisted(data_dir, topic), set(index_of)):
                assert time.monotonic() < deadline, "the first acks were not persisted within the bound"
                time.sleep(POLL_S)
            raw.acknowledge_each([m for _, i, m in received if i >= MESSAGES // 2 and not _unacked(i)])
            _wait_for_backlog(serve, topic, len(unacked))  # applied in memory; then killed at once
        finally:
            serve.kill()
            raw.close()
        persisted = _covered(_persisted(data_dir, topic), set(index_of))
        assert first_half <= persisted
        assert not persisted & unacked, "an unacknowledged message was persisted as acknowledged"

        serve = ServeProcess(data_dir, log_path)
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        try:
            consumer = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
            redelivered = [_entry(m) for m in drain(consumer, silence_ms=1000)]
        finally:
            client.close()
        assert len(redelivered) == len(set(redelivered))
        assert set(redelivered) == set(index_of) - persisted  # the window and the unacked, nothing else
        assert unacked <= set(redelivered)
    finally:
        assert serve.terminate() == 0, log_path.read_text()
