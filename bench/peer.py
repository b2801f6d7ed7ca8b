"""compactd against pulsar-lite 0.2.0: the same real-client workload on both, in one run.

Run: ``python -m bench.peer [--runs 3] [--messages 100000] [--latency-messages 1000]
[--pulsar-lite PATH] [--json]``

pulsar-lite is not a dependency of compactd: install it into a virtual environment of its
own, outside the repository (``bench/_peer_brokers.py``'s ``INSTALL_HINT``, printed when
it is not found)::

    python3 -m venv /tmp/pulsar-lite-venv
    /tmp/pulsar-lite-venv/bin/pip install pulsar-lite==0.2.0

and pass ``--pulsar-lite /tmp/pulsar-lite-venv/lib/python3.*/site-packages/pulsar_lite/bin/pulsar-lite``
(found there, on PATH or through ``$PULSAR_LITE_BINARY`` without the flag).

The process first re-executes itself under ``unshare -rn`` (a private network namespace
with only loopback up): pulsar-lite opens a metrics port on all interfaces. Each run
starts, for each broker in turn (the order alternates from run to run), a fresh broker
subprocess on a fresh data dir with its **default** settings (compactd: ``--fsync group``;
pulsar-lite has no fsync setting and does not fsync a send, see ``bench/_peer_brokers.py``) and measures with pulsar-client 3.13.0 in this process:

* **time to ready**: from the spawn to the broker's ready signal;
* **produce_batched**: ``--messages`` messages of ``--payload-bytes`` B, batching on
  (delay ``--batch-delay-ms``), ``send_async`` under ``--pending`` pending, then ``flush``;
  msgs/s until the last receipt;
* **reader**: a reader from earliest on that topic reads every message; msgs/s;
* **consume_ack**: a durable Exclusive subscription from earliest receives every message
  and acknowledges each individually; msgs/s from the subscribe to the last ack;
* **broker CPU per 100 k**: the broker's user + system CPU seconds (its CPU-time clock, ns; its
  whole process tree) over those three phases (the consumer closed, so its last grouped
  acks are in), scaled to 100,000 messages: what taking 100 k messages in, serving them
  once to a reader and once to an acknowledging consumer costs the broker;
* **sync send p50/p99**: ``--latency-messages`` synchronous non-batched sends of 100 B
  (after a warm-up) on a new topic;
* **peak RSS**: VmHWM of the broker process at the end of the run.

Then each broker is started once more, compactd with ``--fsync none`` (pulsar-lite as
before: it has no fsync setting), for the sync send p50/p99 without fsync.

Figures are medians over ``--runs``; each ratio is compactd's median ÷ pulsar-lite's
(issue 12's targets: produce_batched, reader, consume_ack ≥ 0.9; broker CPU per 100 k and
send p50 with fsync none ≤ 2). A benchmark, not a test: it asserts nothing beyond every
send succeeding and every message arriving.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import pulsar

from bench._peer_brokers import (
    INSTALL_HINT,
    Broker,
    cpu_seconds,
    find_pulsar_lite,
    isolate,
    peak_rss_bytes,
)

__all__ = ["main"]

BROKERS = ("compactd", "pulsar-lite")
RECEIVE_TIMEOUT_MS = 30_000
LATENCY_WARMUP = 50
LATENCY_PAYLOAD = b"x" * 100
RATIOS = {  # ratio name -> the figure both sides have
    "produce_batched_ratio": "produce_batched_msgs_per_s",
    "reader_ratio": "reader_msgs_per_s",
    "consume_ack_ratio": "consume_ack_msgs_per_s",
    "broker_cpu_per_100k_ratio": "broker_cpu_s_per_100k",
    "send_p50_fsync_none_ratio": "send_p50_ms_fsync_none",
    "send_p50_default_fsync_ratio": "send_p50_ms_default_fsync",
    "send_p99_default_fsync_ratio": "send_p99_ms_default_fsync",
    "peak_rss_ratio": "peak_rss_bytes",
    "time_to_ready_ratio": "time_to_ready_s",
}


def _topic(label: str) -> str:
    return f"persistent://public/default/bench-peer-{label}-{uuid.uuid4().hex[:8]}"


def _client(url: str) -> Any:
    return pulsar.Client(url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


# --- the phases -------------------------------------------------------------------------------


def produce_batched(client: Any, topic: str, args: argparse.Namespace) -> float:
    """Seconds to send ``args.messages`` batched messages asynchronously until all are receipted."""
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=args.batch_delay_ms,
        max_pending_messages=args.pending, block_if_queue_full=True, send_timeout_millis=60_000,
    )
    payload = os.urandom(args.payload_bytes)
    failures: list[Any] = []

    def done(result: Any, _message_id: Any) -> None:
        if result != pulsar.Result.Ok:
            failures.append(result)

    started = time.perf_counter()
    for _ in range(args.messages):
        producer.send_async(payload, done)
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    if failures:
        raise SystemExit(f"{len(failures)} sends failed, e.g. {failures[0]}")
    return elapsed


def read_all(client: Any, topic: str, count: int) -> float:
    """Seconds for a reader from earliest to read ``count`` messages."""
    started = time.perf_counter()
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1000)
    for _ in range(count):
        reader.read_next(RECEIVE_TIMEOUT_MS)
    elapsed = time.perf_counter() - started
    reader.close()
    return elapsed


def consume_ack(client: Any, topic: str, count: int) -> float:
    """Seconds to receive ``count`` messages from earliest and acknowledge each; the consumer
    is closed afterwards (untimed), which sends its last grouped acks."""
    started = time.perf_counter()
    consumer = client.subscribe(topic, "bench-peer", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=1000)
    for _ in range(count):
        consumer.acknowledge(consumer.receive(RECEIVE_TIMEOUT_MS))
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def send_latencies(client: Any, count: int) -> tuple[float, float]:
    """p50 and p99 (ms) of ``count`` synchronous non-batched sends of 100 B after a warm-up."""
    producer = client.create_producer(_topic("latency"), batching_enabled=False)
    samples = []
    for index in range(LATENCY_WARMUP + count):
        started = time.perf_counter()
        producer.send(LATENCY_PAYLOAD)
        if index >= LATENCY_WARMUP:
            samples.append((time.perf_counter() - started) * 1000)
    producer.close()
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


# --- one broker, one run ----------------------------------------------------------------------


def default_session(kind: str, args: argparse.Namespace, root: str) -> dict[str, float]:
    """Every figure but the fsync-none latency, on a fresh broker with its default settings."""
    data = tempfile.mkdtemp(prefix=f"{kind}-", dir=root)
    broker = Broker(kind, data, fsync=None, pulsar_lite=args.pulsar_lite)
    figures: dict[str, float] = {"time_to_ready_s": broker.ready_s}
    try:
        client = _client(broker.url)
        try:
            topic = _topic("throughput")
            cpu = [cpu_seconds(broker.pid)]
            figures["produce_batched_msgs_per_s"] = args.messages / produce_batched(client, topic, args)
            cpu.append(cpu_seconds(broker.pid))
            figures["reader_msgs_per_s"] = args.messages / read_all(client, topic, args.messages)
            cpu.append(cpu_seconds(broker.pid))
            figures["consume_ack_msgs_per_s"] = args.messages / consume_ack(client, topic, args.messages)
            cpu.append(cpu_seconds(broker.pid))
            p50, p99 = send_latencies(client, args.latency_messages)
        finally:
            client.close()
        figures["peak_rss_bytes"] = peak_rss_bytes(broker.pid)
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    scale = 100_000 / args.messages
    figures.update({
        "broker_cpu_s_per_100k": (cpu[3] - cpu[0]) * scale,
        "broker_cpu_s_per_100k_produce": (cpu[1] - cpu[0]) * scale,
        "broker_cpu_s_per_100k_reader": (cpu[2] - cpu[1]) * scale,
        "broker_cpu_s_per_100k_consume_ack": (cpu[3] - cpu[2]) * scale,
        "send_p50_ms_default_fsync": p50, "send_p99_ms_default_fsync": p99,
    })
    return figures


def fsync_none_session(kind: str, args: argparse.Namespace, root: str) -> dict[str, float]:
    """Sync send p50/p99 on a fresh broker without fsync (compactd ``--fsync none``)."""
    data = tempfile.mkdtemp(prefix=f"{kind}-none-", dir=root)
    broker = Broker(kind, data, fsync="none" if kind == "compactd" else None, pulsar_lite=args.pulsar_lite)
    try:
        client = _client(broker.url)
        try:
            p50, p99 = send_latencies(client, args.latency_messages)
        finally:
            client.close()
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    return {"send_p50_ms_fsync_none": p50, "send_p99_ms_fsync_none": p99}


# --- the parent -------------------------------------------------------------------------------


def summary(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians per broker, the ratios compactd ÷ pulsar-lite, and every run's figures."""
    sides = {kind: {name: statistics.median(run[name] for run in runs[kind]) for name in runs[kind][0]}
             for kind in BROKERS}
    result: dict[str, Any] = {
        name: sides["compactd"][figure] / sides["pulsar-lite"][figure] for name, figure in RATIOS.items()
    }
    result.update({
        "compactd": sides["compactd"], "pulsar_lite": sides["pulsar-lite"],
        "messages": args.messages, "payload_bytes": args.payload_bytes, "latency_messages": args.latency_messages,
        "batch_delay_ms": args.batch_delay_ms, "pending": args.pending, "runs": args.runs,
        "compactd_default_fsync": "group", "pulsar_client": pulsar.__version__, "cpus": os.cpu_count(),
        "load_average_after": [round(value, 2) for value in os.getloadavg()],
        "per_run": {kind.replace("-", "_"): runs[kind] for kind in BROKERS},
    })
    return result


