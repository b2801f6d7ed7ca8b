"""When to compact: the scheduler's decisions, as pure functions over plain values.

Every ``compaction_monitor_interval_seconds`` the broker builds one ``TopicCompactionStats``
per loaded topic and asks ``plan`` which runs to start. The rules (reference
``pulsar-compaction.md`` §3.1, and Kafka's cleaner for the two additions):

1. The effective threshold is the topic policy, else the namespace policy, else the broker
   default (``effective_threshold``); 0 or less means "off".
2. The backlog is Pulsar's estimate: the bytes behind the topic's ``__compaction`` cursor
   (``CompactedTopic.cursor``, the one the runs move).
3. A topic is due (``should_compact``) when no run of it is in flight and any trigger fires:
   * the threshold: backlog > threshold;
   * Kafka's ``minCleanableDirtyRatio``: backlog / (backlog + compacted bytes) ≥ the ratio;
   * Kafka's ``maxCompactionLagMs``: the oldest message not yet compacted was published at
     least that long ago;
   unless Kafka's ``minCompactionLagMs`` holds everything back: the oldest message not yet
   compacted is younger than that lag, so a run would stop before it (``compactor.runs.lag``)
   and compact nothing.
4. At most ``max_concurrent_runs`` runs at once per broker: due topics start largest backlog
   first; the rest are queued for the next tick (Pulsar has no limit, see its #7223).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CompactionPolicy", "Plan", "TopicCompactionStats", "effective_threshold", "plan", "should_compact"]


@dataclass(frozen=True, slots=True)
class TopicCompactionStats:
    """What the scheduler knows of one topic at one tick.

    Attributes:
        topic: the topic's name.
        backlog_bytes: bytes not yet compacted (see rule 2).
        compacted_bytes: size of the current compacted ledger (Kafka's "clean" bytes).
        oldest_uncompacted_publish_ms: publish time of the first message after the horizon,
            or None when there is none.
        running: a run of this topic is queued or running (``CompactionRuns.in_flight``).
    """

    topic: str
    backlog_bytes: int
    compacted_bytes: int = 0
    oldest_uncompacted_publish_ms: int | None = None
    running: bool = False


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """The triggers in force for one topic; None or ≤ 0 switches one off."""

    threshold_bytes: int = 0
    min_cleanable_dirty_ratio: float | None = None
    max_compaction_lag_ms: int | None = None
    min_compaction_lag_ms: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """One tick's decision: topics to start now, and due topics left for a later tick."""

    start: tuple[str, ...] = ()
    queued: tuple[str, ...] = ()


def effective_threshold(topic_policy: int | None, namespace_policy: int | None, broker_default: int) -> int:
    """Topic policy, else namespace policy, else the broker default (bytes; ≤ 0 = off)."""
    if topic_policy is not None:
        return topic_policy
    if namespace_policy is not None:
        return namespace_policy
    return broker_default


def should_compact(stats: TopicCompactionStats, policy: CompactionPolicy, now_ms: int) -> bool:
    """Rule 3: is ``stats.topic`` due for a run at ``now_ms``?"""
    if stats.running or stats.backlog_bytes <= 0:
        return False
    oldest = stats.oldest_uncompacted_publish_ms
    if policy.min_compaction_lag_ms > 0 and oldest is not None and now_ms - oldest < policy.min_compaction_lag_ms:
        return False  # the first message a run would take is young: it would compact nothing
    if policy.threshold_bytes > 0 and stats.backlog_bytes > policy.threshold_bytes:
        return True
    ratio = policy.min_cleanable_dirty_ratio
    if ratio is not None and ratio > 0:
        dirty = stats.backlog_bytes / (stats.backlog_bytes + stats.compacted_bytes)
        if dirty >= ratio:
            return True
    lag = policy.max_compaction_lag_ms
    return lag is not None and lag > 0 and oldest is not None and now_ms - oldest >= lag


def plan(
    topics: Iterable[tuple[TopicCompactionStats, CompactionPolicy]], *, now_ms: int,
    running_runs: int, max_concurrent_runs: int,
) -> Plan:
    """Rule 4: which due topics start now (largest backlog first) and which wait."""
    due = [stats for stats, policy in topics if should_compact(stats, policy, now_ms)]
    due.sort(key=lambda stats: (-stats.backlog_bytes, stats.topic))
    free = max(0, max_concurrent_runs - running_runs)
    return Plan(start=tuple(s.topic for s in due[:free]), queued=tuple(s.topic for s in due[free:]))
