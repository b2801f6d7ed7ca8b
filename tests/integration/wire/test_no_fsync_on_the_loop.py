"""No file-system blocking call runs on the broker's event loop while clients and admins work.

The companion of ``test_no_commit_on_the_loop`` (which watches SQLite's BEGIN and COMMIT):
the same in-process broker (``BrokerHarness``: the real listener and core on their own loop
thread, a real data dir), small ledgers (roll-overs), de-duplication on, a short trim
interval (retention 0: consumed ledgers are deleted at the next trim), the real
``pulsar-client`` and the real admin application on the broker's loop. The calls that wait
for the disk — ``fsync``, ``fdatasync``, ``unlink``/``remove``, ``rename``/``replace``,
``ftruncate``, ``mkdir``/``rmdir`` and ``os.open`` with ``O_CREAT`` (a ledger file, the id
sequence, a key index, a temporary file) — are wrapped on the ``os`` module every ledger
module calls them through (``ledger.storage.file_io.os``: the one ``os`` module): each
wrapper records the thread it runs on, then calls the real function (it observes; nothing
is mocked). The first test loads topics, produces through roll-overs with de-duplication,
acks, seeks, unsubscribes, compacts over REST, lets a trim delete consumed ledgers, takes a
backup over REST, resets, clears and deletes a subscription, deletes a topic and stops the
broker; the second writes admin state, loads, unloads and reloads a topic, compacts it over
REST (in worker processes and in the broker's own process), deletes its ``__compaction``
subscription and compacts it again, and creates, uses and deletes a partitioned topic; the
third fills the disk under a producer (ENOSPC on the ledger file's writes and syncs) and
frees it: the roll past the failed ledger (its seal, the next ledger's creation) must run
off the loop too. None of those calls may run on the loop's thread, and each test checks
they did run, elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from api.broker import dedup
from api.broker import service as broker_service
from api.config import Settings
from api.routers.backup import BACKUP_PATH
from ledger.storage import file as file_store
from ledger.storage import file_io
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import RECEIVE_MS, unique_topic, wait_until
from tests.integration.wire.test_no_commit_on_the_loop import (
    _admin,
    _scheduler_tick,
    _send_while,
    other_subscription_then_topic_deleted,
    produce_ack_seek_unsubscribe,
)
from tests.integration.wire.test_producers import (
    _read_all,
    send_through_a_full_disk,
    short_roll_over_retry,
)
from tests.unit.ledger.test_managed_ledger_failures import FullDisk

pulsar = pytest.importorskip("pulsar")

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
# The functions that wait for the disk (``os.open`` is watched apart: only a creation counts).
BLOCKING = ("fsync", "fdatasync", "unlink", "remove", "rename", "replace", "ftruncate", "truncate",
            "mkdir", "rmdir")


class FileCalls:
    """The threads of the file-system calls that wait for the disk, made while watching."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, int, str]] = []  # (call, file, thread ident, thread name)
        self.stacks: list[str] = []  # where each call on the loop came from
        self.watching = False
        self.loop_thread = -1
        real_os = os  # the module every ledger file module (and every other caller) calls them through
        assert file_io.os is real_os and file_store.os is real_os, "a test left a stand-in for os installed"
        for name in BLOCKING:
            monkeypatch.setattr(real_os, name, self._wrap(name, getattr(real_os, name)))
        real_open = real_os.open

        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & real_os.O_CREAT:
                self._record("open(O_CREAT)", path)
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(real_os, "open", open_)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def recording(*args: Any, **kwargs: Any) -> Any:
            self._record(name, args[0] if args else None)
            return real(*args, **kwargs)
        return recording

    def _record(self, name: str, target: Any) -> None:
        if not self.watching:
            return
        ident = threading.get_ident()
        self.calls.append((name, _file(target), ident, threading.current_thread().name))
        if ident == self.loop_thread:
            self.stacks.append("".join(traceback.format_stack(limit=14)[:-2]))

    def on_loop(self) -> list[tuple[str, str, int, str]]:
        return [call for call in self.calls if call[2] == self.loop_thread]

    def off_loop(self, name: str) -> set[str]:
        """The threads (by name) that made the call ``name`` off the loop."""
        return {thread for call, _, ident, thread in self.calls if call == name and ident != self.loop_thread}

    def report(self) -> str:
        return "\n".join(f"{call}: {target}\n{stack}" for (call, target, _, _), stack
                         in zip(self.on_loop(), self.stacks, strict=False))


def _file(target: Any) -> str:
    """What a call was made on: a path, or an fd's path."""
    if isinstance(target, int):
        with contextlib.suppress(OSError):
            return os.readlink(f"/proc/self/fd/{target}")
    return str(target)


