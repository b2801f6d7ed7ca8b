"""The scheduler's pure decisions, as tables."""

from __future__ import annotations

import pytest

from compactor.runs.scheduler import (
    CompactionPolicy,
    Plan,
    TopicCompactionStats,
    effective_threshold,
    plan,
    should_compact,
)

NOW = 1_000_000


@pytest.mark.parametrize(
    "topic,namespace,broker,expected",
    [
        (None, None, 0, 0),
        (None, None, 100, 100),
        (None, 50, 100, 50),
        (10, 50, 100, 10),
        (0, 50, 100, 0),  # a topic policy of 0 switches compaction off for that topic
        (None, 0, 100, 0),
    ],
)
def test_threshold_precedence_topic_then_namespace_then_broker(
    topic: int | None, namespace: int | None, broker: int, expected: int
) -> None:
    assert effective_threshold(topic, namespace, broker) == expected


@pytest.mark.parametrize(
    "stats,policy,due",
    [
        (TopicCompactionStats("t", 100), CompactionPolicy(0), False),  # off
        (TopicCompactionStats("t", 100), CompactionPolicy(100), False),  # not above
        (TopicCompactionStats("t", 101), CompactionPolicy(100), True),
        (TopicCompactionStats("t", 101, running=True), CompactionPolicy(100), False),  # in flight
        (TopicCompactionStats("t", 0), CompactionPolicy(-1, 0.1, 1), False),  # nothing to do
        (TopicCompactionStats("t", 50, compacted_bytes=50), CompactionPolicy(0, 0.5), True),
        (TopicCompactionStats("t", 49, compacted_bytes=51), CompactionPolicy(0, 0.5), False),
        (TopicCompactionStats("t", 1, compacted_bytes=0), CompactionPolicy(0, 0.99), True),
        (TopicCompactionStats("t", 10, oldest_uncompacted_publish_ms=NOW - 60_000),
         CompactionPolicy(0, None, 60_000), True),
        (TopicCompactionStats("t", 10, oldest_uncompacted_publish_ms=NOW - 59_999),
         CompactionPolicy(0, None, 60_000), False),
        (TopicCompactionStats("t", 10, oldest_uncompacted_publish_ms=None),
         CompactionPolicy(0, None, 60_000), False),
        (TopicCompactionStats("t", 10, oldest_uncompacted_publish_ms=0), CompactionPolicy(0, None, 0), False),
    ],
)
def test_should_compact(stats: TopicCompactionStats, policy: CompactionPolicy, due: bool) -> None:
    assert should_compact(stats, policy, NOW) is due


def test_plan_starts_largest_backlogs_first_within_the_limit() -> None:
    policy = CompactionPolicy(10)
    topics = [
        (TopicCompactionStats("small", 20), policy),
        (TopicCompactionStats("big", 900), policy),
        (TopicCompactionStats("idle", 5), policy),
        (TopicCompactionStats("mid", 300), policy),
        (TopicCompactionStats("busy", 5000, running=True), policy),
    ]
    assert plan(topics, now_ms=NOW, running_runs=1, max_concurrent_runs=3) == Plan(("big", "mid"), ("small",))
    assert plan(topics, now_ms=NOW, running_runs=3, max_concurrent_runs=3) == Plan((), ("big", "mid", "small"))
    assert plan([], now_ms=NOW, running_runs=0, max_concurrent_runs=2) == Plan()
