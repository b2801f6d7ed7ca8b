"""Backup and restore end to end (issue 16 point 3): a real ``compactd serve``, a real
pulsar-client producer that never stops, ``compactd backup`` and ``compactd restore``.

* ``test_an_online_backup_taken_under_a_running_producer_restores_every_acknowledged_message``
  — a producer sends keyed messages without pause while ``compactd backup --admin-url``
  runs; after ``compactd restore`` a new ``compactd serve`` on the restored data dir
  serves every message acknowledged before the backup began, the subscription's cursor
  (its first delivery follows the last acknowledged message) and the compacted view
  (read-compacted reader and TableView, tombstones applied). The producer's sends during
  the backup all succeeded; the broker's staged copy is removed once streamed.
* ``test_a_corrupted_backup_is_refused_by_compactd_restore`` — one flipped byte in a
  ledger file: ``compactd restore`` exits 1 naming the file; no data dir is written.
* ``test_an_offline_backup_of_a_stopped_broker_restores`` — ``--data-dir``; and a backup
  of a data dir a broker holds is refused, pointing to ``--admin-url``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.wire.helpers import wait_until
from tests.serve_process import PROCESS_TIMEOUT_S, ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
WAIT_S = 30.0
# Small ledgers: the topic has sealed ledgers and an open one when the backup is taken.
FLAGS = ("--managed-ledger-max-entries-per-ledger", "25", "--managed-ledger-mark-delete-rate-limit", "0")
COMPACTD = str(Path(sys.executable).with_name("compactd"))


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[[Path], ServeProcess]]:
    processes: list[ServeProcess] = []

    def start(data_dir: Path) -> ServeProcess:
        process = ServeProcess(data_dir, tmp_path / f"serve-{len(processes)}.log", *FLAGS)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.running:
            assert process.terminate() == 0


def compactd(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMPACTD, *arguments], capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S,
                          check=False)


class Producing:
    """A producer thread sending ``m<n>`` (key ``k<n % 7>``) one after the other, each
    acknowledged before the next, until stopped; ``acked`` lists what was acknowledged."""

    def __init__(self, client: Any, topic: str) -> None:
        self.producer = client.create_producer(topic, batching_enabled=False)
        self.acked: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producing")
        self._thread.start()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            value = f"m{number}"
            try:
                self.producer.send(value.encode(), partition_key=f"k{number % 7}")
            except Exception as error:  # noqa: BLE001 - reported by the test
                self.errors.append(error)
                return
            self.acked.append(value)
            number += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        self.producer.close()


def topic_path(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def read_all(client: Any, topic: str, *, compacted: bool = False) -> list[tuple[str, bytes]]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
    try:
        seen = []
        while reader.has_message_available():
            message = reader.read_next(5000)
            seen.append((message.partition_key(), message.data()))
        return seen
    finally:
        reader.close()


def compact(http: httpx.Client, topic: str) -> None:
    assert http.put(topic_path(topic) + "/compaction").status_code == 204

    def done() -> bool:
        status = http.get(topic_path(topic) + "/compaction").json()
        assert status["status"] != "ERROR", status
        return bool(status["status"] == "SUCCESS")
    wait_until(done, f"compaction of {topic}", WAIT_S)


def prepare_compacted_topic(client: Any, http: httpx.Client, topic: str) -> dict[str, bytes]:
    """Keyed updates and a tombstone, compacted; the latest value per key."""
    producer = client.create_producer(topic)
    for round_ in range(4):
        for key in ("a", "b", "c"):
            producer.send(f"{key}{round_}".encode(), partition_key=key)
    producer.send(None, partition_key="b")
    producer.close()
    compact(http, topic)
    return {"a": b"a3", "c": b"c3"}


def acknowledge_first(client: Any, http: httpx.Client, topic: str, count: int) -> None:
    """Subscription ``ops`` acknowledges the first ``count`` messages; waits until the
    broker persisted it."""
    consumer = client.subscribe(topic, "ops", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(count):
        message = consumer.receive(5000)
        consumer.acknowledge(message)
    last = f"{message.message_id().ledger_id()}:{message.message_id().entry_id()}"

    def persisted() -> bool:
        cursor = http.get(topic_path(topic) + "/internalStats").json()["cursors"]["ops"]
        return bool(cursor["markDeletePosition"] == last)
    wait_until(persisted, "the acknowledgements to persist", WAIT_S)
    consumer.close()


def test_an_online_backup_taken_under_a_running_producer_restores_every_acknowledged_message(
        tmp_path: Path, started: Callable[[Path], ServeProcess]) -> None:
    serve = started(tmp_path / "data")
    live = f"persistent://public/default/live-{uuid.uuid4().hex[:8]}"
    table = f"persistent://public/default/table-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
    http = httpx.Client(base_url=serve.http_url, timeout=WAIT_S)
    try:
        latest = prepare_compacted_topic(client, http, table)
        producing = Producing(client, live)
        wait_until(lambda: len(producing.acked) >= 60, "60 messages acknowledged", WAIT_S)
        acknowledge_first(client, http, live, 10)
        acked_before = list(producing.acked)
        result = compactd("backup", "--admin-url", serve.http_url, "--output", str(tmp_path / "backup"))
        sent_at_end_of_backup = len(producing.acked)
        wait_until(lambda: len(producing.acked) > sent_at_end_of_backup + 5,
                   "the producer to go on after the backup", WAIT_S)
        producing.stop()
        assert producing.errors == []
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["openLedgers"], "the live topic's current ledger was open during the backup"
        assert not (tmp_path / "data" / "backup-staging").exists()  # the staged copy is gone, its directory too
    finally:
        http.close()
        client.close()
    assert serve.terminate() == 0

    restored = compactd("restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
    assert restored.returncode == 0, restored.stderr
    again = started(tmp_path / "restored")
    client = pulsar.Client(again.broker_url, operation_timeout_seconds=10, logger=QUIET)
    try:
        values = [value.decode() for _, value in read_all(client, live)]
        assert values[: len(acked_before)] == acked_before  # every acknowledged message, in order
        consumer = client.subscribe(live, "ops")
        assert consumer.receive(5000).data() == b"m10"  # the cursor: after the 10 acknowledged
        consumer.close()
        assert dict(read_all(client, table, compacted=True)) == latest
        view = client.create_table_view(table)
        try:
            assert wait_until(lambda: len(view) == len(latest), "the table view", WAIT_S)
            assert {key: view.get(key) for key in latest} == latest
        finally:
            view.close()
    finally:
        client.close()


def test_a_corrupted_backup_is_refused_by_compactd_restore(
        tmp_path: Path, started: Callable[[Path], ServeProcess]) -> None:
    serve = started(tmp_path / "data")
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
    try:
        producer = client.create_producer("persistent://public/default/corrupt-me")
        for number in range(30):
            producer.send(b"x%d" % number, partition_key="k")
        producer.close()
    finally:
        client.close()
    assert compactd("backup", "--admin-url", serve.http_url, "--output", str(tmp_path / "backup")).returncode == 0
    assert serve.terminate() == 0
    ledger_file = min((tmp_path / "backup" / "ledgers").glob("*.ledger"))
    data = bytearray(ledger_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    ledger_file.unlink()  # never write through a hard link into the broker's data dir
    ledger_file.write_bytes(bytes(data))

    result = compactd("restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
    assert result.returncode == 1
    assert result.stderr.strip() == (f"compactd: backup {tmp_path / 'backup'} is damaged: ledgers/{ledger_file.name} "
                                     "does not match its SHA-256 checksum in the manifest")
    assert not (tmp_path / "restored").exists()


def test_an_offline_backup_of_a_stopped_broker_restores(tmp_path: Path,
                                                        started: Callable[[Path], ServeProcess]) -> None:
    serve = started(tmp_path / "data")
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
    try:
        producer = client.create_producer("persistent://public/default/offline")
        for number in range(40):
            producer.send(b"o%d" % number, partition_key=f"k{number}")
        producer.close()
    finally:
        client.close()
    locked = compactd("backup", "--data-dir", str(tmp_path / "data"), "--output", str(tmp_path / "refused"))
    assert locked.returncode == 1, locked.stderr
    assert "is in use by another compactd process" in locked.stderr
    assert locked.stderr.rstrip().endswith("back a running broker up with --admin-url")
    assert serve.terminate() == 0

    assert compactd("backup", "--data-dir", str(tmp_path / "data"), "--output", str(tmp_path / "b")).returncode == 0
    assert compactd("restore", str(tmp_path / "b"), "--data-dir", str(tmp_path / "restored")).returncode == 0
    again = started(tmp_path / "restored")
    client = pulsar.Client(again.broker_url, operation_timeout_seconds=10, logger=QUIET)
    try:
        values = [value for _, value in read_all(client, "persistent://public/default/offline")]
        assert values == [b"o%d" % number for number in range(40)]
    finally:
        client.close()