@pytest.fixture(params=[(True, 0.01), (False, 0.0)], ids=["worker-process-swept", "in-process-no-grace"])
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            request: pytest.FixtureRequest) -> Iterator[tuple[BrokerHarness, FileCalls]]:
    """Compaction rounds in worker processes (the default), a replaced view's ledgers
    deleted by the sweep after a short grace period; and in the broker's process, with no
    grace period (deleted by the publish)."""
    worker_process, grace_period_s = request.param
    monkeypatch.setattr(dedup, "SNAPSHOT_INTERVAL_ENTRIES", 7)
    monkeypatch.setattr(broker_service, "GARBAGE_SWEEP_INTERVAL_S", 0.05)
    calls = FileCalls(monkeypatch)
    settings = Settings(broker_deduplication_enabled=True, managed_ledger_max_entries_per_ledger=16,
                        compaction_monitor_interval_seconds=0, compaction_worker_process=worker_process,
                        compacted_ledger_grace_period_s=grace_period_s,
                        retention_check_interval_seconds=0.05)  # retention 0: consumed ledgers go at once
    harness = BrokerHarness(tmp_path / "data", settings)
    assert harness._thread.ident is not None
    calls.loop_thread = harness._thread.ident
    try:
        yield harness, calls
    finally:
        calls.watching = False
        harness.close()


def _ledger_ids(harness: BrokerHarness, topic: str) -> list[int]:
    assert harness.service is not None
    return [record.ledger_id for record in harness.service.registry.loaded[topic].ledger.ledger_list()]


def test_produce_ack_seek_unsubscribe_trim_delete_and_stop_never_touch_files_on_the_event_loop(
        watched: tuple[BrokerHarness, FileCalls]) -> None:
    harness, calls = watched
    topic = unique_topic("no-loop-fsync")
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    admin = _admin(harness)
    client = pulsar.Client(harness.url, operation_timeout_seconds=10, logger=QUIET)
    try:
        calls.watching = True
        producers = produce_ack_seek_unsubscribe(client, topic)  # loads, fdatasyncs, roll-overs (new files)
        # the never-compacted topic's __compaction cursor (at its start) still holds every
        # ledger, the first one included: read it before the compaction, whose own trim may
        # delete it at once (the run's outcome comes after that trim)
        ledgers = _ledger_ids(harness, topic)
        assert len(ledgers) > 1, ledgers  # sealed ledgers behind the current one
        first = ledgers[0]
        # a compaction moves the __compaction cursor to the end: nothing holds the first
        # ledger now but the de-duplication cursor's last persisted snapshot (its rate-limited
        # write may land after the run), and the run's trim or the next one deletes it (off the loop)
        assert admin("PUT", path + "/compaction") == 204
        harness.call(harness.service.runs.wait_idle())
        wait_until(lambda: first not in _ledger_ids(harness, topic), "a trim of the consumed ledgers", timeout_s=10)
        assert admin("POST", BACKUP_PATH) == 200  # staged (copies, fsyncs, renames), streamed, removed
        other_subscription_then_topic_deleted(client, admin, harness, topic, producers)  # its files too
    finally:
        client.close()
    harness.restart()  # the topic left closes (its seal); the broker starts again on the data dir
    client = pulsar.Client(harness.url, operation_timeout_seconds=10, logger=QUIET)
    try:  # the topic loads again (its last ledger sealed, a new one created) and is read from the start
        reader = client.subscribe(topic + "-kept", "again", initial_position=pulsar.InitialPosition.Earliest)
        assert [reader.receive(RECEIVE_MS).data() for _ in range(10)] == [b"k%d" % i for i in range(10)]
        reader.close()
    finally:
        client.close()
    harness.stop()
    calls.watching = False
    assert calls.on_loop() == [], calls.report()
    assert any(name == "ledger-flusher" for name in calls.off_loop("fdatasync")), calls.calls[:20]
    assert any(name.startswith("roll-over") for name in calls.off_loop("open(O_CREAT)")), calls.calls[:20]
    assert any(name.startswith("roll-over") for name in calls.off_loop("fsync")), calls.calls[:20]  # the seals
    assert any(name.startswith("topic-load") for name in calls.off_loop("open(O_CREAT)")), calls.calls[:20]
    assert calls.off_loop("unlink"), calls.calls[:20]  # the trim's, the backup's and the delete's
    assert calls.off_loop("replace"), calls.calls[:20]  # the id sequence's, the backup manifest's


