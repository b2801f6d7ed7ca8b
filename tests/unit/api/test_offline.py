"""``compactd compact-topic``: one offline compaction of a stopped broker's data dir.

The data dir is real (files + SQLite), written the way the broker writes a topic: a
managed ledger whose entries are framed as a Pulsar producer frames them. The command
runs in process (typer's runner) and once as the real console script; what it published
is then read back the way a restarted broker reads it (``CompactedTopic.restore``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from api.broker.policies import PolicyStore
from api.cli import app
from api.offline import summary
from compactor.record import RunFigures
from compactor.runs.status import CompactionStatusStore
from compactor.view.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger
from message.encoder import encode_entry
from message.entry import iter_messages, parse_entry
from message.proto import pulsar_api_pb2 as pb
from tests.serve_process import ServeProcess

TOPIC = "persistent://public/default/offline"
PROCESS_TIMEOUT_S = 120
SUMMARY_FIELDS = {"topic", "status", "compacted", "ledgerId", "viewLedgers", "removedEvents", "entriesRead", "messagesRead",
                  "entriesWritten", "bytesWritten", "durationMs"}


@pytest.fixture(autouse=True)
def _no_compactd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("COMPACTD_"):
            monkeypatch.delenv(name)


def _message(key: str | None, value: bytes | None, *, publish_time_ms: int, sequence_id: int) -> bytes:
    """One non-batched entry as a producer frames it (stored without the checksum)."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=publish_time_ms)
    if key is not None:
        metadata.partition_key = key
    payload = b"" if value is None else value
    if value is None:
        metadata.null_value = True
    metadata.uncompressed_size = len(payload)
    return encode_entry(metadata, payload, with_checksum=False)


def _write_topic(path: Path, topic: str, messages: list[tuple[str | None, bytes | None]],
                 *, publish_time_ms: int = 1_700_000_000_000) -> None:
    """A stopped broker's data dir holding ``topic`` with ``messages`` (key, value; None: tombstone)."""
    data_dir = DataDir.open(str(path))
    try:
        ledger = ManagedLedger.open(topic, data_dir.ledgers, data_dir.metadata)
        futures = [ledger.append(_message(key, value, publish_time_ms=publish_time_ms, sequence_id=index))
                   for index, (key, value) in enumerate(messages)]
        for future in futures:
            future.result(timeout=30)
        ledger.close()
    finally:
        data_dir.close()


def _compacted_view(path: Path, topic: str) -> list[tuple[str | None, bytes, bool]]:
    """What a restarted broker serves to a read-compacted reader: (key, value, null_value)."""
    data_dir = DataDir.open(str(path))
    try:
        ledger = ManagedLedger.open(topic, data_dir.ledgers, data_dir.metadata)
        try:
            view = CompactedTopic.restore(ledger, CursorStore(data_dir.database)).view
            assert view is not None, "no compacted view was published"
            return [(message.key, message.payload, message.null_value)
                    for entry in view.iter_all() for message in iter_messages(parse_entry(entry.data))]
        finally:
            ledger.close()
    finally:
        data_dir.close()


# Three keys updated in turns; k1 is deleted at the end; one key-less message.
MESSAGES: list[tuple[str | None, bytes | None]] = [
    *((f"k{index % 3}", f"v{index}".encode()) for index in range(9)),
    (None, b"keyless"),
    ("k1", None),
]


def _compact(data: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["compact-topic", "--data-dir", str(data), *args])


def test_compact_topic_prints_one_json_line_and_publishes_the_view(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)

    result = _compact(data, "--topic", "offline")

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, lines  # no progress bar off a terminal
    figures = json.loads(lines[0])
    assert set(figures) == SUMMARY_FIELDS
    assert figures["topic"] == TOPIC and figures["status"] == "SUCCESS"
    assert figures["ledgerId"] >= 0 and figures["compacted"] is True
    assert figures["viewLedgers"] == [figures["ledgerId"]]
    assert figures["entriesRead"] == figures["messagesRead"] == len(MESSAGES)
    # Kept: k0 = v6, k2 = v8; the key-less message and every k1 are dropped (Pulsar's defaults).
    assert figures["entriesWritten"] == 2 and figures["removedEvents"] == len(MESSAGES) - 2
    assert figures["bytesWritten"] > 0 and figures["durationMs"] >= 0
    assert _compacted_view(data, TOPIC) == [("k0", b"v6", False), ("k2", b"v8", False)]