def _shown(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def report(result: dict[str, Any]) -> None:
    """The human-readable table."""
    print(f"\n{result['messages']:,} messages of {result['payload_bytes']} B; median of {result['runs']} runs; "
          f"{result['cpus']} CPUs; pulsar-client {result['pulsar_client']}")
    print(f"{'':>34} {'compactd':>12} {'pulsar-lite':>12} {'ratio':>7}")
    for name, figure in RATIOS.items():
        print(f"{figure:>34} {_shown(result['compactd'][figure]):>12} {_shown(result['pulsar_lite'][figure]):>12} "
              f"{result[name]:>7.2f}")
    for figure in ("send_p99_ms_fsync_none", "broker_cpu_s_per_100k_produce", "broker_cpu_s_per_100k_reader",
                   "broker_cpu_s_per_100k_consume_ack"):
        print(f"{figure:>34} {_shown(result['compactd'][figure]):>12} {_shown(result['pulsar_lite'][figure]):>12}")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per throughput phase")
    parser.add_argument("--payload-bytes", type=int, default=100, help="payload size in the throughput phases")
    parser.add_argument("--latency-messages", type=int, default=1000, help="synchronous sends per latency figure")
    parser.add_argument("--pending", type=int, default=1000, help="the batched producer's max pending messages")
    parser.add_argument("--batch-delay-ms", type=int, default=10, help="the batched producer's batching delay")
    parser.add_argument("--pulsar-lite", default=find_pulsar_lite(), metavar="PATH",
                        help="the pulsar-lite 0.2.0 executable (default: $PULSAR_LITE_BINARY, PATH, "
                             "/tmp/pulsar-lite-venv)")
    parser.add_argument("--dir", default=None, help="where the data dirs go (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.pulsar_lite is None or not os.access(args.pulsar_lite, os.X_OK):
        raise SystemExit(f"pulsar-lite not found ({args.pulsar_lite or 'no --pulsar-lite'}).\n{INSTALL_HINT}")
    return args


def main() -> None:
    """Measure ``--runs`` runs of both brokers, alternating their order, and print the figures."""
    args = _arguments()
    isolate()

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    root = tempfile.mkdtemp(prefix="bench-peer-", dir=args.dir)
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in BROKERS}
    try:
        for index in range(args.runs):
            order = BROKERS if index % 2 == 0 else BROKERS[::-1]
            for kind in order:
                figures = default_session(kind, args, root)
                figures.update(fsync_none_session(kind, args, root))
                runs[kind].append(figures)
                say(f"  run {index + 1}/{args.runs} {kind}: produce {figures['produce_batched_msgs_per_s']:,.0f}/s, "
                    f"reader {figures['reader_msgs_per_s']:,.0f}/s, consume+ack "
                    f"{figures['consume_ack_msgs_per_s']:,.0f}/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = summary(args, runs)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
