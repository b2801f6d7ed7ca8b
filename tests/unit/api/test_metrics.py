"""``api.metrics``: the pulsar_compaction_* family and compactd's own, read from the records."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from api.broker.service import BrokerService
from api.metrics import render
from compactor.record import LATENCY_BUCKETS_MS
from tests.unit.api.broker.test_admin import _with_broker, hold_the_slot, publish

TOPIC = "persistent://public/default/metrics"
IDLE = "persistent://public/default/idle"


def scrape(broker: BrokerService) -> dict[tuple[str, str], float]:
    """(metric name, topic label or "") -> value."""
    body, content_type = render(broker)
    assert content_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("topic", ""))] = sample.value
    return samples


def test_metrics_follow_the_records_and_skip_topics_never_compacted(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        publish(broker, TOPIC, ("a", b"1"), ("a", b"2"), ("b", b"1"), ("c", b"1"), ("c", b""))
        publish(broker, IDLE, ("a", b"1"))
        assert scrape(broker)[("compactd_compaction_runs_running", "")] == 0
        figures = await broker.compact(TOPIC)
        samples = scrape(broker)
        # never compacted: no compaction series, as Pulsar (issue 16's topic families cover
        # every loaded topic, so only the compaction family is checked here)
        assert not any(topic == IDLE for name, topic in samples if name.startswith("pulsar_compaction_"))
        record = broker.registry.loaded[TOPIC].compacted.record
        assert samples[("pulsar_compaction_removed_event_count", TOPIC)] == figures.removed_events == 3
        assert samples[("pulsar_compaction_succeed_count", TOPIC)] == 1
        assert samples[("pulsar_compaction_failed_count", TOPIC)] == 0
        assert samples[("pulsar_compaction_duration_time_in_mills", TOPIC)] == record.total_duration_ms
        assert samples[("pulsar_compaction_compacted_entries_count", TOPIC)] == figures.entries_written == 2
        assert samples[("pulsar_compaction_compacted_entries_size", TOPIC)] == figures.bytes_written > 0
        assert samples[("pulsar_compaction_read_throughput", TOPIC)] > 0
        assert samples[("compactd_compaction_key_map_bytes", TOPIC)] == figures.key_map_bytes > 0
        assert samples[("compactd_compaction_phase_one_seconds", TOPIC)] == figures.phase_one_s
        buckets = [f"pulsar_compaction_latency_le_{str(b).replace('.', '_')}" for b in LATENCY_BUCKETS_MS]
        appends = sum(samples[(name, TOPIC)] for name in [*buckets, "pulsar_compaction_latency_le_overflow"])
        assert appends == figures.entries_written
        await broker.compact(TOPIC)  # nothing new: a second success
        assert scrape(broker)[("pulsar_compaction_succeed_count", TOPIC)] == 2
    asyncio.run(_with_broker(tmp_path, body))


def test_runs_waiting_for_the_concurrency_limit_are_counted_as_queued(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        publish(broker, TOPIC, ("a", b"1"))
        release = threading.Event()
        holder = hold_the_slot(broker, release)  # the only slot (limit 1) is taken
        waiting = asyncio.create_task(broker.compact(TOPIC))
        async with asyncio.timeout(30):
            while not broker.runs.in_flight(TOPIC):
                await asyncio.sleep(0.01)
        samples = scrape(broker)
        assert samples[("compactd_compaction_runs_queued", "")] == 1
        assert samples[("compactd_compaction_runs_running", "")] == 1
        release.set()
        await asyncio.wait_for(waiting, 30)
        assert holder.done()
        assert scrape(broker)[("compactd_compaction_runs_queued", "")] == 0
    asyncio.run(_with_broker(tmp_path, body))
