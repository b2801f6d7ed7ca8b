"""Resource limits of a real ``compactd serve``: what hostile or greedy clients can make it
hold, and how it behaves when it runs out of file descriptors.

Each test measures the process itself (``VmRSS`` from ``/proc``) with a generous bound
that the unbounded code broke by a wide margin:

* one consumer granting 2**32 - 1 permits on a 100 MB backlog and never reading: before,
  the whole backlog was read in one go into its write buffer (the REST API stalled for
  seconds meanwhile); now dispatch goes in bounded rounds and stops at the transport's
  high-water mark;
* 40 connections each sending most of a 5 MiB frame and stalling: before, 200 MB held
  (and kept after they closed); now at most the partial-frames budget, given back;
* a 300 MiB REST body: refused (413) before it is read, with or without Content-Length;
* a descriptor limit reached by idle connections: each listener logs one warning (no
  traceback flood, no spin) and accepts again once descriptors free.
"""

from __future__ import annotations

import resource
import socket
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from api.wire.frames import FRAME_BYTES_MAX, FrameDecoder, encode_command, make_command
from message.proto import pulsar_api_pb2 as pb
from tests.serve_process import ServeProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = pb.BaseCommand
MIB = 1024 * 1024
ANSWER_S = 2.0  # a ping or a REST call must be answered within this while others misbehave
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


