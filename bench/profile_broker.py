"""Profiles (py-spy) of the broker's hot paths: produce, consume+ack, per-command acks.

Run: ``.venv/bin/python -m bench.profile_broker [--workloads produce consume-ack raw-acks]
[--messages 100000] [--rate 200] [--top 15] [--out DIR]`` (needs ``py-spy`` in the same
environment: the ``dev`` extra has it).

For each workload it starts a fresh ``compactd serve`` subprocess with its default
settings (``bench._peer_brokers.Broker``, as ``bench.peer`` does), attaches
``py-spy record --pid --format raw --nolineno`` to it while the workload runs in this
process, and prints where the broker's CPU went, per thread (the event loop, the cursor
persist thread, the file store's flusher, ...): the functions with the most samples
*self* (the sampled frame is the function) and *total* (the function is on the stack;
functions on at least 99.5 % of a thread's stacks, its common path, are left out).
py-spy leaves out threads it sees idle. Workloads:

* ``produce``: ``bench.peer``'s produce_batched phase (pulsar-client, batching on, 10 ms
  delay, 1,000 pending), ``--messages`` messages of 100 B;
* ``consume-ack``: ``bench.peer``'s consume_ack phase (an Exclusive subscription from
  earliest, every message acknowledged individually; the client groups acks) over a
  topic first filled, unprofiled, with ``--messages`` batched messages;
* ``raw-acks``: ``bench.acks --client raw``'s workload: ``--messages`` / 5 non-batched
  messages, 4 Shared subscriptions consumed at once by the bare-protocol client that
  sends one ACK command per message.

The raw stacks stay in ``--out`` (default: a temp dir); ``--summarise RAW...`` prints the
summary of stacks recorded before. A benchmark tool: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import pulsar

from bench import acks, peer
from bench._peer_brokers import Broker

COMMON_SHARE = 0.995
WAITING = ("EpollSelector.select", "Condition.wait", "epoll_wait")
"""A stack through one of these is a thread waiting (py-spy may still sample it): it counts
as waiting, not in the shares."""
RAW_ACK_SUBSCRIPTIONS = 4
LOOP_MARKER = "._run_once"


def _thread_of(functions: list[str]) -> str:
    """Which broker thread a stack (outermost first) belongs to."""
    names = [frame.partition(" (")[0] for frame in functions]
    if any(name.endswith(LOOP_MARKER) for name in names):
        return "event loop"
    for index, name in enumerate(names):
        if name == "Thread.run" and index + 1 < len(names):
            return f"thread {names[index + 1]}"
        if name == "_worker" and "thread.py" in functions[index]:
            return "thread pool worker"
    return f"other ({names[-1] if names else '?'})"


def _short(frame: str) -> str:
    """``function (path)`` with the path cut to its last two parts."""
    function, _, path = frame.partition(" (")
    return f"{function} ({'/'.join(path.rstrip(')').split('/')[-2:])})"


def summarise(raw_path: str, top: int) -> dict[str, dict[str, Any]]:
    """Per thread: samples, share of all samples, samples spent waiting, and the top self
    and total functions as shares of the thread's busy (not waiting) samples."""
    samples: collections.Counter[str] = collections.Counter()
    waiting: collections.Counter[str] = collections.Counter()
    self_counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total_counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(raw_path) as raw:
        for line in raw:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_text)
            frames = [frame for frame in stack.split(";") if not frame.startswith(("process ", "thread "))]
            thread = _thread_of(frames)
            samples[thread] += count
            if any(frame.partition(" (")[0] in WAITING for frame in frames):
                waiting[thread] += count
                continue
            if frames:
                self_counts[thread][_short(frames[-1])] += count
            for function in {_short(frame) for frame in frames}:
                total_counts[thread][function] += count
    every = sum(samples.values()) or 1
    result = {}
    for thread, count in samples.most_common():
        busy = max(1, count - waiting[thread])
        result[thread] = {
            "samples": count, "share": count / every, "waiting": waiting[thread],
            "self": [(name, n / busy) for name, n in self_counts[thread].most_common(top)],
            "total": [(name, n / busy) for name, n in total_counts[thread].most_common()
                      if n / busy < COMMON_SHARE][:top],
        }
    return result