def test_a_second_run_with_nothing_new_succeeds_and_keeps_the_view(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)
    first = _compact(data, "--topic", TOPIC)
    assert first.exit_code == 0, first.output

    result = _compact(data, "--topic", TOPIC)

    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout)
    assert again["compacted"] is False and again["entriesRead"] == 0  # nothing after the horizon
    assert again["ledgerId"] == json.loads(first.stdout)["ledgerId"]  # the view that stands, not -1
    assert again["viewLedgers"] == json.loads(first.stdout)["viewLedgers"]
    assert _compacted_view(data, TOPIC) == [("k0", b"v6", False), ("k2", b"v8", False)]


def test_the_status_is_recorded_for_compaction_status_after_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)
    assert _compact(data, "--topic", TOPIC).exit_code == 0

    data_dir = DataDir.open(str(data))
    try:
        assert CompactionStatusStore(data_dir.database).compaction_status(TOPIC) == ("SUCCESS", "")
    finally:
        data_dir.close()


def test_an_offline_run_goes_through_the_run_executor_as_the_broker_s_runs_do(tmp_path: Path) -> None:
    """The executor's rules hold offline: a RUNNING another topic kept from a broker that
    stopped mid-run reads ERROR, as it would after ``compactd serve`` restarted."""
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)
    other = "persistent://public/default/killed-mid-run"
    data_dir = DataDir.open(str(data))
    try:
        CompactionStatusStore(data_dir.database).set_compaction_status(other, "RUNNING", "", 1)
    finally:
        data_dir.close()

    assert _compact(data, "--topic", TOPIC).exit_code == 0

    data_dir = DataDir.open(str(data))
    try:
        assert CompactionStatusStore(data_dir.database).compaction_status(TOPIC) == ("SUCCESS", "")
        assert CompactionStatusStore(data_dir.database).compaction_status(other) == ("ERROR", "the broker stopped during the run")
    finally:
        data_dir.close()


def test_the_broker_settings_from_the_environment_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)
    monkeypatch.setenv("COMPACTD_TOPIC_COMPACTION_RETAIN_NULL_KEY", "true")

    result = _compact(data, "--topic", TOPIC)

    assert result.exit_code == 0, result.output
    assert (None, b"keyless", False) in _compacted_view(data, TOPIC)


def test_the_namespace_delete_retention_policy_keeps_recent_tombstones(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES, publish_time_ms=int(time.time() * 1000))
    data_dir = DataDir.open(str(data))
    try:
        PolicyStore(data_dir.database).set_policy("public/default", "deleteRetentionMs", 3_600_000)
    finally:
        data_dir.close()

    result = _compact(data, "--topic", TOPIC)

    assert result.exit_code == 0, result.output
    assert ("k1", b"", True) in _compacted_view(data, TOPIC)  # the tombstone is an hour from expiry


def test_the_topic_policy_wins_over_the_namespace_policy(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES, publish_time_ms=int(time.time() * 1000) - 60_000)
    data_dir = DataDir.open(str(data))
    try:
        PolicyStore(data_dir.database).set_policy("public/default", "deleteRetentionMs", 3_600_000)
        PolicyStore(data_dir.database).set_policy(TOPIC, "deleteRetentionMs", 1_000)  # the tombstone is older
    finally:
        data_dir.close()

    result = _compact(data, "--topic", TOPIC)

    assert result.exit_code == 0, result.output
    assert all(key != "k1" for key, _, _ in _compacted_view(data, TOPIC))


def test_a_locked_data_dir_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)
    running = DataDir.open(str(data))  # a running broker holds the lock
    try:
        result = _compact(data, "--topic", TOPIC)
    finally:
        running.close()

    assert result.exit_code == 1
    assert result.stdout == ""
    assert "in use by another compactd process" in result.stderr
    assert "Traceback" not in result.output


def test_an_unknown_topic_is_refused_and_not_created(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)

    result = _compact(data, "--topic", "nope")

    assert result.exit_code == 1
    assert "persistent://public/default/nope not found" in result.stderr
    data_dir = DataDir.open(str(data))
    try:
        assert not data_dir.metadata.topic_exists("persistent://public/default/nope")
    finally:
        data_dir.close()


def test_a_path_without_a_data_dir_is_refused_and_left_alone(tmp_path: Path) -> None:
    missing = tmp_path / "missing"

    result = CliRunner().invoke(app, ["compact-topic", "--data-dir", str(missing), "--topic", TOPIC])

    assert result.exit_code == 1
    assert "no compactd data dir at" in result.stderr
    assert not missing.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--topic", "non-persistent://public/default/t"], "non-persistent"),
    (["--topic", "persistent://a/b"], "invalid topic name"),
    (["--topic", TOPIC, "--engine", "flink"], "'flink' is not one of local, spark"),
])
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)

    result = _compact(data, *args)

    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_summary_names_pulsar_style_fields() -> None:
    figures = RunFigures(ledger_id=7, removed_events=3, entries_read=5, messages_read=6,
                         entries_written=2, bytes_written=99, duration_s=1.2345)

    assert summary(TOPIC, figures, (7, 8)) == {
        "topic": TOPIC, "status": "SUCCESS", "compacted": True, "ledgerId": 7, "viewLedgers": [7, 8],
        "removedEvents": 3, "entriesRead": 5, "messagesRead": 6, "entriesWritten": 2, "bytesWritten": 99,
        "durationMs": 1234,
    }
    nothing_new = summary(TOPIC, RunFigures(), (4, 5))
    assert nothing_new["compacted"] is False and nothing_new["ledgerId"] == 4 and nothing_new["viewLedgers"] == [4, 5]


