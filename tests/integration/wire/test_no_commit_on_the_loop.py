"""No SQLite commit runs on the broker's event loop while clients and admins work a loaded topic.

An in-process broker (``BrokerHarness``: the real listener and core on their own loop
thread, a real data dir) with de-duplication on, small ledgers (roll-overs happen) and
de-duplication snapshots every few entries; the real ``pulsar-client`` and the real admin
application (over an ASGI transport, its handlers run on the broker's loop). SQLite's
trace callback, set on the database's one connection, sees every statement on the thread
that runs it: the test records the thread of each ``BEGIN``/``COMMIT`` while producers load
their fresh topics, a consumer subscribes, a producer publishes with de-duplication, the
consumer acks every message, seeks, unsubscribes, another subscription is created and
closed, an admin resets it, clears its backlog and deletes it, then deletes the topic, and
the broker stops. None may run on the loop's thread; the cursor writes must have happened
(on the cursor store's thread).

The second test watches the broker's other writers: tenant, namespace, policy, grant and
schema writes through the admin application, an admin create, first producers and
consumers (with schemas) on fresh topics, de-duplication switched on by a policy while a
producer sends (every message stored once), an unload and the reload that follows, a
partitioned topic created, used and deleted: their commits run on the ``topic-load``,
``metadata-write`` and cursor threads, none on the loop.

The second test: a subscription answered SUCCESS survives kill -9 with its position (its
creation is committed off the loop *before* the answer), as does an answered seek.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.broker import dedup
from api.config import Settings
from api.http import create_app
from cursor.store import CursorStore
from ledger.database import Database
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import RECEIVE_MS, unique_topic
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
MESSAGES = 60


class Commits:
    """The threads that begin or commit SQLite transactions on the database's connection."""

    def __init__(self, database: Database) -> None:
        self._connection = database._db  # the one connection every store writes through
        self.threads: list[tuple[str, int, str]] = []  # (statement, thread ident, thread name)
        self.watching = False
        self._connection.set_trace_callback(self._trace)

    def _trace(self, statement: str) -> None:
        words = statement.lstrip().upper()
        if self.watching and words.startswith(("BEGIN IMMEDIATE", "COMMIT")):
            self.threads.append((statement.strip()[:40], threading.get_ident(), threading.current_thread().name))

    def on(self, thread_ident: int) -> list[tuple[str, int, str]]:
        return [entry for entry in self.threads if entry[1] == thread_ident]

    def off(self, thread_ident: int) -> list[tuple[str, int, str]]:
        return [entry for entry in self.threads if entry[1] != thread_ident]


@pytest.fixture(params=[1.0, 0.0], ids=["rate-limited", "no-rate-limit"])
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            request: pytest.FixtureRequest) -> Iterator[tuple[BrokerHarness, Commits]]:
    """The default persist schedule, and none (every ack written at once)."""
    monkeypatch.setattr(dedup, "SNAPSHOT_INTERVAL_ENTRIES", 7)  # snapshots inside the watched window
    settings = Settings(broker_deduplication_enabled=True, managed_ledger_max_entries_per_ledger=16,
                        compaction_monitor_interval_seconds=0, managed_ledger_mark_delete_rate_limit=request.param)
    harness = BrokerHarness(tmp_path / "data", settings)
    assert harness.data_dir is not None
    commits = Commits(harness.data_dir.database)
    try:
        yield harness, commits
    finally:
        harness.close()  # the database (and its trace callback) goes with the data dir


def _admin(harness: BrokerHarness) -> Callable[[str, str], int]:
    """``admin(method, path)``: one admin request, handled on the broker's loop."""
    app = create_app(harness.settings, broker=harness.service)

    async def request(method: str, path: str, json: Any) -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as client:
            return (await client.request(method, path, json=json)).status_code

    return lambda method, path, json=None: harness.call(request(method, path, json))  # type: ignore[misc]


