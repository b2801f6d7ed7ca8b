"""kill -9 in a loop: no acknowledged message is ever lost, and with de-duplication on none
is stored twice.

A real ``compactd serve`` on a fixed port is killed ``KILLS`` times while the real client
publishes: long-lived producers (one client for the whole test, batched and not, that
reconnect after every restart and never time out their sends) and fresh producers (a new
client per restart, broker-assigned names; every other one is killed before its first
receipt, so its client restarts its sequence ids after the reconnect). At the end every
send has completed, and every message whose send succeeded is read back exactly where
its receipt says.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

KILLS = 22
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
TOPIC = "persistent://public/default/kill-loop"
PER_CYCLE = 60  # sends per producer per cycle
SETTLE_S = 90.0  # every pending send completes after the last restart within this


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class _Sends:
    """Every send made and how it ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.receipts: dict[bytes, str] = {}  # payload -> the message id of its receipt
        self.failed: list[Any] = []

    def send(self, producer: Any, payload: bytes) -> None:
        def done(result: Any, message_id: Any) -> None:
            with self.lock:
                if result == pulsar.Result.Ok:
                    self.receipts[payload] = str(message_id)
                else:
                    self.failed.append(result)
        with self.lock:
            self.sent += 1
        producer.send_async(payload, done)

    @property
    def done(self) -> int:
        with self.lock:
            return len(self.receipts) + len(self.failed)

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.done < count:
            assert time.monotonic() < deadline, f"{self.done} of {count} sends ended: {self.failed[:3]}"
            time.sleep(0.01)

    def wait_for_receipts(self, prefixes: list[bytes], timeout_s: float) -> None:
        """Until a send of each prefix has its receipt (its producer is connected)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                missing = [p for p in prefixes if not any(k.startswith(p) for k in self.receipts)]
            if not missing:
                return
            assert time.monotonic() < deadline, f"no receipt for {missing} within {timeout_s} s"
            time.sleep(0.01)


def _read_all(url: str) -> list[Any]:
    client = pulsar.Client(url, operation_timeout_seconds=30, logger=QUIET)
    try:
        reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(10_000))
        return out
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("deduplication", [False, True], ids=["dedup-off", "dedup-on"])
def test_kill_loop_loses_no_acknowledged_message(tmp_path: Path, deduplication: bool) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    flags = ["--broker-port", str(_free_port()), "--compaction-monitor-interval-seconds", "0",
             "--broker-deduplication-enabled" if deduplication else "--no-broker-deduplication-enabled"]
    sends = _Sends()
    clients: list[Any] = []
    long_lived: list[Any] = []
    serve: ServeProcess | None = None
    cut_off = 0  # sends in flight at the kills, summed
    try:
        for cycle in range(KILLS):
            serve = ServeProcess(data_dir, log_path, *flags)
            if not long_lived:
                clients.append(pulsar.Client(serve.broker_url, operation_timeout_seconds=30, logger=QUIET))
                long_lived = [
                    clients[0].create_producer(TOPIC, send_timeout_millis=0, batching_enabled=False),
                    clients[0].create_producer(TOPIC, send_timeout_millis=0, batching_enabled=True,
                                               batching_max_publish_delay_ms=2),
                ]
            fresh_client = pulsar.Client(serve.broker_url, operation_timeout_seconds=30, logger=QUIET)
            clients.append(fresh_client)
            fresh = fresh_client.create_producer(TOPIC, send_timeout_millis=0)
            for i in range(PER_CYCLE):
                for index, producer in enumerate([*long_lived, fresh]):
                    sends.send(producer, b"c%d-p%d-%d" % (cycle, index, i))
                    time.sleep(0)  # the client's I/O thread needs the GIL (2 cores)
            # the long-lived producers reconnected and sent in this cycle; every other cycle
            # kills before the fresh producer got any receipt
            waited = [b"c%d-p0-" % cycle, b"c%d-p1-" % cycle] + ([] if cycle % 2 else [b"c%d-p2-" % cycle])
            sends.wait_for_receipts(waited, timeout_s=60)
            for i in range(PER_CYCLE, 2 * PER_CYCLE):  # a burst still in flight at the kill
                for index, producer in enumerate(long_lived):
                    sends.send(producer, b"c%d-p%d-%d" % (cycle, index, i))
            cut_off += sends.sent - sends.done
            serve.kill()
        serve = ServeProcess(data_dir, log_path, *flags)
        sends.wait_for(sends.sent, timeout_s=SETTLE_S)
        stored = _read_all(serve.broker_url)
        assert serve.terminate() == 0
    finally:
        for client in clients:
            client.close()
        if serve is not None:
            serve.kill()
    assert cut_off > KILLS  # sends really were in flight when the broker died
    assert not sends.failed, f"sends failed: {sends.failed[:5]}"  # no send timeout: all succeed
    by_id = {str(m.message_id()): m.data() for m in stored}
    assert len(by_id) == len(stored)
    misplaced = {p: i for p, i in sends.receipts.items() if by_id.get(i) != p}
    assert not misplaced, f"{len(misplaced)} acknowledged messages not where their receipt says: " \
                          f"{list(misplaced.items())[:5]}"
    copies = Counter(m.data() for m in stored)
    assert set(copies) == set(sends.receipts)  # nothing stored that no send asked for
    if deduplication:
        assert [p for p, n in copies.items() if n > 1] == []
