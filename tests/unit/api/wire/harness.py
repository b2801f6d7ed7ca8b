"""``ServerConnection`` driven directly, over a real broker (``PulsarBroker``, not started) on a tmp data dir.

No sockets: a ``FakeTransport`` stands where asyncio's socket transport would, so a test
can feed a connection thousands of frames a second and read what it answered. Everything
behind the connection is real (topics, ledgers on files, SQLite). Use inside a running
event loop (``asyncio.run``); ``settle`` lets the appends' completions come back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api.config import Settings
from api.wire.connection import ServerConnection
from api.wire.frames import Frame, FrameDecoder, encode_command, make_command
from api.wire.listener import PulsarBroker
from api.wire.validate import frame_problem
from ledger.data_dir import DataDir
from ledger.storage.base import SyncPolicy
from message.proto import pulsar_api_pb2 as pb

T = pb.BaseCommand


class FakeTransport(asyncio.Transport):
    """What a ``ServerConnection`` writes, decoded; closing calls ``connection_lost``."""

    def __init__(self, protocol: ServerConnection, *, decode: bool = True) -> None:
        super().__init__()
        self.protocol = protocol
        self.decoder = FrameDecoder(max_frame_bytes=64 * 1024 * 1024) if decode else None
        self.frames: list[Frame] = []
        self.written = 0
        self.closing = False
        self.lost = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closing, "write after close"
        self.written += len(data)
        if self.decoder is not None:
            self.frames.extend(self.decoder.feed(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self._lose)

    def abort(self) -> None:
        self.close()

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 6650) if name in ("sockname", "peername") else default

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


class Wire:
    """One connection to the broker; ``request`` sends a command and returns the answers."""

    def __init__(self, broker: PulsarBroker, *, connect: bool = True, decode: bool = True) -> None:
        self.protocol = ServerConnection(broker, broker.connections)
        self.transport = FakeTransport(self.protocol, decode=decode)
        self.protocol.connection_made(self.transport)
        if connect:
            answer = self.request(make_command(pb.CommandConnect(client_version="harness", protocol_version=20)))
            assert [frame.type for frame in answer] == [T.CONNECTED], answer

    def feed(self, data: bytes) -> None:
        if not self.transport.closing:
            self.protocol.data_received(data)

    def request(self, command: pb.BaseCommand) -> list[Frame]:
        """The frames written in answer to ``command`` (synchronous answers only). The topic
        of a PRODUCER or SUBSCRIBE is loaded first (``_load_first``)."""
        self._load_first(command)
        return self.request_bytes(encode_command(command))

    def _load_first(self, command: pb.BaseCommand) -> None:
        """Load the topic a PRODUCER or SUBSCRIBE names, when the connection's role may use
        it, as a topic clients already use: their answers then stay synchronous. (A first
        use waits for the load off the event loop, ``api.wire.preparing``: see
        ``test_a_first_producer_or_subscribe_is_answered_after_the_load_off_the_loop``.)"""
        request = (command.producer if command.type == T.PRODUCER else
                   command.subscribe if command.type == T.SUBSCRIBE else None)
        if request is None or not self.protocol.connected:
            return
        if frame_problem(FrameDecoder().feed(encode_command(command))[0]) is not None:
            return  # refused before its handler runs
        broker = self.protocol.broker
        try:
            action = "produce" if command.type == T.PRODUCER else "consume"
            broker.access.check_topic(self.protocol.role, request.topic, action)
            broker.get_topic(request.topic)
        except Exception:  # noqa: BLE001, S110 - the command meets the refusal itself
            pass

    def request_bytes(self, data: bytes) -> list[Frame]:
        before = len(self.transport.frames)
        self.feed(data)
        return [frame for frame in self.transport.frames[before:] if frame.type != T.PING]

    async def request_durable(self, command: pb.BaseCommand, answers: int = 1,
                              timeout_s: float = 10.0) -> list[Frame]:
        """``request`` of a command answered once a cursor change is durable (SUBSCRIBE,
        SEEK, UNSUBSCRIBE: the cursor store's thread writes it): waits, bounded, for
        ``answers`` frames."""
        before = len(self.transport.frames)
        self.feed(encode_command(command))
        await settle(lambda: len(self.answers(before)) >= answers, timeout_s)
        return self.answers(before)

    def answers(self, since: int = 0) -> list[Frame]:
        return [frame for frame in self.transport.frames[since:] if frame.type != T.PING]

    @property
    def closed(self) -> bool:
        return self.transport.closing

    def close(self) -> None:
        self.transport.close()


@contextmanager
def broker_service(path: Path, settings: Settings | None = None, *,
                   sync: SyncPolicy = SyncPolicy.GROUP) -> Iterator[PulsarBroker]:
    """A real broker service over a data dir at ``path`` (no listener unless the test
    starts one); call in a loop."""
    data_dir = DataDir.open(str(path), sync=sync)
    service = PulsarBroker(data_dir, settings or Settings())
    service.loop = asyncio.get_running_loop()
    try:
        yield service
    finally:
        if service._server is not None:
            service._server.close()
        for connection in list(service.connections):
            connection.close()
        if service.key_indexes is not None:  # its worker process, if a seal started one
            service.key_indexes.close()
        for topic in service.registry.loaded_topics():  # the service is dropped: no registry change
            topic.close()
        service.cursors.close()  # writes what the topics' close queued
        service.compactor.close()
        data_dir.close()


async def settle(predicate: Any = None, timeout_s: float = 10.0) -> None:
    """Let callbacks from the ledger threads run: until ``predicate()`` holds (bounded),
    or one short pass when there is none."""
    deadline = time.monotonic() + timeout_s
    while True:
        await asyncio.sleep(0.001)
        if predicate is None or predicate():
            return
        assert time.monotonic() < deadline, "condition not reached in time"