def report(title: str, raw: str, top: int) -> None:
    print(f"\n== {title}")
    for thread, figures in summarise(raw, top).items():
        print(f"  -- {thread}: {figures['samples']} samples ({figures['share']:.0%}), "
              f"{figures['waiting']} of them waiting; shares of the busy ones:")
        for kind in ("self", "total"):
            print(f"     {kind}:")
            for name, share in figures[kind]:
                print(f"       {share:6.1%}  {name}")


# --- the workloads ----------------------------------------------------------------------------


def _peer_args(messages: int) -> argparse.Namespace:
    return argparse.Namespace(messages=messages, payload_bytes=100, pending=1000, batch_delay_ms=10)


def _fill(url: str, topic: str, messages: int) -> None:
    client = peer._client(url)
    try:
        peer.produce_batched(client, topic, _peer_args(messages))
    finally:
        client.close()


def produce(url: str, messages: int) -> None:
    _fill(url, peer._topic("profile"), messages)


def consume_ack(url: str, messages: int, record: Any) -> None:
    topic = peer._topic("profile")
    _fill(url, topic, messages)
    with record():
        client = peer._client(url)
        try:
            peer.consume_ack(client, topic, messages)
        finally:
            client.close()


def raw_acks(url: str, messages: int, record: Any) -> None:
    count = messages // 5
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    for index in range(RAW_ACK_SUBSCRIPTIONS):
        client.subscribe(acks.TOPIC, f"sub-{index}", consumer_type=pulsar.ConsumerType.Shared).close()
    producer = client.create_producer(acks.TOPIC, batching_enabled=False, max_pending_messages=5000,
                                      block_if_queue_full=True)
    for _ in range(count):
        producer.send_async(acks.PAYLOAD, None)
    producer.flush()
    client.close()
    with record():
        started = threading.Event()
        started.set()
        seconds: list[float] = []
        threads = [threading.Thread(target=acks._consume_raw, args=(url, f"sub-{i}", count, started, seconds))
                   for i in range(RAW_ACK_SUBSCRIPTIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(0.5)  # the last acks in


class _Recorder:
    """``with recorder():`` runs py-spy against the broker for the block."""

    def __init__(self, pid: int, raw: str, rate: int, native: bool = False, gil: bool = False) -> None:
        self.pid, self.raw, self.rate, self.native, self.gil = pid, raw, rate, native, gil

    def __call__(self) -> _Recorder:
        return self

    def __enter__(self) -> None:
        py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        self.process = subprocess.Popen(
            [py_spy, "record", "--pid", str(self.pid), "--format", "raw", "--nolineno", "--rate", str(self.rate),
             "--output", self.raw, *(["--native"] if self.native else []), *(["--gil"] if self.gil else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attached

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)


def profile(workload: str, messages: int, root: str, rate: int, native: bool = False, gil: bool = False) -> str:
    data = os.path.join(root, f"{workload}-data-{uuid.uuid4().hex[:6]}")
    raw = os.path.join(root, f"{workload}.raw.txt")
    broker = Broker("compactd", data, fsync=None, pulsar_lite="")
    try:
        recorder = _Recorder(broker.pid, raw, rate, native, gil)
        if workload == "produce":
            with recorder():
                produce(broker.url, messages)
        elif workload == "consume-ack":
            consume_ack(broker.url, messages, recorder)
        else:
            raw_acks(broker.url, messages, recorder)
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["produce", "consume-ack", "raw-acks"],
                        choices=["produce", "consume-ack", "raw-acks"])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too (e.g. the GC)")
    parser.add_argument("--gil", action="store_true",
                        help="py-spy --gil: only samples of the thread holding the GIL (py-spy samples wall "
                             "time; a thread waiting for the GIL or blocked in a system call is otherwise "
                             "often counted busy)")
    parser.add_argument("--out", default=None, help="where the raw stacks are kept (default: a temp dir)")
    parser.add_argument("--summarise", nargs="+", metavar="RAW", help="only summarise raw stacks recorded before")
    args = parser.parse_args()
    if args.summarise:
        for raw in args.summarise:
            report(raw, raw, args.top)
        return
    root = args.out or tempfile.mkdtemp(prefix="bench-profile-broker-")
    os.makedirs(root, exist_ok=True)
    for workload in args.workloads:
        raw = profile(workload, args.messages, root, args.rate, args.native, args.gil)
        report(f"{workload}: {args.messages:,} messages ({raw})", raw, args.top)


if __name__ == "__main__":
    main()