def produce_ack_seek_unsubscribe(client: Any, topic: str) -> tuple[Any, Any]:
    """Producers load ``topic`` and ``topic``-kept (loaded until the stop: a de-duplication
    state the stop's close snapshots); a Shared consumer receives and acks every message
    (roll-overs, de-duplication snapshots), seeks to the middle and unsubscribes. Returns
    the two producers, open."""
    producer = client.create_producer(topic, producer_name="p", batching_enabled=False)
    kept = client.create_producer(topic + "-kept", batching_enabled=False)
    for i in range(10):
        kept.send(b"k%d" % i)
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    ids = [producer.send(b"m%d" % i) for i in range(MESSAGES)]
    for _ in range(MESSAGES):
        consumer.acknowledge(consumer.receive(RECEIVE_MS))
    consumer.seek(ids[MESSAGES // 2])
    assert consumer.receive(RECEIVE_MS).data() == b"m%d" % (MESSAGES // 2 + 1)  # the client skips the id
    consumer.unsubscribe()
    return producer, kept


def other_subscription_then_topic_deleted(client: Any, admin: Callable[..., int], harness: BrokerHarness,
                                          topic: str, producers: tuple[Any, Any]) -> None:
    """Subscription "other" created and closed, reset, cleared and deleted by the admin;
    ``producers`` closed; the topic deleted (its ledgers' and cursors' rows, its files)."""
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    other = client.subscribe(topic, "other", initial_position=pulsar.InitialPosition.Earliest)
    other.close()
    assert admin("POST", path + "/subscription/other/resetcursor/0") == 204
    assert admin("POST", path + "/subscription/other/skip_all") == 204
    assert admin("DELETE", path + "/subscription/other") == 204
    for producer in producers:
        producer.close()
    assert admin("DELETE", path) == 204
    assert harness.service is not None and topic not in harness.service.registry.loaded


def test_subscribe_ack_seek_unsubscribe_admin_and_stop_never_commit_on_the_event_loop(
        watched: tuple[BrokerHarness, Commits]) -> None:
    harness, commits = watched
    topic = unique_topic("no-loop-commit")
    admin = _admin(harness)
    loop_thread = harness._thread.ident
    assert loop_thread is not None
    client = pulsar.Client(harness.url, operation_timeout_seconds=10, logger=QUIET)
    try:
        commits.watching = True
        producer, kept = produce_ack_seek_unsubscribe(client, topic)
        other_subscription_then_topic_deleted(client, admin, harness, topic, (producer, kept))
    finally:
        client.close()
    harness.stop()  # the topic left closes: its seal, last snapshot and cursor states
    commits.watching = False
    assert commits.on(loop_thread) == [], commits.on(loop_thread)[:5]
    writers = {name for _, _, name in commits.off(loop_thread)}
    assert "cursor-persist" in writers, writers  # the cursor writes were made, by the store's thread
    assert any(name.startswith("roll-over") for name in writers), writers  # and roll-overs ran
    assert any(name.startswith("topic-load") for name in writers), writers  # and the loads


def _send_while(producer: Any, count: int, prefix: bytes, during: Callable[[], None]) -> None:
    """Send ``count`` messages asynchronously, run ``during()`` meanwhile, wait for every receipt."""
    receipts: list[Any] = []
    done = threading.Event()

    def receipt(result: Any, _message_id: Any) -> None:
        receipts.append(result)
        if len(receipts) == count:
            done.set()

    for i in range(count // 2):
        producer.send_async(prefix + b"%d" % i, receipt)
    during()
    for i in range(count // 2, count):
        producer.send_async(prefix + b"%d" % i, receipt)
    assert done.wait(10), f"{len(receipts)} of {count} receipts"
    assert all(result == pulsar.Result.Ok for result in receipts), receipts


def test_loads_unloads_policy_switches_partitions_and_admin_writes_never_commit_on_the_event_loop(
        watched: tuple[BrokerHarness, Commits]) -> None:
    harness, commits = watched
    admin = _admin(harness)
    loop_thread = harness._thread.ident
    assert loop_thread is not None and harness.service is not None
    base = "persistent://loop-tenant/ns/"
    client = pulsar.Client(harness.url, operation_timeout_seconds=10, logger=QUIET)
    commits.watching = True
    try:
        assert admin("PUT", "/admin/v2/tenants/loop-tenant", {}) == 204
        assert admin("PUT", "/admin/v2/namespaces/loop-tenant/ns") == 204
        assert admin("POST", "/admin/v2/namespaces/loop-tenant/ns/compactionThreshold", 1 << 20) == 204
        assert admin("POST", "/admin/v2/namespaces/loop-tenant/ns/permissions/reader", ["consume"]) == 204
        assert admin("POST", "/admin/v2/namespaces/loop-tenant/ns/schemaCompatibilityStrategy", "FULL") == 204
        assert admin("PUT", "/admin/v2/persistent/loop-tenant/ns/created") == 204  # an admin create loads it
        assert admin("POST", "/admin/v2/persistent/loop-tenant/ns/created/permissions/writer", ["produce"]) == 204
        assert admin("POST", "/admin/v2/schemas/loop-tenant/ns/uploaded/schema",
                     {"type": "STRING", "schema": "", "properties": {}}) == 200
        typed = client.create_producer(base + "typed", schema=pulsar.schema.StringSchema())  # load + schema
        typed.send("one")
        reader = client.subscribe(base + "typed-sub", "s", schema=pulsar.schema.StringSchema())  # load + schema
        reader.close()
        typed.close()
        # de-duplication switched on by a policy while a producer sends: each message stored once
        topic = base + "switched"
        path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
        producer = client.create_producer(topic, producer_name="switching", batching_enabled=False)
        assert admin("POST", path + "/deduplicationEnabled", False) == 204
        assert harness.service.registry.loaded[topic].dedup is None
        _send_while(producer, 40, b"a", lambda: admin("POST", path + "/deduplicationEnabled", True))
        assert harness.service.registry.loaded[topic].dedup is not None  # on once the policy was answered
        assert admin("PUT", path + "/unload") == 204  # the seal off the loop
        producer.send(b"after-unload")  # the client reconnects: the topic loads again, off the loop
        consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
        received = [consumer.receive(RECEIVE_MS).data() for _ in range(41)]
        assert sorted(received) == sorted([b"a%d" % i for i in range(40)] + [b"after-unload"])
        consumer.close()
        producer.close()
        # a compaction triggered over REST: its statuses (RUNNING, SUCCESS) are written off the loop
        assert admin("PUT", path + "/compaction") == 204
        harness.call(harness.service.runs.wait_idle())
        assert harness.service.runs.status(topic) == ("SUCCESS", "")
        # the __compaction subscription deleted (its view off the loop), the scheduler's look at
        # the topic (no cursor opened), a run that opens it again (on the run's thread)
        assert admin("DELETE", path + "/subscription/__compaction") == 204
        assert harness.service.registry.loaded[topic].compacted.view is None
        harness.call(_scheduler_tick(harness.service))
        assert admin("PUT", path + "/compaction") == 204
        harness.call(harness.service.runs.wait_idle())
        assert harness.service.runs.status(topic) == ("SUCCESS", "")
        assert harness.service.registry.loaded[topic].compacted.view is not None
        # a partitioned topic: created, used (its partitions load), deleted
        parted = "/admin/v2/persistent/loop-tenant/ns/parted"
        assert admin("PUT", parted + "/partitions", 2) == 204
        partitioned = client.create_producer(base + "parted", batching_enabled=False)
        for i in range(4):
            partitioned.send(b"p%d" % i, partition_key=str(i))
        partitioned.close()
        assert admin("DELETE", parted + "/partitions") == 204
        assert not [name for name in harness.service.registry.loaded if "parted" in name]
        assert admin("DELETE", "/admin/v2/namespaces/loop-tenant/ns/compactionThreshold") == 204
        assert admin("DELETE", "/admin/v2/namespaces/loop-tenant/ns/permissions/reader") == 204
        assert admin("DELETE", "/admin/v2/schemas/loop-tenant/ns/uploaded/schema") == 200
    finally:
        client.close()
    harness.stop()
    commits.watching = False
    assert commits.on(loop_thread) == [], commits.on(loop_thread)[:5]
    writers = {name for _, _, name in commits.off(loop_thread)}
    assert any(name.startswith("topic-load") for name in writers), writers
    assert any(name.startswith("metadata-write") for name in writers), writers
    assert any(name.startswith("compaction-status") for name in writers), writers


async def _scheduler_tick(service: Any) -> None:
    service.scheduler_tick(int(time.time() * 1000))  # on the loop, as the broker's monitor runs it


def _persisted(data_dir: Path, topic: str, name: str) -> Any:
    database = Database(str(data_dir / "metadata.db"), read_only=True)
    try:
        return CursorStore(database).load_persisted(topic, name)
    finally:
        database.close()


@pytest.mark.slow
def test_an_answered_subscribe_and_seek_survive_kill_9(tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    topic = unique_topic("answered")
    serve = ServeProcess(data_dir, log_path)
    try:
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        producer = client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(b"m%d" % i) for i in range(10)]
        consumer = client.subscribe(topic, "kept", initial_position=pulsar.InitialPosition.Earliest)
        assert _persisted(data_dir, topic, "kept") is not None  # answered: its creation is durable
        consumer.seek(ids[6])  # answered once MD (5) is durable
        record = _persisted(data_dir, topic, "kept")
        assert (record.mark_delete_position.ledger_id, record.mark_delete_position.entry_id) == (
            ids[5].ledger_id(), ids[5].entry_id())
        serve.kill()
        client.close()
        serve = ServeProcess(data_dir, log_path)
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        again = client.subscribe(topic, "kept", initial_position=pulsar.InitialPosition.Latest)
        received = [again.receive(RECEIVE_MS).data() for _ in range(4)]
        assert received == [b"m6", b"m7", b"m8", b"m9"]  # the seek's position, not Latest
        client.close()
        assert serve.terminate() == 0, log_path.read_text()
    finally:
        serve.kill()


@pytest.mark.slow
def test_admin_writes_answered_off_the_loop_survive_kill_9(tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    namespace = "/admin/v2/namespaces/kept/ns"
    topic = "/admin/v2/persistent/kept/ns/created"
    serve = ServeProcess(data_dir, log_path)
    try:
        with httpx.Client(base_url=serve.http_url, timeout=10) as http:
            assert http.put("/admin/v2/tenants/kept", json={}).status_code == 204
            assert http.put(namespace).status_code == 204
            assert http.post(namespace + "/compactionThreshold", json=4096).status_code == 204
            assert http.post(namespace + "/permissions/reader", json=["consume"]).status_code == 204
            assert http.put(topic).status_code == 204
            assert http.post(topic + "/deduplicationEnabled", json=True).status_code == 204
            assert http.put("/admin/v2/persistent/kept/ns/parted/partitions", json=3).status_code == 204
            assert http.post("/admin/v2/schemas/kept/ns/created/schema",
                             json={"type": "STRING", "schema": "", "properties": {}}).status_code == 200
        serve.kill()  # every answer above came after its commit
        serve = ServeProcess(data_dir, log_path)
        with httpx.Client(base_url=serve.http_url, timeout=10) as http:
            assert http.get("/admin/v2/namespaces/kept").json() == ["kept/ns"]
            assert http.get(namespace + "/compactionThreshold").json() == 4096
            assert http.get(namespace + "/permissions").json() == {"reader": ["consume"]}
            assert "persistent://kept/ns/created" in http.get("/admin/v2/persistent/kept/ns").json()
            assert http.get(topic + "/deduplicationEnabled").json() is True
            assert http.get("/admin/v2/persistent/kept/ns/parted/partitions").json() == {"partitions": 3}
            assert http.get("/admin/v2/schemas/kept/ns/created/schema").json()["type"] == "STRING"
        assert serve.terminate() == 0, log_path.read_text()
    finally:
        serve.kill()
