"""The minimum compaction lag (``minCompactionLagMs``): a run never compacts a young message.

The pure core (``compactor.runs.lag``) against a model over generated publish times, then the
runner with a fake clock over a real managed ledger: its horizon stops before the first
entry published within the lag, older entries are compacted as before, and a later run,
once the clock has moved on, covers what aged. Last, the scheduler does not start a run
that the lag would leave with nothing to compact.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.local.algorithm import CompactedEntry, compact
from compactor.runs.lag import stop_before_young, young_after
from compactor.runs.runner import Compactor
from compactor.runs.scheduler import CompactionPolicy, TopicCompactionStats, should_compact
from compactor.view.topic import CompactedTopic
from cursor import CursorStore
from ledger import ManagedLedger, ManagedLedgerConfig, MemoryLedgerStore, MetadataStore
from ledger.position import Position
from message.encoder import encode_entry
from message.entry import iter_messages, parse_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/lag"
HORIZON = Position(0, -1)


@given(st.lists(st.integers(0, 100), max_size=30), st.integers(0, 100), st.integers(-5, 60))
def test_the_stop_is_the_entry_before_the_first_young_one(times: list[int], now: int, lag: int) -> None:
    entries = [(Position(1, index), publish_time) for index, publish_time in enumerate(times)]
    cutoff = young_after(now, lag)
    stop = stop_before_young(entries, cutoff, horizon=HORIZON)
    covered = [time for position, time in entries if position <= stop]
    if lag <= 0:
        assert cutoff is None and covered == times  # the lag is off: everything is covered
        return
    assert all(now - time >= lag for time in covered)  # no young message is covered
    if len(covered) < len(times):
        assert now - times[len(covered)] < lag  # it stopped at a young one, not earlier


def test_a_message_exactly_the_lag_old_is_not_young() -> None:
    entries = [(Position(1, 0), 50), (Position(1, 1), 51)]
    assert stop_before_young(entries, young_after(60, 10), horizon=HORIZON) == Position(1, 0)
    assert stop_before_young(entries, young_after(60, 9), horizon=HORIZON) == Position(1, 1)
    assert stop_before_young(entries, young_after(60, 20), horizon=HORIZON) == HORIZON


def test_an_old_entry_after_a_young_one_waits_too() -> None:
    """Publish times of different producers interleave: the first young entry ends the run."""
    entries = [(Position(1, 0), 10), (Position(1, 1), 95), (Position(1, 2), 10)]
    assert stop_before_young(entries, young_after(100, 30), horizon=HORIZON) == Position(1, 0)


# -- the runner, with a fake clock ---------------------------------------------------------


def published_at(key: str, value: bytes, publish_time_ms: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=publish_time_ms,
                                  partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def values(entries: list[CompactedEntry]) -> list[tuple[str | None, bytes]]:
    return [(m.key, m.payload) for entry in entries for m in iter_messages(parse_entry(entry.data))]


def topic_with(*datas: bytes) -> CompactedTopic:
    ml = ManagedLedger.open(TOPIC, MemoryLedgerStore(), MetadataStore(":memory:"),
                            ManagedLedgerConfig(max_entries_per_ledger=2))
    for data in datas:
        ml.append(data).result(timeout=10)
    return CompactedTopic.restore(ml, CursorStore(ml.metadata.database))


def test_a_run_leaves_the_messages_within_the_lag_uncompacted() -> None:
    now = [100.0]  # seconds, the runner's clock
    compactor = Compactor(clock=lambda: now[0])
    topic = topic_with(published_at("k", b"1", 10_000), published_at("k", b"2", 20_000),
                       published_at("j", b"1", 30_000), published_at("k", b"3", 95_000),
                       published_at("k", b"4", 96_000))
    positions = [entry.position for entry in topic.ledger.read_entries(Position(0, 0), 10)]
    figures = compactor.compact(topic, min_compaction_lag_ms=10_000)  # young: published after 90 s
    assert topic.horizon == positions[2]
    assert figures.horizon == str(positions[2])
    assert values(list(topic.view.iter_all())) == [("k", b"2"), ("j", b"1")]  # type: ignore[union-attr]
    assert figures.removed_events == 1  # k=1, replaced by k=2 outside the lag
    # k=3 and k=4 are still in the raw topic, after the horizon: a consumer behind by less
    # than the lag sees both updates.
    assert [e.position for e in topic.ledger.read_entries(topic.ledger.next_valid_position(positions[2]), 10)] \
        == positions[3:]
    now[0] = 200.0  # everything is older than the lag now
    compactor.compact(topic, min_compaction_lag_ms=10_000)
    assert topic.horizon == positions[-1]
    assert values(list(topic.view.iter_all())) == [("j", b"1"), ("k", b"4")]  # type: ignore[union-attr]


def test_a_run_whose_first_new_message_is_young_publishes_nothing() -> None:
    topic = topic_with(published_at("k", b"1", 99_000))
    figures = Compactor(clock=lambda: 100.0).compact(topic, min_compaction_lag_ms=5_000)
    assert figures.ledger_id == -1 and topic.view is None
    assert figures.horizon == str(topic.cursor.mark_delete_position)


def test_a_zero_lag_compacts_everything_as_before() -> None:
    topic = topic_with(published_at("k", b"1", 99_000), published_at("k", b"2", 10**12))  # even "from the future"
    Compactor(clock=lambda: 100.0).compact(topic, min_compaction_lag_ms=0)
    assert values(list(topic.view.iter_all())) == [("k", b"2")]  # type: ignore[union-attr]


# -- the scheduler: a topic whose oldest uncompacted message is young is not due -----------------


NOW = 1_000_000


def test_the_scheduler_skips_a_topic_whose_whole_backlog_is_within_the_lag() -> None:
    young = TopicCompactionStats("t", 500, oldest_uncompacted_publish_ms=NOW - 59_999)
    aged = TopicCompactionStats("t", 500, oldest_uncompacted_publish_ms=NOW - 60_000)
    assert should_compact(young, CompactionPolicy(100), NOW)  # no lag: the threshold fires
    assert not should_compact(young, CompactionPolicy(100, min_compaction_lag_ms=60_000), NOW)
    assert not should_compact(young, CompactionPolicy(0, None, 1, min_compaction_lag_ms=60_000), NOW)
    assert should_compact(aged, CompactionPolicy(100, min_compaction_lag_ms=60_000), NOW)


# -- the runner against the reference, over generated topics -------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 30)), min_size=1, max_size=12),
       st.integers(0, 40))
def test_a_run_compacts_exactly_the_entries_before_the_first_young_one(
    stream: list[tuple[str, int]], lag_s: int,
) -> None:
    """Publish times in seconds, out of order across "producers"; the clock at 30 s."""
    datas = [published_at(key, b"%d" % index, seconds * 1000) for index, (key, seconds) in enumerate(stream)]
    topic = topic_with(*datas)
    entries = topic.ledger.read_entries(Position(0, 0), 100)
    young = [index for index, (_, seconds) in enumerate(stream) if seconds * 1000 > 30_000 - lag_s * 1000]
    covered = young[0] if lag_s and young else len(stream)  # entries the run may compact
    figures = Compactor(clock=lambda: 30.0).compact(topic, min_compaction_lag_ms=lag_s * 1000)
    if covered == 0:
        assert figures.ledger_id == -1 and topic.view is None
        return
    assert topic.horizon == entries[covered - 1].position
    assert values(list(topic.view.iter_all())) == values(compact(entries[:covered]))  # type: ignore[union-attr]
    # Nothing at or after the first young entry was read into the run.
    assert figures.entries_read == covered
