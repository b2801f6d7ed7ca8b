"""Send latency while a large compaction runs in the same broker (``bench.wire --during-compaction``).

Run: ``python -m bench.wire --during-compaction [--compaction-messages 5000000] [--runs 3] [--json]``

Setup (not timed): the big topic (``bench/compaction.py``'s ``TOPIC``) is written once into a
template data dir by ``bench/compaction.py``'s ``setup`` child (``DataDir`` +
``ManagedLedger``, ``SyncPolicy.NONE``; the seeded ``bench/_workload.py`` stream:
``--compaction-messages`` messages over ``--compaction-keys`` keys, ``--value-bytes`` values,
1 % tombstones, batches of ``--compaction-batch-size`` slots, 1 = one entry per message),
then the key indexes of its sealed ledgers (``bench/compaction.py``'s ``index`` child), as the
broker's background builder would have left them.

Each of ``--runs`` runs copies the template afresh (and syncs it) and starts ``compactd serve`` on the copy
(a subprocess, as ``bench.wire``), loads the big topic (a status GET, so that loading it is
not counted as the run), then, with pulsar-client 3.13.0 in this process:

1. **idle**: a producer on another topic makes ``--idle-messages`` synchronous sends of
   100 B (non-batched, after a warm-up); p50/p99 of their latencies;
2. **during compaction**: ``PUT .../compaction`` on the big topic, then the same producer
   sends synchronously until a poller thread (``GET .../compaction`` every
   ``POLL_INTERVAL_S``) sees the run end; p50/p99/max of the sends made while it ran.

The same poller reads the big topic's status at the same interval during the idle sends
too (``RunWatch.poll_idle``): each GET occupies the broker's event loop for a moment, and
polling only while compacting would count that in the compaction's effect.
``--no-idle-poll`` measures the idle sends without it (the figure of earlier versions).

Figures are medians over the runs; ``publish_p99_ratio`` is the median of each run's
during ÷ idle p99 (issue 12's target: ≤ 2). A benchmark, not a test: it asserts nothing
beyond every send and the compaction succeeding.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Any

import pulsar

from bench import _child
from bench.wire import Server, percentile

__all__ = ["add_arguments", "main"]

COMPACTION_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compaction.py")
BIG_TOPIC = "persistent://public/default/bench-compaction"  # bench/compaction.py's TOPIC
WARMUP_SENDS = 50
POLL_INTERVAL_S = 0.1
RUN_TIMEOUT_S = 3600.0
PAYLOAD_BYTES = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This mode's options on ``bench.wire``'s parser."""
    group = parser.add_argument_group("--during-compaction")
    group.add_argument("--compaction-messages", type=int, default=5_000_000,
                       help="messages in the topic compacted during the measurement")
    group.add_argument("--compaction-keys", type=int, default=1_000_000, help="distinct keys in that topic")
    group.add_argument("--compaction-batch-size", type=int, default=100,
                       help="messages per entry in that topic (1: non-batched)")
    group.add_argument("--value-bytes", type=int, default=100, help="value size in that topic")
    group.add_argument("--idle-messages", type=int, default=2000, help="synchronous sends measured while idle")
    group.add_argument("--idle-poll", action=argparse.BooleanOptionalAction, default=True,
                       help="poll the big topic's status during the idle sends too, as during the run")
    try:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
    except argparse.ArgumentError:
        pass  # another mode of bench.wire defined it already


# --- the big topic ----------------------------------------------------------------------------


