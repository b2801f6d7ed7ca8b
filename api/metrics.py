"""Prometheus metrics of compaction, what ``GET /metrics`` serves.

``render`` also serves Pulsar's topic, subscription and broker families
(``api.metrics_topics.TopicCollector``) and the process's own (``process_*``:
prometheus-client's ``ProcessCollector``: CPU seconds, resident memory, open descriptors).

``render(broker)`` collects at scrape time from the broker's loaded topics (call it on the
broker's loop): nothing is copied into ``prometheus-client`` metric objects in between, so
the figures cannot drift from the stats and status the REST API answers.

Pulsar's family (reference ``pulsar-compaction.md`` §4), per topic, only for topics that
have a compaction record (a run since the topic was loaded), labels ``cluster``,
``namespace``, ``topic``:

* ``pulsar_compaction_removed_event_count``, ``_succeed_count``, ``_failed_count``,
  ``_duration_time_in_mills`` (cumulative), ``_read_throughput`` and
  ``_write_throughput`` (bytes/s of the last successful run),
  ``_latency_le_0_5`` … ``_latency_le_1000`` and ``_latency_le_overflow`` (appends to the
  compacted ledger per latency bucket, not cumulative, as Pulsar exposes them), and
  ``_compacted_entries_count`` / ``_compacted_entries_size`` (the served compacted ledger).

compactd's own, beyond Pulsar:

* ``compactd_compaction_runs_queued``: runs waiting for a slot under
  ``compaction_max_concurrent_runs`` (runs queued in the broker's run executor, plus topics
  the scheduler found due but deferred); ``compactd_compaction_runs_running`` (runs holding
  a slot); both read from the executor, ``BrokerService.runs``.
* per topic, of the last successful run: ``compactd_compaction_phase_one_seconds``,
  ``compactd_compaction_phase_two_seconds``, ``compactd_compaction_key_map_bytes``
  (phase one's map at its end) and ``compactd_compaction_throttled_seconds`` (time waited
  on its ``compactionMaxBytesPerSecond``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from api.metrics_topics import TopicCollector
from compactor.record import LATENCY_BUCKETS_MS

if TYPE_CHECKING:
    from api.broker.service import BrokerService
    from api.broker.topic import Topic

__all__ = ["CompactionCollector", "render"]

LABELS = ("cluster", "namespace", "topic")


def _bucket_name(bound: float) -> str:
    return f"pulsar_compaction_latency_le_{str(bound).replace('.', '_')}"


class CompactionCollector(Collector):
    """Reads the broker's compaction records at each collection."""

    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    def collect(self) -> Iterator[GaugeMetricFamily]:
        topics = self.broker.registry.loaded_topics()
        yield from self._broker_wide()
        families = self._families()
        for topic in topics:
            record = topic.compacted.record
            if record.successes + record.failures == 0:
                continue
            labels = [self.broker.settings.cluster_name,
                      topic.name.namespace_name, str(topic.name)]
            last = record.last_run
            seconds = last.duration_s if last is not None and last.duration_s > 0 else 0.0
            entries, size = self._compacted(topic)
            values: dict[str, float] = {
                "pulsar_compaction_removed_event_count": record.total_removed_events,
                "pulsar_compaction_succeed_count": record.successes,
                "pulsar_compaction_failed_count": record.failures,
                "pulsar_compaction_duration_time_in_mills": record.total_duration_ms,
                "pulsar_compaction_read_throughput": last.bytes_read / seconds if last and seconds else 0.0,
                "pulsar_compaction_write_throughput": last.bytes_written / seconds if last and seconds else 0.0,
                "pulsar_compaction_compacted_entries_count": entries,
                "pulsar_compaction_compacted_entries_size": size,
                "compactd_compaction_phase_one_seconds": last.phase_one_s if last else 0.0,
                "compactd_compaction_phase_two_seconds": last.phase_two_s if last else 0.0,
                "compactd_compaction_key_map_bytes": last.key_map_bytes if last else 0,
                "compactd_compaction_throttled_seconds": last.throttled_s if last else 0.0,
            }
            bounds = [_bucket_name(b) for b in LATENCY_BUCKETS_MS] + ["pulsar_compaction_latency_le_overflow"]
            values.update(zip(bounds, record.append_latency_counts, strict=True))
            for name, value in values.items():
                families[name].add_metric(labels, float(value))
        yield from families.values()

    def _broker_wide(self) -> Iterator[GaugeMetricFamily]:
        queued = self.broker.runs.queued_count + len(self.broker.last_plan.queued)
        yield GaugeMetricFamily("compactd_compaction_runs_queued",
                                "Compaction runs waiting for a slot under the concurrency limit.", value=queued)
        running = self.broker.runs.running_count
        yield GaugeMetricFamily("compactd_compaction_runs_running", "Compaction runs in progress.", value=running)

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        described = {
            "pulsar_compaction_removed_event_count": "Messages removed by compaction, in total.",
            "pulsar_compaction_succeed_count": "Successful compaction runs.",
            "pulsar_compaction_failed_count": "Failed compaction runs.",
            "pulsar_compaction_duration_time_in_mills": "Time spent in compaction runs, in total (ms).",
            "pulsar_compaction_read_throughput": "Bytes per second read by the last successful run.",
            "pulsar_compaction_write_throughput": "Bytes per second written by the last successful run.",
            "pulsar_compaction_compacted_entries_count": "Entries in the served compacted ledger.",
            "pulsar_compaction_compacted_entries_size": "Bytes of the served compacted ledger.",
            "compactd_compaction_phase_one_seconds": "Phase one of the last successful run (s).",
            "compactd_compaction_phase_two_seconds": "Phase two (and publishing) of the last successful run (s).",
            "compactd_compaction_key_map_bytes": "Phase one's key map at the end of the last successful run.",
            "compactd_compaction_throttled_seconds": "Time the last successful run waited on its I/O limit (s).",
        }
        for bound in LATENCY_BUCKETS_MS:
            described[_bucket_name(bound)] = f"Compacted-ledger appends that took at most {bound} ms (and more than the bucket below)."
        described["pulsar_compaction_latency_le_overflow"] = f"Compacted-ledger appends over {LATENCY_BUCKETS_MS[-1]} ms."
        return {name: GaugeMetricFamily(name, text, labels=LABELS) for name, text in described.items()}

    @staticmethod
    def _compacted(topic: Topic) -> tuple[int, int]:
        view = topic.compacted.view if topic.compacted.broken is None else None
        return (0, 0) if view is None else (view.entries, view.size)


def render(broker: BrokerService) -> tuple[bytes, str]:
    """The Prometheus text exposition of ``broker``'s compaction metrics, and its media type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CompactionCollector(broker))
    registry.register(TopicCollector(broker))
    ProcessCollector(registry=registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST
