"""Pulsar-protocol throughput and latency of compactd, measured with the real pulsar-client.

Run: ``.venv/bin/python bench/wire.py [--runs 3] [--messages 50000] [--latency-messages 1000]``

Each run starts a fresh ``compactd serve --broker-port 0 --http-port 0`` **subprocess** on a
fresh data dir (so the client and the broker do not share a GIL; they do share the
machine's cores) and measures, with pulsar-client 3.13.0:

* **produce**: ``--messages`` messages of 100 B and 1 KB, batching off and on (batching
  delay ``--batch-delay-ms``), each on its own topic, with ``send_async`` under a bounded
  pending queue (``--pending``, ``block_if_queue_full``), then ``flush``; timed until the
  last send receipt. msgs/s and MB/s of payload.
* **consume**: a durable subscription from earliest on each of those topics, receiving
  every message and acknowledging each; timed from the subscribe to the last message.
* **send latency**: ``--latency-messages`` synchronous ``producer.send`` calls of 100 B,
  non-batched and batched with a 1 ms batching delay; p50 and p99 after a warm-up.

``--during-compaction`` measures send latency idle and while a large compaction of another
topic runs in the same broker (``bench/_during.py``, its own options and ``--json``).

``--deduplication on`` runs the broker with de-duplication on; ``--deduplication both``
measures the produce figures with it off (the baseline) and on, in the same run, and
prints their ratio (the cost of identifying and fingerprinting each send).

Each figure is the median over ``--runs`` runs. A benchmark, not a test: it asserts
nothing beyond every send succeeding.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pulsar

READY_TIMEOUT_S = 60.0
RECEIVE_TIMEOUT_MS = 30_000
LATENCY_WARMUP = 50
PAYLOAD_SIZES = (100, 1024)


class Server:
    """``compactd serve`` as a subprocess on its own data dir."""

    def __init__(self, data_dir: str, fsync: str, deduplication: bool = False, flags: tuple[str, ...] = ()) -> None:
        executable = os.path.join(os.path.dirname(sys.executable), "compactd")
        dedup = "--broker-deduplication-enabled" if deduplication else "--no-broker-deduplication-enabled"
        self.process = subprocess.Popen(
            [executable, "serve", "--broker-port", "0", "--http-port", "0", "--data-dir", data_dir,
             "--fsync", fsync, dedup, *flags],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.process.stdout
        assert stdout is not None
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            self.process.kill()
            raise SystemExit("compactd serve did not print its ready line") from None
        if not line.startswith("compactd ready broker="):
            self.process.kill()
            raise SystemExit(f"compactd serve failed to start: {line!r}")
        self.url = line.split()[2].removeprefix("broker=")
        self.http_url = line.split()[3].removeprefix("http=")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _topic(label: str) -> str:
    return f"persistent://public/default/bench-{label}-{uuid.uuid4().hex[:8]}"


def produce(client: Any, topic: str, size: int, count: int, batching: bool, args: argparse.Namespace) -> float:
    """Seconds to send ``count`` messages of ``size`` bytes asynchronously, until all are receipted."""
    producer = client.create_producer(
        topic, batching_enabled=batching, batching_max_publish_delay_ms=args.batch_delay_ms,
        max_pending_messages=args.pending, block_if_queue_full=True, send_timeout_millis=60_000,
    )
    payload = os.urandom(size)
    failures: list[Any] = []
    ok = pulsar.Result.Ok

    def done(result: Any, _message_id: Any) -> None:
        if result != ok:
            failures.append(result)

    start = time.perf_counter()
    for _ in range(count):
        producer.send_async(payload, done)
    producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    if failures:
        raise SystemExit(f"{len(failures)} sends failed, e.g. {failures[0]}")
    return elapsed


def consume(client: Any, topic: str, count: int) -> float:
    """Seconds to receive and acknowledge ``count`` messages from earliest."""
    start = time.perf_counter()
    consumer = client.subscribe(topic, "bench", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=1000)
    for _ in range(count):
        consumer.acknowledge(consumer.receive(RECEIVE_TIMEOUT_MS))
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def send_latencies(client: Any, topic: str, count: int, batching: bool) -> list[float]:
    """Milliseconds of each synchronous send of 100 B (after the warm-up)."""
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=1)
    payload = os.urandom(100)
    samples = []
    for index in range(LATENCY_WARMUP + count):
        start = time.perf_counter()
        producer.send(payload)
        if index >= LATENCY_WARMUP:
            samples.append((time.perf_counter() - start) * 1000)
    producer.close()
    return samples


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@contextlib.contextmanager
def broker_client(args: argparse.Namespace, deduplication: bool) -> Iterator[Any]:
    """A client of a fresh ``compactd serve`` on a fresh data dir, both gone afterwards."""
    root = tempfile.mkdtemp(prefix="bench-wire-", dir=args.dir)
    server = Server(os.path.join(root, "data"), args.fsync, deduplication)
    try:
        client = pulsar.Client(server.url, operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            yield client
        finally:
            client.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def produce_only(args: argparse.Namespace, deduplication: bool) -> dict[str, float]:
    """The produce figures of one broker, de-duplication on or off."""
    figures: dict[str, float] = {}
    with broker_client(args, deduplication) as client:
        for size in PAYLOAD_SIZES:
            for batching in (False, True):
                key = f"{size}/{'on' if batching else 'off'}"
                seconds = produce(client, _topic(f"{size}-{int(batching)}"), size, args.messages, batching, args)
                figures[f"produce {key} msgs"] = args.messages / seconds
    return figures


def compare_deduplication(args: argparse.Namespace) -> None:
    """Produce msgs/s with de-duplication off (the baseline) and on, in the same runs."""
    runs: list[tuple[dict[str, float], dict[str, float]]] = []
    for index in range(args.runs):
        runs.append((produce_only(args, False), produce_only(args, True)))
        print(f"  run {index + 1}/{args.runs} done", flush=True)
    print(f"\nproduce with de-duplication off and on: {args.messages:,} msgs, median of {args.runs} runs")
    print(f"{'payload':>8} {'batching':>9} {'off msgs/s':>11} {'on msgs/s':>10} {'on/off':>7}")
    for size in PAYLOAD_SIZES:
        for batching in ("off", "on"):
            name = f"produce {size}/{batching} msgs"
            off = statistics.median(run[0][name] for run in runs)
            on = statistics.median(run[1][name] for run in runs)
            print(f"{size:>7}B {batching:>9} {off:>11,.0f} {on:>10,.0f} {on / off:>7.2f}")


def one_run(args: argparse.Namespace) -> dict[str, float]:
    """Every figure of one run, keyed by name."""
    figures: dict[str, float] = {}
    with broker_client(args, args.deduplication == "on") as client:
        topics = {}
        for size in PAYLOAD_SIZES:
            for batching in (False, True):
                key = f"{size}/{'on' if batching else 'off'}"
                topics[key] = topic = _topic(f"{size}-{int(batching)}")
                seconds = produce(client, topic, size, args.messages, batching, args)
                figures[f"produce {key} msgs"] = args.messages / seconds
                figures[f"produce {key} MB"] = args.messages * size / seconds / 1e6
        for key, topic in topics.items():
            seconds = consume(client, topic, args.messages)
            size = int(key.split("/")[0])
            figures[f"consume {key} msgs"] = args.messages / seconds
            figures[f"consume {key} MB"] = args.messages * size / seconds / 1e6
        for batching in (False, True):
            key = "on" if batching else "off"
            samples = send_latencies(client, _topic(f"latency-{key}"), args.latency_messages, batching)
            figures[f"latency {key} p50"] = percentile(samples, 0.50)
            figures[f"latency {key} p99"] = percentile(samples, 0.99)
    return figures


def _load() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews every figure."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000, help="messages per throughput measurement")
    parser.add_argument("--latency-messages", type=int, default=1000, help="synchronous sends per latency measurement")
    parser.add_argument("--pending", type=int, default=1000, help="the producer's max pending messages")
    parser.add_argument("--batch-delay-ms", type=int, default=10, help="batching delay for the batched producer")
    parser.add_argument("--fsync", default="group", choices=("always", "group", "none"))
    parser.add_argument("--dir", default=None, help="where the data dirs go (default: a temp dir)")
    parser.add_argument("--deduplication", default="off", choices=("off", "on", "both"),
                        help="the broker's de-duplication; both: produce figures off and on, and their ratio")
    parser.add_argument("--during-compaction", action="store_true",
                        help="send latency idle and while another topic is compacted (bench/_during.py)")
    from bench import _during

    _during.add_arguments(parser)
    args = parser.parse_args()
    if args.during_compaction:
        _during.main(args)
        return
    if args.deduplication == "both":
        print(f"load average before: {_load()}", flush=True)
        compare_deduplication(args)
        print(f"load average after: {_load()}")
        return

    print(f"broker: `compactd serve` subprocess (fsync={args.fsync}), client: pulsar-client "
          f"{pulsar.__version__} in this process, {os.cpu_count()} CPUs; median of {args.runs} runs")
    print(f"load average before: {_load()}", flush=True)
    runs = []
    for index in range(args.runs):
        started = time.perf_counter()
        runs.append(one_run(args))
        print(f"  run {index + 1}/{args.runs}: {time.perf_counter() - started:.1f} s", flush=True)
    print(f"load average after: {_load()}")
    median: Callable[[str], float] = lambda name: statistics.median(run[name] for run in runs)

    print(f"\nproduce: {args.messages:,} msgs, send_async (<= {args.pending} pending), flush; "
          f"batching delay {args.batch_delay_ms} ms")
    print(f"{'payload':>8} {'batching':>9} {'msgs/s':>10} {'MB/s':>8}")
    for size in PAYLOAD_SIZES:
        for batching in ("off", "on"):
            key = f"{size}/{batching}"
            print(f"{size:>7}B {batching:>9} {median(f'produce {key} msgs'):>10,.0f} "
                  f"{median(f'produce {key} MB'):>8.2f}")
    print(f"\nconsume: {args.messages:,} msgs from earliest, acknowledge each (topic as produced above)")
    print(f"{'payload':>8} {'batching':>9} {'msgs/s':>10} {'MB/s':>8}")
    for size in PAYLOAD_SIZES:
        for batching in ("off", "on"):
            key = f"{size}/{batching}"
            print(f"{size:>7}B {batching:>9} {median(f'consume {key} msgs'):>10,.0f} "
                  f"{median(f'consume {key} MB'):>8.2f}")
    print(f"\nsend latency: {args.latency_messages:,} synchronous sends of 100 B (after {LATENCY_WARMUP} warm-up)")
    print(f"{'batching':>17} {'p50 ms':>8} {'p99 ms':>8}")
    for batching, label in (("off", "off"), ("on", "on (1 ms delay)")):
        print(f"{label:>17} {median(f'latency {batching} p50'):>8.3f} {median(f'latency {batching} p99'):>8.3f}")


if __name__ == "__main__":
    main()