class _Raw:
    """A hand-written Pulsar connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder()
        self.pending: list[Any] = []
        self.sock.sendall(encode_command(make_command(pb.CommandConnect(client_version="limits", protocol_version=20))))
        assert self.next().type == T.CONNECTED

    def next(self) -> Any:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            assert data, "the broker closed the connection"
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def ping_s(self) -> float:
        started = time.monotonic()
        self.sock.sendall(encode_command(make_command(pb.CommandPing())))
        self.sock.settimeout(ANSWER_S * 5)
        while self.next().type != T.PONG:
            pass
        return time.monotonic() - started

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServeProcess]:
    flags = getattr(request, "param", ())
    process = ServeProcess(tmp_path / "data", tmp_path / "serve.log", *flags)
    yield process
    process.terminate()


def _rest_s(serve: ServeProcess, path: str) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(serve.http_url + path, timeout=ANSWER_S * 5) as response:
        assert response.status == 200
        response.read()
    return time.monotonic() - started


def test_a_consumer_granting_all_permits_on_a_big_backlog_stalls_no_one_and_holds_bounded_memory(
    serve: ServeProcess,
) -> None:
    topic = f"persistent://public/default/greedy-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=30, logger=QUIET)
    try:
        producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=200,
                                          block_if_queue_full=True)
        value = b"v" * (100 * 1024)
        results: list[Any] = []
        for _ in range(1000):  # 100 MB of backlog
            producer.send_async(value, lambda result, _id: results.append(result))
        producer.flush()
        assert results.count(pulsar.Result.Ok) == 1000
    finally:
        client.close()
    pid = serve.process.pid
    before = _rss_mib(pid)
    greedy, other = _Raw(_port(serve.broker_url)), _Raw(_port(serve.broker_url))
    try:
        greedy.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        greedy.sock.sendall(encode_command(make_command(pb.CommandSubscribe(
            topic=topic, subscription="greedy", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
            request_id=1, initialPosition=pb.CommandSubscribe.Earliest))))
        assert greedy.next().type == T.SUCCESS
        greedy.sock.sendall(encode_command(make_command(pb.CommandFlow(consumer_id=1, messagePermits=2**32 - 1))))
        # the greedy consumer never reads again; everyone else is served meanwhile
        for _ in range(10):
            assert other.ping_s() < ANSWER_S
            assert _rest_s(serve, f"/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[1]}/stats") < ANSWER_S
            time.sleep(0.1)
        grown = _rss_mib(pid) - before
        assert grown < 40, f"the broker grew by {grown:.0f} MiB for one greedy consumer"
        # once it reads, it gets the whole backlog: dispatch resumes as its buffer drains
        greedy.sock.settimeout(30)
        delivered = 0
        while delivered < 1000:
            frame = greedy.next()
            if frame.type == T.MESSAGE:
                delivered += 1
            elif frame.type == T.PING:
                greedy.sock.sendall(encode_command(make_command(pb.CommandPong())))
        assert delivered == 1000
    finally:
        greedy.close()
        other.close()


def _stall_partial_frame(port: int, size: int, sent: list[int]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(encode_command(make_command(pb.CommandConnect(client_version="partial", protocol_version=20))))
    total = FRAME_BYTES_MAX - 4
    try:
        sock.sendall(struct.pack(">II", total, 10) + b"\x00" * size)
        sent.append(size)
    except OSError:  # the broker closed it: over the budget
        pass
    return sock


@pytest.mark.parametrize("serve", [("--wire-partial-frames-budget-bytes", str(32 * MIB))], indirect=True)
def test_partial_frames_grow_the_broker_by_at_most_their_budget_and_are_freed_on_close(serve: ServeProcess) -> None:
    pid, port = serve.process.pid, _port(serve.broker_url)
    before = _rss_mib(pid)
    sent: list[int] = []
    sockets = [_stall_partial_frame(port, FRAME_BYTES_MAX - 200, sent) for _ in range(40)]
    try:
        time.sleep(0.5)  # nothing to poll for: the last bytes are in flight or refused
        grown = _rss_mib(pid) - before
        assert grown < 32 + 40, f"partial frames grew the broker by {grown:.0f} MiB"
        assert len(sent) < 40  # some connections went over the budget and were closed
        probe = _Raw(port)
        assert probe.ping_s() < ANSWER_S
        probe.close()
    finally:
        for sock in sockets:
            sock.close()
    _until(lambda: _rss_mib(pid) - before < 20, 10, "partial frames kept after their connections closed")


def _http_request_headers(serve: ServeProcess, extra: str) -> bytes:
    path = "/admin/v2/persistent/public/default/big-body/compactionThreshold"
    host = f"127.0.0.1:{_port(serve.http_url)}"  # a Host the admin API answers for (issue 15's allow-list)
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}\r\n").encode()


def _status_of(sock: socket.socket) -> int:
    answer = b""
    while b"\r\n" not in answer:
        data = sock.recv(65536)
        assert data, "closed without an answer"
        answer += data
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_300_mib_rest_body_is_refused_before_it_grows_the_broker(serve: ServeProcess, framing: str) -> None:
    pid = serve.process.pid
    before = _rss_mib(pid)
    size = 300 * MIB
    sock = socket.create_connection(("127.0.0.1", _port(serve.http_url)), timeout=10)
    status: list[int] = []
    reader = threading.Thread(target=lambda: status.append(_status_of(sock)), daemon=True)
    try:
        if framing == "content-length":
            sock.sendall(_http_request_headers(serve, f"Content-Length: {size}\r\n"))
        else:
            sock.sendall(_http_request_headers(serve, "Transfer-Encoding: chunked\r\n"))
        reader.start()
        chunk = b"1" * MIB
        if framing == "chunked":
            chunk = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        peak = before
        try:
            for _ in range(size // MIB):
                sock.sendall(chunk)
                peak = max(peak, _rss_mib(pid))
                if status:
                    break
        except OSError:
            pass  # the broker answered and closed
        reader.join(10)
        assert status == [413]
        assert peak - before < 50, f"a refused body grew the broker by {peak - before:.0f} MiB"
    finally:
        sock.close()
    assert _rest_s(serve, "/admin/v2/brokers/health") < ANSWER_S


def test_running_out_of_descriptors_backs_off_logs_once_and_recovers(serve: ServeProcess) -> None:
    pid = serve.process.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    open_now = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_now + 20, hard))
    started_cpu = _cpu_s(pid)
    idle: list[socket.socket] = []
    try:
        for port in (_port(serve.http_url), _port(serve.broker_url)):
            idle += [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
        time.sleep(3)  # the listeners retry once a second meanwhile
        cpu = _cpu_s(pid) - started_cpu
        assert cpu < 1.0, f"the broker spun: {cpu:.1f} s of CPU in 3 s while out of descriptors"
    finally:
        # The limit goes back first: closing the idle connections while it is still low
        # lets a listener accept one of them and run out again, a second episode it
        # rightly logs.
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        for sock in idle:
            sock.close()
    _until(lambda: _health_ok(serve), 10, "the admin listener did not recover")
    probe = _Raw(_port(serve.broker_url))
    assert probe.ping_s() < ANSWER_S
    probe.close()
    log = serve.log_path.read_text()
    assert "Traceback" not in log
    assert log.count("cannot accept connections") <= 2, log[-3000:]  # one per listener
    assert log.count("accepts connections again") >= 1


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def _health_ok(serve: ServeProcess) -> bool:
    try:
        return _rest_s(serve, "/admin/v2/brokers/health") < ANSWER_S
    except OSError:
        return False