def test_loads_unloads_compaction_partitions_and_admin_writes_never_touch_files_on_the_event_loop(
        watched: tuple[BrokerHarness, FileCalls]) -> None:
    harness, calls = watched
    admin = _admin(harness)
    assert harness.service is not None
    base = "persistent://loop-tenant/ns/"
    client = pulsar.Client(harness.url, operation_timeout_seconds=10, logger=QUIET)
    calls.watching = True
    try:
        assert admin("PUT", "/admin/v2/tenants/loop-tenant", {}) == 204
        assert admin("PUT", "/admin/v2/namespaces/loop-tenant/ns") == 204
        assert admin("PUT", "/admin/v2/persistent/loop-tenant/ns/created") == 204  # an admin create loads it
        typed = client.create_producer(base + "typed", schema=pulsar.schema.StringSchema())
        typed.send("one")
        typed.close()
        topic = base + "switched"
        path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
        producer = client.create_producer(topic, producer_name="switching", batching_enabled=False)
        assert admin("POST", path + "/deduplicationEnabled", False) == 204
        _send_while(producer, 40, b"a", lambda: admin("POST", path + "/deduplicationEnabled", True))
        for i in range(20):
            producer.send(b"keyed", partition_key=f"k{i % 5}")  # keys for the compaction
        assert admin("PUT", path + "/unload") == 204  # the seal off the loop
        producer.send(b"after-unload")  # the topic loads again, off the loop
        consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(61):
            consumer.receive(RECEIVE_MS)
        consumer.close()
        producer.close()
        # a compaction over REST: its output ledgers, its publish, the replaced ones swept
        assert admin("PUT", path + "/compaction") == 204
        harness.call(harness.service.runs.wait_idle())
        assert harness.service.runs.status(topic) == ("SUCCESS", "")
        assert admin("DELETE", path + "/subscription/__compaction") == 204  # its ledgers' files too
        harness.call(_scheduler_tick(harness.service))
        assert admin("PUT", path + "/compaction") == 204
        harness.call(harness.service.runs.wait_idle())
        assert harness.service.runs.status(topic) == ("SUCCESS", "")
        view = harness.service.registry.loaded[topic].compacted.view
        assert view is not None
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(b"newer", partition_key=f"k{i % 5}")
        producer.close()
        assert admin("PUT", path + "/compaction") == 204  # a new view replaces that one
        harness.call(harness.service.runs.wait_idle())
        assert harness.service.runs.status(topic) == ("SUCCESS", "")
        ledgers = harness.service.data_dir.ledgers
        wait_until(lambda: not set(view.ledger_ids) & set(ledgers.list()), "the replaced view's ledgers deleted",
                   timeout_s=10)
        parted = "/admin/v2/persistent/loop-tenant/ns/parted"
        assert admin("PUT", parted + "/partitions", 2) == 204
        partitioned = client.create_producer(base + "parted", batching_enabled=False)
        for i in range(4):
            partitioned.send(b"p%d" % i, partition_key=str(i))
        partitioned.close()
        assert admin("DELETE", parted + "/partitions") == 204  # the partitions' files
        assert not [name for name in harness.service.registry.loaded if "parted" in name]
    finally:
        client.close()
    harness.stop()
    calls.watching = False
    assert calls.on_loop() == [], calls.report()
    assert any(name.startswith("topic-load") for name in calls.off_loop("open(O_CREAT)")), calls.calls[:20]
    assert calls.off_loop("fsync") and calls.off_loop("unlink"), calls.calls[:20]


def test_a_full_disk_and_the_roll_past_the_failed_ledger_never_touch_files_on_the_event_loop(
        broker: BrokerHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write fails (ENOSPC on the ledger file's write and sync): the next append seals the
    failed ledger at its last durable entry and creates the next one (its file, the id
    sequence, their syncs; an empty failed ledger's file deleted), on a roll-over thread,
    not on the loop that took the send; sends fail while the disk is full, and the topic
    recovers by itself once space frees, each message stored once, in order."""
    calls = FileCalls(monkeypatch)
    assert broker._thread.ident is not None
    calls.loop_thread = broker._thread.ident
    short_roll_over_retry(broker, monkeypatch)
    disk = FullDisk()  # delegates to os, whose calls FileCalls records
    monkeypatch.setattr(file_store, "os", disk)
    monkeypatch.setattr(file_io, "os", disk)
    topic = unique_topic("full-disk-off-loop")
    client = pulsar.Client(broker.url, operation_timeout_seconds=10, logger=QUIET)
    try:
        send_through_a_full_disk(client, disk, topic, watch=lambda on: setattr(calls, "watching", on))
    finally:
        client.close()
    stored = _read_all(pulsar.Client(broker.url, operation_timeout_seconds=10, logger=QUIET), topic)
    assert [m.data() for m in stored] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"after"]
    assert calls.on_loop() == [], calls.report()
    assert calls.off_loop("open(O_CREAT)") and calls.off_loop("fsync"), calls.calls[:20]  # the roll past it