def test_the_console_script_runs_offline_compaction(tmp_path: Path) -> None:
    executable = Path(sys.executable).with_name("compactd")
    if not executable.exists():
        pytest.skip("the compactd console script is not installed")
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)
    env = {name: value for name, value in os.environ.items() if not name.startswith("COMPACTD_")}

    result = subprocess.run([str(executable), "compact-topic", "--data-dir", str(data), "--topic", TOPIC],
                            capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False, env=env)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, lines
    assert json.loads(lines[0])["entriesWritten"] == 2
    assert _compacted_view(data, TOPIC) == [("k0", b"v6", False), ("k2", b"v8", False)]


def test_the_progress_bar_draws_both_phases_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES)
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: treat stderr as a terminal
    monkeypatch.setenv("COLUMNS", "120")

    result = _compact(data, "--topic", TOPIC)

    assert result.exit_code == 0, result.output
    assert "phase one" in result.stderr and "phase two" in result.stderr
    assert f"{len(MESSAGES)}/{len(MESSAGES)}" in result.stderr
    assert len(result.stdout.splitlines()) == 1


# -- end to end: a real broker writes, stops, is compacted offline, and restarts ----------


def test_e2e_offline_compaction_of_a_real_brokers_data_dir(tmp_path: Path) -> None:
    pulsar = pytest.importorskip("pulsar")
    data, topic = tmp_path / "data", "persistent://public/default/e2e-offline"
    quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    log = tmp_path / "serve.log"
    serve = ServeProcess(data, log, "--compaction-monitor-interval-seconds", "0")
    try:
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=quiet)
        try:
            producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5)
            for index in range(60):
                producer.send_async(f"v{index}".encode(), None, partition_key=f"k{index % 4}")
            producer.flush()
            producer.close()
        finally:
            client.close()
        locked = _compact(data, "--topic", topic)  # the running broker holds the data dir
        assert locked.exit_code == 1
        assert "in use by another compactd process" in locked.stderr
    finally:
        assert serve.terminate() == 0

    compacted = _compact(data, "--topic", topic)
    assert compacted.exit_code == 0, compacted.output
    figures = json.loads(compacted.stdout)
    assert figures["messagesRead"] == 60 and figures["removedEvents"] == 56

    serve = ServeProcess(data, log, "--compaction-monitor-interval-seconds", "0")
    try:
        status = CliRunner().invoke(app, ["admin", "--admin-url", serve.http_url, "topics", "compaction-status", topic])
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=quiet)
        try:
            reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
            received = {}
            while reader.has_message_available():
                message = reader.read_next(timeout_millis=10_000)
                received[message.partition_key()] = message.data()
            reader.close()
        finally:
            client.close()
    finally:
        assert serve.terminate() == 0
    assert received == {f"k{key}": f"v{56 + key}".encode() for key in range(4)}
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["status"] == "SUCCESS"  # the offline run's status, persisted


def test_the_minimum_lag_policy_holds_young_messages_back_offline_too(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _write_topic(data, TOPIC, MESSAGES, publish_time_ms=int(time.time() * 1000) - 60_000)
    data_dir = DataDir.open(str(data))
    try:
        PolicyStore(data_dir.database).set_policy("public/default", "minCompactionLagMs", 3_600_000)
    finally:
        data_dir.close()

    held_back = _compact(data, "--topic", TOPIC)

    assert held_back.exit_code == 0, held_back.output
    held = json.loads(held_back.stdout)  # every message is a minute old: younger than an hour
    assert held["compacted"] is False and held["ledgerId"] == -1 and held["viewLedgers"] == []  # no view yet
    data_dir = DataDir.open(str(data))
    try:
        PolicyStore(data_dir.database).set_policy(TOPIC, "minCompactionLagMs", 1_000)  # the topic's wins
    finally:
        data_dir.close()
    result = _compact(data, "--topic", TOPIC)
    assert result.exit_code == 0, result.output
    assert _compacted_view(data, TOPIC) == [("k0", b"v6", False), ("k2", b"v8", False)]
