"""The admin core: topics, persisted compaction status, policies, stats, the scheduler tick."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from api.broker.dedup import ProducerSession
from api.broker.errors import PreconditionFailedError, TopicExistsError, TopicNotFoundError
from api.broker.service import BrokerService
from api.config import Settings
from compactor.errors import CompactionInProgressError
from compactor.record import RunFigures
from compactor.runs.runs import RunJob
from ledger import DataDir
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/admin"


def broker_settings(**values: Any) -> Settings:
    """The broker's settings with the scheduler off and one run at a time, unless ``values`` say."""
    chosen: dict[str, Any] = {"compaction_monitor_interval_seconds": 0, "compaction_max_concurrent_runs": 1}
    return Settings(**(chosen | values))


def entry(key: str, value: bytes, publish_ms: int = 1) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=publish_ms, partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def publish(broker: BrokerService, topic: str, *pairs: tuple[str, bytes]) -> None:
    for key, value in pairs:
        broker.get_topic(topic).ledger.append(entry(key, value)).result(timeout=10)


async def _with_broker(path: Path, body, settings: Settings | None = None) -> None:  # type: ignore[no-untyped-def]
    data_dir = DataDir.open(str(path))
    broker = BrokerService(data_dir, settings or broker_settings())
    broker.loop = asyncio.get_running_loop()
    try:
        await body(broker)
    finally:
        await broker.stop()
        data_dir.close()


