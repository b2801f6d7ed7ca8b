"""Individual acknowledgements per second, with the real pulsar-client against ``compactd serve``.

Run: ``.venv/bin/python -m bench.acks [--runs 3] [--messages 20000] [--subscriptions 4] [--client pulsar|raw|both]
[--mode every-ack|scheduled|both] [--json]``

Each run starts, for each mode, a fresh ``compactd serve`` **subprocess** on a fresh data
dir, publishes ``--messages`` non-batched messages of 100 B to one topic that already has
``--subscriptions`` durable Shared subscriptions, then consumes every subscription at once
(one consumer each, on its own client and thread), acknowledging every message
individually. Timed from the first receive until the broker reports (REST stats, polled
every 50 ms) a backlog of 0 on every subscription: the acks the broker applied per second.
The client groups individual acks for 100 ms (up to 1,000 per ACK command) before it
sends them, as pulsar-client 3.13 always does.

``--client raw`` consumes with a minimal protocol client instead (compactd's own frame
codec over a socket) that sends **one ACK command per message**, as a client with ack
grouping off does (the Java client's ``acknowledgmentGroupTime(0)``): then every ack is a
command the broker handles on its own. ``--client both`` measures both clients.

Modes, measured in the same run:

* ``every-ack``: ``--managed-ledger-mark-delete-rate-limit 0``, every ACK is written at
  once by the cursor store's thread (before issue 12's last step: an SQLite commit,
  ``synchronous=FULL``, on the event loop before the next command was read);
* ``scheduled`` (the default, 1.0): acks change the cursor in memory and a background
  thread persists each cursor at most once a second.

Prints, per mode, the median over ``--runs`` runs of the acks/s the broker applied, of
the consumers' own receive+ack rate and of the broker's CPU time (user + system, its
process tree, over the same span) per acknowledged message — dispatching it and applying
its ack: unlike the rates, that cost hardly moves when other jobs share the machine —
and the ratio scheduled ÷ every-ack; ``--json`` prints one JSON object instead. A benchmark, not a test: it asserts nothing beyond every
message arriving.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import tempfile
import threading
import time
from typing import Any

import httpx
import pulsar

from api.wire.frames import FrameDecoder, encode_command, make_command
from bench._peer_brokers import cpu_seconds
from bench.wire import Server
from message.proto import pulsar_api_pb2 as pb

RECEIVE_TIMEOUT_MS = 30_000
DRAIN_TIMEOUT_S = 120.0
POLL_S = 0.05
PAYLOAD = b"x" * 100
MODES = {"every-ack": "0", "scheduled": None}  # the rate-limit flag of each mode (None: the default)
TOPIC = "persistent://public/default/bench-acks"


def _stats(http: httpx.Client) -> list[dict[str, Any]]:
    stats = http.get("/admin/v2/persistent/" + TOPIC.removeprefix("persistent://") + "/stats").json()
    return [sub for name, sub in stats["subscriptions"].items() if name.startswith("sub-")]  # not __compaction


def _backlogs(http: httpx.Client) -> list[int]:
    return [sub["msgBacklog"] for sub in _stats(http)]


def _attached(http: httpx.Client) -> int:
    """Subscriptions with a consumer attached."""
    return sum(1 for sub in _stats(http) if sub["consumers"])


def _consume(url: str, subscription: str, count: int, started: threading.Event, seconds: list[float]) -> None:
    client = pulsar.Client(url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = client.subscribe(TOPIC, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest)
        started.wait()
        begin = time.perf_counter()
        for _ in range(count):
            consumer.acknowledge(consumer.receive(RECEIVE_TIMEOUT_MS))
        seconds.append(time.perf_counter() - begin)
        time.sleep(1.0)  # the last grouped acks leave before the client closes
    finally:
        client.close()


def _consume_raw(url: str, subscription: str, count: int, started: threading.Event, seconds: list[float]) -> None:
    """Receive ``count`` messages over the bare protocol and acknowledge each with its own ACK."""
    host, port = url.removeprefix("pulsar://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        decoder = FrameDecoder(max_frame_bytes=64 * 1024 * 1024)

        def frames() -> list[Any]:
            data = sock.recv(1 << 20)
            if not data:
                raise SystemExit("the broker closed the raw connection")
            return decoder.feed(data)

        def request(body: Any, answer: int) -> None:
            sock.sendall(encode_command(make_command(body)))
            while not any(frame.type == answer for frame in frames()):
                pass

        request(pb.CommandConnect(client_version="bench-acks", protocol_version=20), pb.BaseCommand.CONNECTED)
        request(pb.CommandSubscribe(topic=TOPIC, subscription=subscription, subType=pb.CommandSubscribe.Shared,
                                    consumer_id=1, request_id=1, initialPosition=pb.CommandSubscribe.Earliest),
                pb.BaseCommand.SUCCESS)
        started.wait()
        begin = time.perf_counter()
        sock.sendall(encode_command(make_command(pb.CommandFlow(consumer_id=1, messagePermits=count))))
        received = 0
        while received < count:
            out = []
            for frame in frames():
                if frame.type == pb.BaseCommand.MESSAGE:
                    received += 1
                    ack = pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual)
                    ack.message_id.add().CopyFrom(frame.command.message.message_id)
                    out.append(encode_command(make_command(ack)))
                elif frame.type == pb.BaseCommand.PING:
                    out.append(encode_command(make_command(pb.CommandPong())))
            sock.sendall(b"".join(out))
        seconds.append(time.perf_counter() - begin)


def one_mode(args: argparse.Namespace, rate_limit: str | None, client_kind: str) -> dict[str, float]:
    """Acks/s the broker applied, and the consumers' own rate, for one mode."""
    data_dir = tempfile.mkdtemp(prefix="bench-acks-")
    flags = [] if rate_limit is None else ["--managed-ledger-mark-delete-rate-limit", rate_limit]
    server = Server(data_dir, "group", flags=("--compaction-monitor-interval-seconds", "0", *flags))
    try:
        client = pulsar.Client(server.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        for index in range(args.subscriptions):  # the subscriptions exist before the messages
            client.subscribe(TOPIC, f"sub-{index}", consumer_type=pulsar.ConsumerType.Shared).close()
        producer = client.create_producer(TOPIC, batching_enabled=False, max_pending_messages=5000,
                                          block_if_queue_full=True)
        for _ in range(args.messages):
            producer.send_async(PAYLOAD, None)
        producer.flush()
        client.close()
        started = threading.Event()
        seconds: list[float] = []
        consume = _consume_raw if client_kind == "raw" else _consume
        threads = [threading.Thread(target=consume, args=(server.url, f"sub-{i}", args.messages, started, seconds))
                   for i in range(args.subscriptions)]
        for thread in threads:
            thread.start()
        with httpx.Client(base_url=server.http_url, timeout=30) as http:
            while _attached(http) < args.subscriptions:
                time.sleep(POLL_S)  # every consumer attached, every backlog full
            time.sleep(0.5)
            cpu_before = cpu_seconds(server.process.pid)
            begin = time.perf_counter()
            started.set()
            deadline = begin + DRAIN_TIMEOUT_S
            while any(_backlogs(http)):
                if time.perf_counter() > deadline:
                    raise SystemExit(f"backlogs not drained within {DRAIN_TIMEOUT_S} s: {_backlogs(http)}")
                time.sleep(POLL_S)
            applied_s = time.perf_counter() - begin
            cpu_s = cpu_seconds(server.process.pid) - cpu_before
        for thread in threads:
            thread.join()
        total = args.messages * args.subscriptions
        return {"acks_per_s": total / applied_s, "client_acks_per_s": total / max(seconds),
                "broker_cpu_us_per_ack": cpu_s * 1e6 / total}
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--subscriptions", type=int, default=4)
    parser.add_argument("--client", choices=("pulsar", "raw", "both"), default="both")
    parser.add_argument("--mode", choices=("every-ack", "scheduled", "both"), default="both",
                        help="the modes measured (the ratio needs both)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    kinds = ("pulsar", "raw") if args.client == "both" else (args.client,)
    modes = {mode: flag for mode, flag in MODES.items() if args.mode in ("both", mode)}
    samples: dict[str, list[dict[str, float]]] = {f"{kind}_{mode}": [] for kind in kinds for mode in modes}
    for _ in range(args.runs):
        for kind in kinds:
            for mode, rate_limit in modes.items():
                samples[f"{kind}_{mode}"].append(one_mode(args, rate_limit, kind))
    result: dict[str, Any] = {"messages": args.messages, "subscriptions": args.subscriptions, "runs": args.runs}
    for label, runs in samples.items():
        for figure in ("acks_per_s", "client_acks_per_s", "broker_cpu_us_per_ack"):
            result[f"{label.replace('-', '_')}_{figure}"] = statistics.median(s[figure] for s in runs)
    for kind in kinds if len(modes) == len(MODES) else ():
        result[f"{kind}_scheduled_over_every_ack"] = (result[f"{kind}_scheduled_acks_per_s"]
                                                      / result[f"{kind}_every_ack_acks_per_s"])
    if args.json:
        print(json.dumps(result))
        return
    print(f"individual acks: {args.messages:,} messages x {args.subscriptions} Shared subscriptions, "
          f"median of {args.runs} runs")
    print(f"{'client':<7} {'mode':<10} {'broker acks/s':>14} {'client acks/s':>14} {'broker CPU/ack':>15}")
    for kind in kinds:
        for mode in modes:
            key = f"{kind}_{mode.replace('-', '_')}"
            print(f"{kind:<7} {mode:<10} {result[key + '_acks_per_s']:>14,.0f} "
                  f"{result[key + '_client_acks_per_s']:>14,.0f} {result[key + '_broker_cpu_us_per_ack']:>12.1f} us")
        if f"{kind}_scheduled_over_every_ack" in result:
            print(f"{kind:<7} scheduled / every-ack: {result[f'{kind}_scheduled_over_every_ack']:.2f}x")


if __name__ == "__main__":
    main()
