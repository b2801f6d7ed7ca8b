"""Issue 16 (points 1, 2, 4) end to end: a real ``compactd serve``, pulsar-client, the CLI.

* ``test_min_compaction_lag_leaves_young_updates_to_read_compacted_readers`` — the
  ``minCompactionLagMs`` policy set with ``compactd admin``: a run stops before the first
  message published within the lag, so a read-compacted reader still sees every young
  update; the topic policy wins over ``--compaction-min-lag-ms``, the namespace policy too,
  and with a lag of 0 the next run compacts everything.
* ``test_json_logs_carry_lifecycle_roll_over_and_throttled_run_lines`` — with
  ``--log-format json --log-level debug --compaction-max-bytes-per-second``, every stderr
  line is a JSON object: start, ready, stopping, stop, ledger roll-overs (DEBUG) and one
  compaction line with its figures; the run took at least its bytes over the limit and
  reports the time it waited (also in ``/metrics``); expected errors leave no traceback.
* ``test_text_logs_are_readable_and_the_level_filters`` — the default text format has one
  readable line per run and no DEBUG lines; ``--log-level warning`` drops INFO; a bad
  ``--log-format`` is one line on stderr, exit 2.

Every wait is bounded; every process, pipe and client is closed.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from api.cli import app
from tests.integration.wire.helpers import wait_until
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 30.0
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
GAP_MS = 1500  # between the old and the young messages: far more than a trigger takes to start a run


class Serve(ServeProcess):
    """``compactd serve`` (fsync none, no scheduler) with an HTTP client on its port."""

    def __init__(self, data_dir: Path, log_path: Path, *flags: str) -> None:
        super().__init__(data_dir, log_path, "--fsync", "none", "--compaction-monitor-interval-seconds", "0", *flags)
        self.http = httpx.Client(base_url=self.http_url, timeout=30)

    def _close(self) -> None:
        self.http.close()
        super()._close()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    """Start ``compactd serve`` on ``tmp_path/data``, its stderr in ``tmp_path/<log>``."""
    started: list[Serve] = []

    def run(*flags: str, log: str = "serve.log") -> Serve:
        serve = Serve(tmp_path / "data", tmp_path / log, *flags)
        started.append(serve)
        return serve

    yield run
    for serve in started:
        if serve.running:
            assert serve.terminate() == 0
        else:
            serve.kill()


def unique(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


def topic_url(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def client(serve: Serve) -> Any:
    return pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)


def produce(serve: Serve, topic: str, pairs: list[tuple[str, bytes]]) -> None:
    pulsar_client = client(serve)
    try:
        producer = pulsar_client.create_producer(topic, batching_enabled=False)
        for key, value in pairs:
            producer.send(value, partition_key=key)
        producer.close()
    finally:
        pulsar_client.close()


def read(serve: Serve, topic: str, *, compacted: bool) -> list[tuple[str, bytes, int]]:
    """(key, value, publish time) of every message a reader from the earliest gets."""
    pulsar_client = client(serve)
    try:
        reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
        seen = []
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while reader.has_message_available():
            assert time.monotonic() < deadline, "the topic did not end"
            message = reader.read_next(5000)
            seen.append((message.partition_key(), message.data(), message.publish_timestamp()))
        reader.close()
        return seen
    finally:
        pulsar_client.close()


def admin(serve: Serve, *args: str) -> str:
    """``compactd admin`` in process against ``serve``; its stdout (exit 0 asserted)."""
    result = CliRunner().invoke(app, ["admin", "--admin-url", serve.http_url, *args])
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def compact(serve: Serve, topic: str) -> None:
    admin(serve, "topics", "compact", topic)
    admin(serve, "topics", "compaction-status", "-w", topic)  # waits; exit 1 on ERROR


def compacted_ledger(serve: Serve, topic: str) -> int:
    internal = serve.http.get(topic_url(topic) + "/internalStats").json()
    return int(internal["compactedLedger"]["ledgerId"])


# -- point 1: minCompactionLagMs ---------------------------------------------------------------


def test_min_compaction_lag_leaves_young_updates_to_read_compacted_readers(start: Callable[..., Serve]) -> None:
    serve = start("--compaction-min-lag-ms", "3600000")  # the broker default holds back an hour
    topic = unique("lag")
    produce(serve, topic, [("k", b"a1"), ("k", b"a2"), ("j", b"j1")])
    old = read(serve, topic, compacted=False)
    wait_until(lambda: time.time() * 1000 >= old[-1][2] + GAP_MS,
               "the gap between old and young messages", RUN_TIMEOUT_S)
    produce(serve, topic, [("k", b"b1"), ("k", b"b2")])
    everything = read(serve, topic, compacted=False)
    assert everything[3][2] - old[-1][2] >= GAP_MS

    compact(serve, topic)  # the broker default: everything is younger than an hour
    assert read(serve, topic, compacted=True) == everything
    assert compacted_ledger(serve, topic) == -1

    # The topic policy wins: the old messages are exactly the lag old now, the young ones are
    # GAP_MS younger than that, far more than the trigger takes to reach the run.
    lag_ms = int(time.time() * 1000) - old[-1][2]
    admin(serve, "topics", "set-min-compaction-lag", "--lag", str(lag_ms), topic)
    assert json.loads(admin(serve, "topics", "get-min-compaction-lag", topic)) == lag_ms
    compact(serve, topic)
    seen = [(key, value) for key, value, _ in read(serve, topic, compacted=True)]
    assert seen == [("k", b"a2"), ("j", b"j1"), ("k", b"b1"), ("k", b"b2")]  # both young updates of k
    stats = serve.http.get(topic_url(topic) + "/stats").json()
    assert stats["compaction"]["lastCompactionRemovedEventCount"] == 1  # only a1

    # Removed, the broker default applies again: nothing new is compacted.
    admin(serve, "topics", "remove-min-compaction-lag", topic)
    compact(serve, topic)
    assert [(key, value) for key, value, _ in read(serve, topic, compacted=True)] == seen

    # A namespace lag of 0 wins over the broker default: everything is compacted now.
    admin(serve, "namespaces", "set-min-compaction-lag", "--lag", "0", "public/default")
    try:
        compact(serve, topic)
    finally:
        admin(serve, "namespaces", "remove-min-compaction-lag", "public/default")
    assert [(key, value) for key, value, _ in read(serve, topic, compacted=True)] == [("j", b"j1"), ("k", b"b2")]


# -- points 2 and 4: the throttle, JSON logs ------------------------------------------------------


def _json_lines(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a log line is not JSON: {line!r}")
    return records


def _expected_errors(serve: Serve, topic: str) -> None:
    """Errors a user makes: each is answered, none is logged with a traceback."""
    missing = topic_url(unique("missing"))
    assert serve.http.put(missing + "/compaction").status_code == 404
    assert serve.http.post(topic_url(topic) + "/minCompactionLagMs", content=b'"soon"',
                           headers={"content-type": "application/json"}).status_code == 400
    assert serve.http.post(topic_url(topic) + "/compactionMaxBytesPerSecond", json=-1).status_code in (400, 412, 422)
    host, port = serve.broker_url.removeprefix("pulsar://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\x00\x00\x00\x08not a frame")  # a malformed frame: the connection is closed
        sock.settimeout(10)
        assert sock.recv(1024) == b""


def test_json_logs_carry_lifecycle_roll_over_and_throttled_run_lines(start: Callable[..., Serve]) -> None:
    limit = 40_000  # bytes a second
    serve = start("--log-format", "json", "--log-level", "debug", "--compaction-max-bytes-per-second", str(limit),
                  "--managed-ledger-max-entries-per-ledger", "4")
    topic = unique("logs")
    produce(serve, topic, [(f"k{index % 6}", b"x" * 1000) for index in range(24)])
    compact(serve, topic)
    _expected_errors(serve, topic)
    metrics = serve.http.get("/metrics").text
    pattern = r'^compactd_compaction_throttled_seconds\{[^}]*topic="' + re.escape(topic) + r'"[^}]*\} (\S+)$'
    throttled = re.search(pattern, metrics, re.MULTILINE)
    assert serve.terminate() == 0

    records = _json_lines(serve.log_path)
    events = [record.get("event") for record in records]
    for event in ("start", "ready", "stopping", "stop"):
        assert events.count(event) == 1, (event, events)
    assert events.index("start") < events.index("ready") < events.index("stopping") < events.index("stop")
    roll_overs = [record for record in records if record.get("event") == "ledger-roll-over"]
    assert len(roll_overs) >= 5 and all(r["level"] == "DEBUG" and r["topic"] == topic for r in roll_overs)
    [run] = [record for record in records if record.get("event") == "compaction"]
    assert run["level"] == "INFO" and run["logger"] == "compactor.run" and run["topic"] == topic
    assert (run["engine"], run["entries_read"], run["keys_kept"], run["removed"]) == ("local", 24, 6, 18)
    assert run["bytes_in"] > 24_000 and 6_000 < run["bytes_out"] < run["bytes_in"]
    assert run["io_bytes"] >= 2 * run["bytes_in"] + run["bytes_out"]  # read twice, written once
    assert run["duration_s"] >= run["io_bytes"] / limit  # throttled: at least N / limit
    assert run["throttled_s"] > 0.5 * run["io_bytes"] / limit
    assert topic in run["message"] and "keys kept" in run["message"]
    assert throttled is not None and float(throttled.group(1)) == pytest.approx(run["throttled_s"], abs=1e-3)
    assert not any("exception" in record or "Traceback" in record["message"] for record in records)


# -- point 4: text logs, levels, a bad setting ---------------------------------------------------


RUN_LINE = re.compile(
    r"^\S+ \S+ INFO compactor\.run: compaction of (?P<topic>\S+): local engine, 3 entries read, 2 keys kept, "
    r"1 removed, \d+ bytes in, \d+ bytes out, \d+\.\d{3} s \(throttled 0\.000 s\)$")


def test_text_logs_are_readable_and_the_level_filters(start: Callable[..., Serve], tmp_path: Path) -> None:
    serve = start("--managed-ledger-max-entries-per-ledger", "2")
    topic = unique("text")
    produce(serve, topic, [("k", b"1"), ("k", b"2"), ("j", b"1")])
    compact(serve, topic)
    assert serve.terminate() == 0
    text = serve.log_path.read_text()
    runs = [match for match in map(RUN_LINE.match, text.splitlines()) if match]
    assert [match["topic"] for match in runs] == [topic]
    assert " DEBUG " not in text and "rolled over" not in text
    assert "Traceback" not in text

    quiet = start("--log-level", "warning", log="quiet.log")
    produce(quiet, topic, [("k", b"3")])
    compact(quiet, topic)
    assert quiet.terminate() == 0
    assert " INFO " not in quiet.log_path.read_text()

    executable = Path(sys.executable).with_name("compactd")
    bad = subprocess.run([str(executable), "serve", "--data-dir", str(tmp_path / "bad"), "--log-format", "xml"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["compactd: --log-format: 'xml' is not one of text, json"]