def test_topics_create_list_delete(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        admin = broker.admin
        assert await admin.create_topic("admin") == TOPIC
        with pytest.raises(TopicExistsError):
            await admin.create_topic(TOPIC)
        assert admin.list_topics("public/default") == [TOPIC]
        publish(broker, TOPIC, ("a", b"1"))
        broker.registry.loaded[TOPIC].attach_producer("p", "owner")
        with pytest.raises(PreconditionFailedError):
            await admin.delete_topic(TOPIC)
        broker.registry.loaded[TOPIC].detach_producer("p", "owner")
        await admin.delete_topic(TOPIC)
        assert admin.list_topics("public/default") == []
        assert broker.data_dir.ledgers.list() == []
        with pytest.raises(TopicNotFoundError):
            await admin.delete_topic(TOPIC)
        with pytest.raises(TopicNotFoundError):
            admin.compaction_status("missing")

    asyncio.run(_with_broker(tmp_path, body))


def test_compaction_status_is_persisted_across_restarts(tmp_path: Path) -> None:
    async def first(broker: BrokerService) -> None:
        admin = broker.admin
        await admin.create_topic(TOPIC)
        assert admin.compaction_status(TOPIC) == {"status": "NOT_RUN", "lastError": ""}
        publish(broker, TOPIC, ("a", b"1"), ("a", b"2"), ("b", b"1"))
        admin.trigger_compaction(TOPIC)
        assert admin.compaction_status(TOPIC)["status"] == "RUNNING"
        with pytest.raises(CompactionInProgressError, match="already in progress"):
            admin.trigger_compaction(TOPIC)
        await admin.wait_for_runs()
        assert admin.compaction_status(TOPIC) == {"status": "SUCCESS", "lastError": ""}
        stats = admin.internal_stats(TOPIC)
        assert stats["compactedLedger"]["entries"] == 2
        assert stats["cursors"]["__compaction"]["properties"] == {
            "CompactedTopicLedger": stats["compactedLedger"]["ledgerId"]}
        assert admin.stats(TOPIC)["compaction"]["lastCompactionRemovedEventCount"] == 1
        broker.data_dir.ledgers.delete(stats["compactedLedger"]["ledgerId"])  # breaks the next run
        publish(broker, TOPIC, ("c", b"1"))
        admin.trigger_compaction(TOPIC)
        await admin.wait_for_runs()
        assert admin.compaction_status(TOPIC)["status"] == "ERROR"
        assert "LedgerNotFoundError" in admin.compaction_status(TOPIC)["lastError"]
        broker.compaction_statuses.set_compaction_status(TOPIC, "RUNNING", "", 1)  # as if killed mid-run

    async def second(broker: BrokerService) -> None:
        status = broker.admin.compaction_status(TOPIC)
        assert status["status"] == "ERROR" and "stopped during the run" in status["lastError"]

    asyncio.run(_with_broker(tmp_path, first))
    asyncio.run(_with_broker(tmp_path, second))


def test_scheduler_tick_uses_policies_and_the_concurrency_limit(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        admin = broker.admin
        for name, size in (("small", 10), ("big", 300), ("mid", 100)):
            topic = f"persistent://public/default/{name}"
            await admin.create_topic(topic)
            publish(broker, topic, *((f"k{i}", b"x" * 10) for i in range(size // 10)))
        assert broker.scheduler_tick(now_ms=10).start == ()  # every threshold is off
        await admin.set_policy("public/default", "compactionThreshold", 50)
        await admin.set_policy(admin.topic_scope("persistent://public/default/mid"), "compactionThreshold", 0)
        plan = broker.scheduler_tick(now_ms=10)
        assert plan.start == ("persistent://public/default/big",)  # limit 1, largest backlog first
        assert plan.queued == ()  # mid is off at topic level, small is under the namespace threshold
        await admin.wait_for_runs()
        assert admin.compaction_status("persistent://public/default/big")["status"] == "SUCCESS"
        assert broker.scheduler_tick(now_ms=10).start == ()  # nothing new behind __compaction
        await admin.set_policy("public/default", "maxCompactionLagMs", 5)
        assert set(broker.scheduler_tick(now_ms=10).start + broker.last_plan.queued) == {
            "persistent://public/default/small", "persistent://public/default/mid"}
        await admin.wait_for_runs()

    asyncio.run(_with_broker(tmp_path, body, broker_settings(compaction_threshold_bytes=0, compaction_max_concurrent_runs=1)))


def test_delete_retention_policy_topic_over_namespace_and_its_runs(tmp_path: Path) -> None:
    """``deleteRetentionMs``: topic policy, else namespace policy, else 0 (Pulsar's drop);
    a run through the broker keeps a tombstone younger than it."""
    async def body(broker: BrokerService) -> None:
        admin = broker.admin
        await admin.create_topic(TOPIC)
        topic = broker.get_topic(TOPIC)
        assert broker.delete_retention_ms(topic) == 0
        await admin.set_policy("public/default", "deleteRetentionMs", 60_000)
        assert broker.delete_retention_ms(topic) == 60_000
        await admin.set_policy(TOPIC, "deleteRetentionMs", 3_600_000)
        assert broker.delete_retention_ms(topic) == 3_600_000
        now_ms = int(time.time() * 1000)
        for key, value in (("gone", b"1"), ("gone", b"")):
            topic.ledger.append(entry(key, value, publish_ms=now_ms)).result(timeout=10)
        await broker.compact(TOPIC)
        assert topic.compacted.view is not None and topic.compacted.view.entries == 1  # the tombstone
        await admin.remove_policy(TOPIC, "deleteRetentionMs")
        await admin.remove_policy("public/default", "deleteRetentionMs")
        topic.ledger.append(entry("other", b"x", publish_ms=now_ms)).result(timeout=10)
        await broker.compact(TOPIC)
        assert topic.compacted.view.entries == 1  # "other" only: the tombstone is dropped now
    asyncio.run(_with_broker(tmp_path, body))


OTHER = "persistent://public/default/other"
HOLD_S = 10.0  # the most a held run waits for its release


def hold_the_slot(broker: BrokerService, release: threading.Event) -> asyncio.Future[RunFigures]:
    """Start a real run of OTHER that waits in its worker thread until ``release`` (bounded)."""
    def progress(_phase: str, _done: int, _total: int) -> None:
        release.wait(HOLD_S)
    publish(broker, OTHER, ("a", b"1"))
    return broker.runs.request(RunJob(broker.get_topic(OTHER).compacted, progress=progress))


def test_a_topic_whose_run_waits_for_a_slot_is_not_deleted(tmp_path: Path) -> None:
    """A triggered run queued behind the concurrency limit counts as in progress."""
    async def body(broker: BrokerService) -> None:
        admin = broker.admin
        publish(broker, TOPIC, ("a", b"1"))
        release = threading.Event()
        holder = hold_the_slot(broker, release)  # the only slot (limit 1) is taken
        admin.trigger_compaction(TOPIC)
        assert broker.runs.in_flight(TOPIC) and not broker.runs.running(TOPIC)  # queued
        with pytest.raises(CompactionInProgressError):
            admin.trigger_compaction(TOPIC)
        with pytest.raises(CompactionInProgressError):
            await admin.delete_topic(TOPIC)
        release.set()
        await admin.wait_for_runs()
        assert holder.done() and admin.compaction_status(TOPIC)["status"] == "SUCCESS"
        await admin.delete_topic(TOPIC)
        assert admin.list_topics("public/default") == [OTHER]
    asyncio.run(_with_broker(tmp_path, body))


@pytest.mark.parametrize(("broker_default", "namespace", "topic", "expected"), [
    (False, None, None, False),
    (True, None, None, True),
    (False, True, None, True),
    (True, False, None, False),
    (False, False, True, True),
    (True, True, False, False),
])
def test_deduplication_is_topic_policy_then_namespace_policy_then_broker_setting(
        tmp_path: Path, broker_default: bool, namespace: bool | None, topic: bool | None, expected: bool) -> None:
    async def body(broker: BrokerService) -> None:
        admin = broker.admin
        await admin.create_topic(TOPIC)
        loaded = broker.get_topic(TOPIC)
        if namespace is not None:
            await admin.set_policy("public/default", "deduplicationEnabled", namespace)
        if topic is not None:
            await admin.set_policy(TOPIC, "deduplicationEnabled", topic)
        assert (loaded.dedup is not None) == expected  # applied to the loaded topic at once
        cursors = broker.cursors.list(TOPIC)
        assert ("pulsar.dedup" in cursors) == expected  # off: no cursor holds data back
        assert loaded.last_sequence_id("p") == -1

    asyncio.run(_with_broker(tmp_path, body, broker_settings(broker_deduplication_enabled=broker_default)))


def test_removing_the_policy_falls_back_and_turning_off_forgets_the_state(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        admin = broker.admin
        await admin.create_topic(TOPIC)
        await admin.set_policy(TOPIC, "deduplicationEnabled", True)
        topic = broker.get_topic(TOPIC)
        assert topic.dedup is not None
        await asyncio.wait_for(asyncio.wrap_future(topic.publish(ProducerSession(), "p", 3, 3, entry("k", b"v"))), 10)
        assert topic.last_sequence_id("p") == 3
        await admin.remove_policy(TOPIC, "deduplicationEnabled")
        assert topic.dedup is None and topic.last_sequence_id("p") == -1
        await admin.set_policy("public/default", "deduplicationEnabled", True)
        assert topic.dedup is not None and topic.last_sequence_id("p") == -1  # starts fresh, as Pulsar

    asyncio.run(_with_broker(tmp_path, body))
