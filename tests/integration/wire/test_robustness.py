"""Robustness of the Pulsar listener: bad clients lose their own connection, nobody else's.

What each part shows, with the real pulsar-client (3.13.0) as the well-behaved neighbour:

* **Bad input closes only that connection.** Garbage bytes, a truncated frame whose socket
  then closes, an oversized length prefix, a command before CONNECT and an unknown command
  type each make the broker close the raw socket that sent them (EOF within
  ``CLOSE_TIMEOUT_S``; the broker forgets the connection), while a real client keeps
  producing and consuming before, during and after (a background thread never stops, and
  a fresh producer/consumer round trip runs at each step).
* **A vanished client frees what it held.** A subprocess running the real client is
  SIGKILLed while it holds unacknowledged messages: an Exclusive subscription takes a new
  consumer (no ConsumerBusy) that gets them all again; on a Shared subscription they go to
  the remaining consumer. A raw consumer that resets its socket mid-frame frees the same.
* **Per-request failures answer, and keep the connection.** A SEND with a wrong checksum,
  or one whose entry a real client could not decode, gets SEND_ERROR ChecksumError and
  stores nothing (a real reader reads on); unsupported requests carrying a
  request_id (CONSUMER_STATS, NEW_TXN) get ERROR with
  that id; PING gets PONG, and the broker's own keep-alive closes only silent connections.
* **A killed ``compactd serve`` loses no acknowledged message.** The real process is
  SIGKILLed while async sends (batched and not) are in flight, restarted on the same data
  dir (it comes up: no lock left behind), and every send that was acknowledged is read
  back with the message id its receipt gave.

Every wait is bounded.
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from api.wire import connection as wire_connection
from api.wire.frames import (
    FRAME_BYTES_MAX,
    Frame,
    FrameDecoder,
    encode_command,
    encode_payload_command,
    make_command,
)
from message.proto import pulsar_api_pb2 as pb
from tests.integration.wire.helpers import RECEIVE_MS
from tests.integration.wire.helpers import drain as _drain
from tests.integration.wire.helpers import unique_topic as _topic
from tests.serve_process import ServeProcess, readline

pytestmark = pytest.mark.integration

T = pb.BaseCommand
CLOSE_TIMEOUT_S = 5.0  # a bad connection must be closed within this
PROCESS_TIMEOUT_S = 30.0  # a subprocess reaching its next step
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)



def _frame(command_bytes: bytes) -> bytes:
    """A simple frame around arbitrary BaseCommand bytes (valid or not)."""
    return struct.pack(">II", 4 + len(command_bytes), len(command_bytes)) + command_bytes


def _entry(producer_name: str, sequence_id: int, payload: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name=producer_name, sequence_id=sequence_id,
                                  publish_time=int(time.time() * 1000)).SerializeToString()
    return struct.pack(">I", len(metadata)) + metadata + payload



def _read_all(client: Any, topic: str) -> list[Any]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(RECEIVE_MS))
    reader.close()
    return out


def _round_trip(client: Any) -> None:
    """A new producer and consumer on a new topic: one message goes through."""
    topic = _topic("round-trip")
    consumer = client.subscribe(topic, "rt", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic)
    payload = uuid.uuid4().bytes
    producer.send(payload)
    message = consumer.receive(RECEIVE_MS)
    assert message.data() == payload
    consumer.acknowledge(message)
    producer.close()
    consumer.close()


class _Raw:
    """A hand-written Pulsar connection: frames built with ``api.wire.frames``."""

    def __init__(self, port: int, *, connect: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CLOSE_TIMEOUT_S)
        self.address = self.sock.getsockname()
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []
        self.pings = 0  # broker PINGs answered
        if connect:
            self.send(make_command(pb.CommandConnect(client_version="robustness-test", protocol_version=20)))
            assert self.receive().type == T.CONNECTED

    def send(self, command: pb.BaseCommand) -> None:
        self.sock.sendall(encode_command(command))

    def receive(self, timeout_s: float = CLOSE_TIMEOUT_S) -> Frame:
        """The next frame from the broker that is not a PING (PINGs are answered)."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self.frames:
                frame = self.frames.pop(0)
                if frame.type == T.PING:
                    self.pings += 1
                    self.send(make_command(pb.CommandPong()))
                    continue
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the broker")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            assert data, "the broker closed the connection"
            self.frames.extend(self.decoder.feed(data))

    def request(self, command: pb.BaseCommand) -> pb.BaseCommand:
        self.send(command)
        return self.receive().command

    def wait_closed(self, timeout_s: float = CLOSE_TIMEOUT_S) -> str:
        """Read until the broker closes: "eof" (FIN) or "reset" (RST); fails after timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"the broker kept the connection open for {timeout_s} s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return "reset"
            if not data:
                return "eof"

    def closed_now(self) -> bool:
        """Whether the broker has closed the connection; what it sent is read and dropped
        unanswered (a silent client)."""
        self.sock.settimeout(0)
        try:
            while self.sock.recv(65536):
                pass
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True
        return True

    def close(self) -> None:
        self.sock.close()


class _Traffic:
    """A real client sending and receiving on its own topic, non-stop, in a thread."""

    def __init__(self, client: Any) -> None:
        topic = _topic("traffic")
        self.consumer = client.subscribe(topic, "traffic", initial_position=pulsar.InitialPosition.Earliest)
        self.producer = client.create_producer(topic)
        self.count = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self._thread.start()
        self.progressed()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                payload = str(self.count).encode()
                self.producer.send(payload)
                message = self.consumer.receive(RECEIVE_MS)
                assert message.data() == payload, (message.data(), payload)
                self.consumer.acknowledge(message)
                self.count += 1
                time.sleep(0.005)
        except BaseException as error:  # noqa: BLE001 - reported by stop()/progressed()
            self.errors.append(error)

    def progressed(self, messages: int = 3, timeout_s: float = 5.0) -> None:
        """Wait until ``messages`` more went through; fail on an error or a stall."""
        target = self.count + messages
        deadline = time.monotonic() + timeout_s
        while self.count < target:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"traffic stalled at {self.count}"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(RECEIVE_MS / 1000 + 5)
        assert not self._thread.is_alive()
        assert not self.errors, self.errors
        self.producer.close()
        self.consumer.close()


@pytest.fixture
def traffic(client: Any) -> Iterator[_Traffic]:
    running = _Traffic(client)
    yield running
    running.stop()


def _broker_has_connection(broker: Any, address: tuple[str, int]) -> bool:
    async def check() -> bool:
        return any(c.transport is not None and c.transport.get_extra_info("peername")[:2] == address[:2]
                   for c in broker.service.connections)
    result: bool = broker.call(check())
    return result


def _until(predicate: Any, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# -- bad input: only that connection closes -------------------------------------------------


def _producer_command(topic: str = "persistent://public/default/bad") -> pb.BaseCommand:
    return make_command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))


BAD_INPUTS: dict[str, tuple[bool, bytes]] = {
    # (send CONNECT first, the bad bytes)
    "garbage-http-before-connect": (False, b"GET / HTTP/1.1\r\nHost: compactd\r\n\r\n"),
    "garbage-framed-after-connect": (True, _frame(b"\xff" * 40)),
    "oversized-length-prefix": (True, struct.pack(">II", FRAME_BYTES_MAX, 16) + b"\x00" * 16),
    "max-length-prefix": (True, b"\xff\xff\xff\xff"),
    "command-before-connect": (False, encode_command(_producer_command())),
    "ping-before-connect": (False, encode_command(make_command(pb.CommandPing()))),
    "unknown-command-type": (True, _frame(b"\x08\xe7\x07")),  # type = 999
    "broker-only-command": (True, encode_command(make_command(pb.CommandSuccess(request_id=1)))),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_closes_only_that_connection(broker: Any, client: Any, traffic: _Traffic, case: str) -> None:
    connect_first, bad = BAD_INPUTS[case]
    _round_trip(client)  # before
    raw = _Raw(broker.port, connect=connect_first)
    try:
        if connect_first:  # the bad connection is a live one: it has a producer
            assert raw.request(_producer_command(_topic("bad"))).type == T.PRODUCER_SUCCESS
        _round_trip(client)  # during: the bad connection is open
        traffic.progressed()
        raw.sock.sendall(bad)
        assert raw.wait_closed() == "eof"
        _until(lambda: not _broker_has_connection(broker, raw.address))
    finally:
        raw.close()
    traffic.progressed()
    _round_trip(client)  # after


def test_truncated_frame_then_close_mid_frame(broker: Any, client: Any, traffic: _Traffic) -> None:
    """Half a frame is buffered (the connection stays up, others unaffected); when the
    socket then closes mid-frame, the broker closes its side and forgets the connection."""
    raw = _Raw(broker.port)
    try:
        frame = encode_command(_producer_command(_topic("truncated")))
        raw.sock.sendall(frame[: len(frame) // 2])
        _round_trip(client)
        traffic.progressed()
        assert _broker_has_connection(broker, raw.address)  # waiting for the rest, not failed
        raw.sock.shutdown(socket.SHUT_WR)  # the socket closes mid-frame
        assert raw.wait_closed() == "eof"
        _until(lambda: not _broker_has_connection(broker, raw.address))
    finally:
        raw.close()
    traffic.progressed()
    _round_trip(client)


def test_many_bad_connections_at_once(broker: Any, client: Any, traffic: _Traffic) -> None:
    """Every kind of bad input on its own socket, all open together, then all sent."""
    raws = [(_Raw(broker.port, connect=connect_first), bad) for connect_first, bad in BAD_INPUTS.values()]
    try:
        _round_trip(client)
        for raw, bad in raws:
            raw.sock.sendall(bad)
        for raw, _ in raws:
            assert raw.wait_closed() == "eof"
    finally:
        for raw, _ in raws:
            raw.close()
    traffic.progressed()
    _round_trip(client)


# -- a client that vanishes frees its consumers -----------------------------------------------

_VANISHING_CONSUMER = """
import sys, time, pulsar
url, topic, subscription, sub_type, expected = sys.argv[1:6]
client = pulsar.Client(url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
consumer = client.subscribe(topic, subscription, consumer_type=getattr(pulsar.ConsumerType, sub_type),
                            initial_position=pulsar.InitialPosition.Earliest)
received = [consumer.receive(10_000).data().decode() for _ in range(int(expected))]
print("received", ",".join(received), flush=True)
time.sleep(120)  # holds them, unacknowledged, until killed
"""


def _start_vanishing_consumer(url: str, topic: str, sub_type: str, expected: int) -> tuple[subprocess.Popen[str], set[str]]:
    """A subprocess that subscribes, receives ``expected`` messages without acking, waits."""
    process = subprocess.Popen(
        [sys.executable, "-c", _VANISHING_CONSUMER, url, topic, "sub", sub_type, str(expected)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    line = readline(process, PROCESS_TIMEOUT_S)
    assert line.startswith("received "), line
    return process, set(line.split(" ", 1)[1].strip().split(","))


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(PROCESS_TIMEOUT_S)
    if process.stdout is not None:
        process.stdout.close()


def _consumer_count(broker: Any, topic: str, subscription: str) -> int:
    async def count() -> int:
        loaded = broker.service.registry.loaded.get(topic)
        sub = loaded.subscriptions.get(subscription) if loaded is not None else None
        return len(sub.consumers) if sub is not None else 0
    result: int = broker.call(count())
    return result


def _produce(client: Any, topic: str, count: int, prefix: str = "m") -> list[str]:
    producer = client.create_producer(topic)
    payloads = [f"{prefix}{index}" for index in range(count)]
    for payload in payloads:
        producer.send(payload.encode())
    producer.close()
    return payloads


def test_killed_exclusive_consumer_frees_the_subscription(broker: Any, client: Any) -> None:
    topic = _topic("killed-exclusive")
    payloads = _produce(client, topic, 10)
    process, held = _start_vanishing_consumer(broker.url, topic, "Exclusive", 10)
    try:
        assert held == set(payloads)
        assert _consumer_count(broker, topic, "sub") == 1
        with pytest.raises(pulsar.ConsumerBusy):  # while it lives, the subscription is taken
            client.subscribe(topic, "sub")
    finally:
        _kill(process)
    _until(lambda: _consumer_count(broker, topic, "sub") == 0)
    consumer = client.subscribe(topic, "sub")  # no ConsumerBusy
    messages = _drain(consumer)
    assert [m.data().decode() for m in messages] == payloads  # the unacked ones, in order
    for message in messages:
        consumer.acknowledge(message)
    producer = client.create_producer(topic)
    producer.send(b"after")
    assert consumer.receive(RECEIVE_MS).data() == b"after"


def test_killed_shared_consumer_pending_go_to_the_remaining_consumer(broker: Any, client: Any) -> None:
    topic = _topic("killed-shared")
    payloads = _produce(client, topic, 20)
    process, held = _start_vanishing_consumer(broker.url, topic, "Shared", 20)
    try:
        assert held == set(payloads)  # it holds every message, unacknowledged
        remaining = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        assert _drain(remaining) == []  # nothing for the second consumer while the first lives
    finally:
        _kill(process)
    messages = [remaining.receive(RECEIVE_MS) for _ in payloads]
    assert sorted(m.data().decode() for m in messages) == sorted(payloads)
    for message in messages:
        remaining.acknowledge(message)
    assert _drain(remaining) == []
    assert _consumer_count(broker, topic, "sub") == 1


@pytest.mark.parametrize("sub_type", ["Shared", "Failover"])
def test_killed_sole_consumer_messages_go_to_the_next_consumer(broker: Any, client: Any, sub_type: str) -> None:
    """The only consumer of a Shared (or Failover) subscription is killed holding unacked
    messages; the next consumer to subscribe receives them (the cursor rewinds)."""
    topic = _topic(f"killed-sole-{sub_type.lower()}")
    payloads = _produce(client, topic, 10)
    process, held = _start_vanishing_consumer(broker.url, topic, sub_type, 10)
    try:
        assert held == set(payloads)
    finally:
        _kill(process)
    _until(lambda: _consumer_count(broker, topic, "sub") == 0)
    consumer = client.subscribe(topic, "sub", consumer_type=getattr(pulsar.ConsumerType, sub_type))
    assert sorted(m.data().decode() for m in _drain(consumer)) == sorted(payloads)


def test_raw_consumer_reset_mid_frame_frees_the_subscription(broker: Any, client: Any) -> None:
    """A raw consumer receives MESSAGE frames, starts a frame and resets the socket."""
    topic = _topic("reset-exclusive")
    payloads = _produce(client, topic, 5)
    raw = _Raw(broker.port)
    try:
        answer = raw.request(make_command(pb.CommandSubscribe(
            topic=topic, subscription="sub", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
            request_id=1, initialPosition=pb.CommandSubscribe.Earliest)))
        assert answer.type == T.SUCCESS
        raw.send(make_command(pb.CommandFlow(consumer_id=1, messagePermits=100)))
        delivered = [raw.receive() for _ in payloads]
        assert all(frame.type == T.MESSAGE and frame.entry for frame in delivered)
        ping = encode_command(make_command(pb.CommandPing()))
        raw.sock.sendall(ping[:5])
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    finally:
        raw.close()
    _until(lambda: _consumer_count(broker, topic, "sub") == 0)
    consumer = client.subscribe(topic, "sub")
    assert [m.data().decode() for m in _drain(consumer)] == payloads


# -- per-request failures answer and keep the connection -----------------------------------------


def test_checksum_mismatch_answers_send_error_and_stores_nothing(broker: Any, client: Any) -> None:
    topic = _topic("checksum")
    raw = _Raw(broker.port)
    try:
        success = raw.request(make_command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1)))
        assert success.type == T.PRODUCER_SUCCESS
        name = success.producer_success.producer_name

        send = make_command(pb.CommandSend(producer_id=1, sequence_id=0, num_messages=1))
        frame = bytearray(encode_payload_command(send, _entry(name, 0, b"corrupted")))
        frame[-1] ^= 0x01  # one payload bit flipped after the checksum was computed
        raw.sock.sendall(bytes(frame))
        answer = raw.receive()
        assert answer.type == T.SEND_ERROR
        assert answer.command.send_error.error == pb.ChecksumError
        assert (answer.command.send_error.producer_id, answer.command.send_error.sequence_id) == (1, 0)

        assert raw.request(make_command(pb.CommandPing())).type == T.PONG  # still open
        send = make_command(pb.CommandSend(producer_id=1, sequence_id=1, num_messages=1))
        raw.sock.sendall(encode_payload_command(send, _entry(name, 1, b"good")))
        answer = raw.receive()
        assert answer.type == T.SEND_RECEIPT
        assert answer.command.send_receipt.sequence_id == 1
    finally:
        raw.close()
    assert [m.data() for m in _read_all(client, topic)] == [b"good"]


UNSUPPORTED_REQUESTS: dict[str, pb.BaseCommand] = {
    "CONSUMER_STATS": make_command(pb.CommandConsumerStats(request_id=11, consumer_id=0)),
    "NEW_TXN": make_command(pb.CommandNewTxn(request_id=14)),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED_REQUESTS))
def test_unsupported_request_gets_error_not_silence(broker: Any, name: str) -> None:
    command = UNSUPPORTED_REQUESTS[name]
    raw = _Raw(broker.port)
    try:
        answer = raw.request(command)
        assert answer.type == T.ERROR, T.Type.Name(answer.type)
        expected_id = getattr(command, command.DESCRIPTOR.fields_by_number[command.type].name).request_id
        assert answer.error.request_id == expected_id
        # never a code that makes the real client drop its connection
        assert answer.error.error not in (pb.ServiceNotReady, pb.TooManyRequests)
        assert raw.request(make_command(pb.CommandPing())).type == T.PONG  # connection kept
    finally:
        raw.close()


def test_ping_gets_pong(broker: Any) -> None:
    raw = _Raw(broker.port)
    try:
        for _ in range(3):
            assert raw.request(make_command(pb.CommandPing())).type == T.PONG
    finally:
        raw.close()


def test_broker_keepalive_closes_only_silent_connections(
    broker: Any, client: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a short keep-alive interval the broker PINGs; a connection that answers PONG
    stays, one that stays silent is closed after two intervals; the real client answers."""
    monkeypatch.setattr(wire_connection, "KEEPALIVE_INTERVAL_S", 0.2)
    answering, silent = _Raw(broker.port), _Raw(broker.port)
    try:
        silent_closed_after = None
        start = time.monotonic()
        while time.monotonic() - start < 1.5:  # receive() answers each broker PING with PONG
            with pytest.raises(TimeoutError):
                answering.receive(timeout_s=0.05)
            if silent_closed_after is None and silent.closed_now():
                silent_closed_after = time.monotonic() - start
        assert silent_closed_after is not None and silent_closed_after < 1.0
        assert answering.pings >= 3
        assert answering.request(make_command(pb.CommandPing())).type == T.PONG
        _round_trip(client)
    finally:
        answering.close()
        silent.close()


# -- a killed `compactd serve` loses no acknowledged message --------------------------------------


def test_serve_sigkill_mid_production_loses_no_acknowledged_message(tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    topic = _topic("sigkill")
    serve = ServeProcess(data_dir, log_path)
    acknowledged: dict[bytes, str] = {}  # payload -> message id of its receipt
    failed: list[Any] = []
    lock = threading.Lock()
    state = {"sent": 0, "done": 0}

    def callback(payload: bytes) -> Any:
        def done(result: Any, message_id: Any) -> None:
            with lock:
                state["done"] += 1
                if result == pulsar.Result.Ok:
                    acknowledged[payload] = str(message_id)
                else:
                    failed.append(result)
        return done

    killed = False
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=5, logger=QUIET)
    try:
        consumer = client.subscribe(topic, "e2e", initial_position=pulsar.InitialPosition.Earliest)
        producers = {
            "plain": client.create_producer(topic, send_timeout_millis=3000, max_pending_messages=2000),
            "batched": client.create_producer(topic, send_timeout_millis=3000, max_pending_messages=2000,
                                              batching_enabled=True, batching_max_publish_delay_ms=2),
        }
        consumed = 0
        deadline = time.monotonic() + 60
        index = 0
        while not killed:
            assert time.monotonic() < deadline, (
                f"production made no progress: {state}, {len(acknowledged)} acknowledged, {failed[:3]}")
            window_full = True
            for kind, producer in producers.items():
                if state["sent"] - state["done"] < 1000:
                    window_full = False
                    payload = f"{kind}-{index}".encode()
                    with lock:
                        state["sent"] += 1
                    producer.send_async(payload, callback(payload))
            index += 1
            # the client's I/O thread runs the callbacks under the GIL: a loop that never
            # yields it starves them (and the client's own sends) on a 2-core machine
            time.sleep(0.001 if window_full else 0)
            if consumed < 100 and index % 10 == 0:  # consume with acks while producing
                consumer.acknowledge(consumer.receive(RECEIVE_MS))
                consumed += 1
            with lock:
                if len(acknowledged) >= 3000 and state["sent"] - state["done"] > 50:
                    serve.kill()  # sends in flight
                    killed = True
                    in_flight_at_kill = state["sent"] - state["done"]
        settle = time.monotonic() + 15  # every pending send ends (send timeout 3 s)
        while state["done"] < state["sent"]:
            assert time.monotonic() < settle, "sends still pending after the broker died"
            time.sleep(0.05)
    finally:
        client.close()
        if not killed:
            serve.kill()
    assert in_flight_at_kill > 0 and failed  # some sends really were cut off
    with lock:
        survivors = dict(acknowledged)

    serve = ServeProcess(data_dir, log_path)  # same data dir: comes up, no lock left behind
    try:
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        try:
            messages = _read_all(client, topic)
            stored = {m.data(): str(m.message_id()) for m in messages}
            assert len(stored) == len(messages)  # no duplicates
            lost = [p for p in survivors if p not in stored]
            assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
            assert all(stored[p] == survivors[p] for p in survivors)  # where its receipt said
            # the restarted broker serves the old subscription and new messages
            producer = client.create_producer(topic)
            producer.send(b"after-restart")
            consumer = client.subscribe(topic, "e2e")
            seen = []
            deadline = time.monotonic() + 20
            while b"after-restart" not in seen:
                assert time.monotonic() < deadline
                message = consumer.receive(RECEIVE_MS)
                consumer.acknowledge(message)
                seen.append(message.data())
        finally:
            client.close()
    finally:
        code = serve.terminate()
    assert code == 0, log_path.read_text()


def test_an_undecodable_send_is_refused_and_real_readers_keep_reading(broker: Any, client: Any) -> None:
    """A raw producer sends entries a real client could not decode (a batch claiming more
    slots than it holds, a ZLIB payload that is not zlib): each gets SEND_ERROR and nothing
    is stored, so a real reader of the topic reads just the good message after them."""
    topic = _topic("undecodable")
    raw = _Raw(broker.port)
    try:
        success = raw.request(make_command(pb.CommandProducer(topic=topic, producer_id=1, request_id=1)))
        name = success.producer_success.producer_name
        single = pb.SingleMessageMetadata(payload_size=1).SerializeToString()
        slot = struct.pack(">I", len(single)) + single + b"v"
        bad = [
            pb.MessageMetadata(producer_name=name, sequence_id=0, publish_time=1, num_messages_in_batch=1000),
            pb.MessageMetadata(producer_name=name, sequence_id=1, publish_time=1, compression=pb.ZLIB,
                               uncompressed_size=100),
        ]
        for sequence_id, metadata in enumerate(bad):
            body = metadata.SerializeToString()
            send = make_command(pb.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=1))
            raw.sock.sendall(encode_payload_command(send, struct.pack(">I", len(body)) + body + slot))
            answer = raw.receive()
            assert answer.type == T.SEND_ERROR, answer
            assert answer.command.send_error.sequence_id == sequence_id
        send = make_command(pb.CommandSend(producer_id=1, sequence_id=2, num_messages=1))
        raw.sock.sendall(encode_payload_command(send, _entry(name, 2, b"good")))
        assert raw.receive().type == T.SEND_RECEIPT
    finally:
        raw.close()
    assert [m.data() for m in _read_all(client, topic)] == [b"good"]