def write_template(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    """Write the big topic into ``directory`` through bench/compaction.py's setup child, and
    its sealed ledgers' key indexes through its index child (what the broker's background
    builder leaves beside them once the topic has been written through it)."""
    spec = {
        "messages": args.compaction_messages, "keys": args.compaction_keys, "value_bytes": args.value_bytes,
        "tombstones": 0.01, "batch_size": args.compaction_batch_size, "compression": "none", "seed": 1,
        "dir": directory,
    }
    setup = _child.spawn(COMPACTION_SCRIPT, "setup", spec)
    _child.spawn(COMPACTION_SCRIPT, "index", spec)
    return setup


def _admin_path(http_url: str, topic: str) -> str:
    return f"{http_url}/admin/v2/{topic.replace('://', '/', 1)}/compaction"


def _request(url: str, method: str = "GET") -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


class RunWatch:
    """Triggers the big topic's compaction over REST and polls its status on a thread."""

    def __init__(self, http_url: str) -> None:
        self.url = _admin_path(http_url, BIG_TOPIC)
        self.done = threading.Event()
        self.status = ""
        self.last_error = ""
        self.seconds = 0.0
        self._started = 0.0
        self._thread = threading.Thread(target=self._poll, name="compaction-poll", daemon=True)

    def load(self) -> None:
        """Load the big topic in the broker (a status read) before anything is timed."""
        _request(self.url)

    def poll_idle(self, stop: threading.Event) -> threading.Thread:
        """Read the status every ``POLL_INTERVAL_S`` on a thread until ``stop`` is set (the
        idle phase's share of the instrument)."""
        def poll() -> None:
            while not stop.is_set():
                _request(self.url)
                stop.wait(POLL_INTERVAL_S)
        thread = threading.Thread(target=poll, name="idle-poll", daemon=True)
        thread.start()
        return thread

    def start(self) -> None:
        self._started = time.perf_counter()
        _request(self.url, "PUT")
        self._thread.start()

    def _poll(self) -> None:
        while time.perf_counter() - self._started < RUN_TIMEOUT_S:
            answer = _request(self.url)
            if answer["status"] != "RUNNING":
                self.seconds = time.perf_counter() - self._started
                self.status, self.last_error = answer["status"], answer["lastError"]
                break
            time.sleep(POLL_INTERVAL_S)
        self.done.set()


# --- one run ----------------------------------------------------------------------------------


def _send_timed(producer: Any, payload: bytes) -> float:
    started = time.perf_counter()
    producer.send(payload)
    return (time.perf_counter() - started) * 1000


def one_run(args: argparse.Namespace, template: str, root: str) -> dict[str, float]:
    """Idle and during-compaction send latencies on a fresh copy of the template."""
    data = os.path.join(root, "run")
    shutil.copytree(template, data)
    os.sync()  # the copy's writeback lands in neither phase
    server = Server(data, args.fsync)
    try:
        watch = RunWatch(server.http_url)
        watch.load()
        client = pulsar.Client(server.url, operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            producer = client.create_producer(f"persistent://public/default/bench-during-{uuid.uuid4().hex[:8]}",
                                              batching_enabled=False, send_timeout_millis=60_000)
            payload = os.urandom(PAYLOAD_BYTES)
            for _ in range(WARMUP_SENDS):
                producer.send(payload)
            stop_polling = threading.Event()
            poller = watch.poll_idle(stop_polling) if args.idle_poll else None
            idle = [_send_timed(producer, payload) for _ in range(args.idle_messages)]
            stop_polling.set()
            if poller is not None:
                poller.join()
            watch.start()
            during = []
            while not watch.done.is_set():
                during.append(_send_timed(producer, payload))
            producer.close()
        finally:
            client.close()
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    if watch.status != "SUCCESS":
        raise SystemExit(f"the compaction ended {watch.status or 'never'}: {watch.last_error}")
    return {
        "publish_p50_ms_idle": percentile(idle, 0.50), "publish_p99_ms_idle": percentile(idle, 0.99),
        "publish_p50_ms_during_compaction": percentile(during, 0.50),
        "publish_p99_ms_during_compaction": percentile(during, 0.99),
        "publish_max_ms_during_compaction": max(during), "sends_during_compaction": len(during),
        "compaction_s": watch.seconds,
    }


# --- the parent -------------------------------------------------------------------------------


def _median(runs: list[dict[str, float]], name: str) -> float:
    return statistics.median(run[name] for run in runs)


def summary(args: argparse.Namespace, setup: dict[str, Any], runs: list[dict[str, float]]) -> dict[str, Any]:
    """The figures to print: medians over the runs, and each run's."""
    for run in runs:
        run["publish_p99_ratio"] = run["publish_p99_ms_during_compaction"] / run["publish_p99_ms_idle"]
        run["publish_p50_ratio"] = run["publish_p50_ms_during_compaction"] / run["publish_p50_ms_idle"]
    names = list(runs[0])
    figures: dict[str, Any] = {name: _median(runs, name) for name in names}
    figures["compaction_records_per_s"] = args.compaction_messages / figures["compaction_s"]
    figures.update({
        "compaction_messages": args.compaction_messages, "compaction_keys": args.compaction_keys,
        "compaction_batch_size": args.compaction_batch_size, "compaction_entries": setup["entries"],
        "compaction_bytes": setup["bytes"], "idle_messages": args.idle_messages, "idle_poll": args.idle_poll,
        "fsync": args.fsync,
        "cpus": os.cpu_count(), "runs": len(runs), "per_run": runs,
    })
    return figures


def report(figures: dict[str, Any]) -> None:
    """The human-readable table."""
    print(f"\nsynchronous sends of {PAYLOAD_BYTES} B (non-batched) on one topic, idle and while "
          f"{figures['compaction_messages']:,} messages ({figures['compaction_entries']:,} entries, "
          f"{figures['compaction_bytes'] / 2**20:,.0f} MiB) of another topic are compacted; "
          f"median of {figures['runs']} runs")
    print(f"{'':>20} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'sends':>7}")
    print(f"{'idle':>20} {figures['publish_p50_ms_idle']:>8.3f} {figures['publish_p99_ms_idle']:>8.3f} "
          f"{'':>8} {figures['idle_messages']:>7,}")
    print(f"{'during compaction':>20} {figures['publish_p50_ms_during_compaction']:>8.3f} "
          f"{figures['publish_p99_ms_during_compaction']:>8.3f} {figures['publish_max_ms_during_compaction']:>8.1f} "
          f"{figures['sends_during_compaction']:>7,.0f}")
    print(f"{'during / idle':>20} {figures['publish_p50_ratio']:>8.2f} {figures['publish_p99_ratio']:>8.2f}")
    print(f"compaction: {figures['compaction_s']:.1f} s ({figures['compaction_records_per_s']:,.0f} records/s, "
          f"trigger to the status poll that saw it end)")
    for index, run in enumerate(figures["per_run"], 1):
        print(f"  run {index}: idle p99 {run['publish_p99_ms_idle']:.3f} ms, during p99 "
              f"{run['publish_p99_ms_during_compaction']:.3f} ms (ratio {run['publish_p99_ratio']:.1f}), "
              f"max {run['publish_max_ms_during_compaction']:.1f} ms, compaction {run['compaction_s']:.1f} s")


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def main(args: argparse.Namespace) -> None:
    """Write the big topic once, measure ``args.runs`` runs, print the figures."""
    say = (lambda *_: None) if args.json else (lambda text: print(text, flush=True))
    root = tempfile.mkdtemp(prefix="bench-during-", dir=args.dir)
    try:
        template = os.path.join(root, "template")
        started = time.perf_counter()
        setup = write_template(args, template)
        say(f"setup: {setup['entries']:,} entries, {setup['bytes'] / 2**20:,.0f} MiB in "
            f"{time.perf_counter() - started:.1f} s; load average {_load()}")
        runs = []
        for index in range(args.runs):
            runs.append(one_run(args, template, root))
            say(f"  run {index + 1}/{args.runs}: compaction {runs[-1]['compaction_s']:.1f} s; load average {_load()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = summary(args, setup, runs)
    figures["load_average_after"] = _load()
    if args.json:
        print(json.dumps(figures))
    else:
        report(figures)
