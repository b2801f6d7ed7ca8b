"""The local engine in bounded memory (``compactor.local.rounds``): rounds within the budget.

* Agreement: over generated streams, compacting in rounds whose key map holds a few keys
  gives exactly ``compactor.local.algorithm.compact``'s entries, byte for byte (one round or many;
  in one run or several).
* Bounded: no round's key map, by its own accounting (``KeyMap.nbytes``), ever holds more
  than the budget's keys (or one entry's, when a single entry has more).
* The runner (full rewrites, ``incremental=False``: incremental rounds are
  ``test_incremental.py``'s): a run over a small budget publishes the unbounded run's compacted ledger,
  byte for byte, after several rounds; a crash or failure between rounds leaves the last
  round's view serving (real data dir, restart), and the next run converges.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.engine import KEY_MAP_BYTES_PER_KEY
from compactor.local import keymap
from compactor.local.algorithm import CompactedEntry, compact
from compactor.local.keymap import KeyMap, key_hash
from compactor.local.rounds import capacity_keys, round_phase_one, round_phase_two
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.view.topic import COMPACTION_SUBSCRIPTION, CompactedTopic
from cursor.store import CursorStore
from ledger import EARLIEST, SimulatedCrash
from ledger.managed_ledger import Entry
from ledger.position import Position
from tests.strategies import StreamEntry, entries_of, streams
from tests.unit.compactor.test_crash import (
    _OPENED,
    CONFIG,
    TOPIC,
    _append,
    _assert_converges,
    _assert_no_stray_ledgers,
    _assert_serves,
    _kill,
    _start,
    _workload,
)

PROPERTY = settings(max_examples=150, deadline=None)
PUBLISHED_AT = 1_700_000_000_000  # every generated entry's publish time
CUTOFFS = st.sampled_from([None, PUBLISHED_AT, PUBLISHED_AT + 1])  # retention: none, all young, none young


@pytest.fixture(autouse=True)
def _close_data_dirs() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def _keyed_updates(entry: StreamEntry) -> int:
    return sum(1 for _, message in entry.messages if message.key is not None)


def compact_in_rounds(
    raw: list[Entry], view: list[CompactedEntry], horizon: Position, *, capacity: int, retain_null_key: bool,
    cutoff: int | None, bytes_seen: list[int],
) -> tuple[list[CompactedEntry], Position, int]:
    """What the runner does, without storage: rounds from ``view`` (up to ``horizon``) until
    ``raw`` is covered; (the last view, its horizon, rounds). ``bytes_seen`` gets each
    round's largest key map."""
    rounds = 0
    while any(entry.position > horizon for entry in raw):
        clean = [Entry(entry.position, entry.data) for entry in view]
        dirty = [entry for entry in raw if entry.position > horizon]
        one = round_phase_one(iter(clean + dirty), horizon=horizon, capacity_keys=capacity,
                              keep_tombstones_since_ms=cutoff)
        stop = one.stop
        assert stop is not None and stop > horizon
        covered = [entry for entry in dirty if entry.position <= stop]
        view = list(round_phase_two(clean + covered, one, retain_null_key=retain_null_key,
                                    keep_tombstones_since_ms=cutoff))
        horizon, rounds = stop, rounds + 1
        bytes_seen.append(one.key_map_bytes_max)
    return view, horizon, rounds


@PROPERTY
@given(streams(max_size=40), st.integers(1, 6), st.booleans(), CUTOFFS, st.lists(st.integers(0, 40), max_size=3))
def test_compacting_in_rounds_of_a_small_key_map_gives_the_unbounded_compaction_byte_for_byte(
    stream: list[StreamEntry], capacity: int, retain_null_key: bool, cutoff: int | None, run_ends: list[int],
) -> None:
    raw = entries_of(stream)
    view: list[CompactedEntry] = []
    horizon = EARLIEST
    bytes_seen: list[int] = []
    with mock.patch.object(keymap, "BUFFER_UPDATES_MIN", 2):  # merges inside a round too
        for end in [*sorted(run_ends), len(raw)]:  # several runs, each appended to
            view, horizon, _ = compact_in_rounds(raw[:end], view, horizon, capacity=capacity,
                                                 retain_null_key=retain_null_key, cutoff=cutoff,
                                                 bytes_seen=bytes_seen)
    assert view == compact(raw, retain_null_key=retain_null_key, keep_tombstones_since_ms=cutoff)
    widest = max((_keyed_updates(entry) for entry in stream), default=0)
    assert max(bytes_seen, default=0) <= KEY_MAP_BYTES_PER_KEY * max(capacity, widest)


def _keyed(key: str, value: bytes) -> Entry:
    from message.encoder import encode_entry
    from message.proto import pulsar_api_pb2 as pb

    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return Entry(Position(0, 0), encode_entry(metadata, value, with_checksum=False))


def test_a_round_stops_where_its_key_map_fills_and_the_next_goes_on_from_there() -> None:
    raw = [Entry(Position(3, index), _keyed(f"k{index % 10}", b"v%d" % index).data) for index in range(30)]
    bytes_seen: list[int] = []
    view, horizon, rounds = compact_in_rounds(raw, [], EARLIEST, capacity=3, retain_null_key=False, cutoff=None,
                                              bytes_seen=bytes_seen)
    assert rounds == 10 and horizon == Position(3, 29)  # 30 writes of 10 keys, 3 a round
    assert max(bytes_seen) == 3 * KEY_MAP_BYTES_PER_KEY
    assert view == compact(raw)
    assert [entry.position.entry_id for entry in view] == list(range(20, 30))


def test_the_budget_gives_the_keys_of_a_round() -> None:
    assert [capacity_keys(budget) for budget in (0, 23, 24, 100, 1 << 30)] == [1, 1, 1, 4, (1 << 30) // 24]


# -- the runner --------------------------------------------------------------------------------


def _read_view(topic: CompactedTopic) -> list[tuple[int, bytes, int, tuple[int, ...]]]:
    """The published view's entries, each position as its index among the raw entries (the
    two data dirs give their ledgers different ids: rounds take ids of their own)."""
    view = topic.view
    assert view is not None
    raw = topic.ledger.read_entries(topic.ledger.first_position(), 100_000)
    index = {entry.position: number for number, entry in enumerate(raw)}
    return [(index[entry.position], entry.data, entry.batch_size, entry.surviving) for entry in view.iter_all()]


def test_a_run_over_a_small_budget_publishes_the_unbounded_runs_ledger_in_several_rounds(tmp_path: Path) -> None:
    budget = 4 * KEY_MAP_BYTES_PER_KEY
    published = {}
    for name, config in (("bounded", CompactionConfig(engine="local", incremental=False, read_batch_entries=4, memory_budget_bytes=budget)),
                         ("unbounded", CONFIG)):
        broker = _start(tmp_path / name)
        figures = []
        for seed in (1, 2):  # a second run builds on the first one's view
            _append(broker.ledger, _workload(seed, 40))
            figures.append(Compactor(config).compact(broker.topic))
            _assert_serves(broker.topic, broker.ledger.last_confirmed_position())
        published[name] = (_read_view(broker.topic), figures)
        _assert_no_stray_ledgers(broker)  # each round deleted the view it replaced
        broker.data_dir.close()
    assert published["bounded"][0] == published["unbounded"][0]
    bounded, unbounded = published["bounded"][1], published["unbounded"][1]
    assert all(run.rounds > 1 and run.key_map_bytes <= budget for run in bounded)
    assert all(run.rounds == 1 for run in unbounded)
    for bounded_run, unbounded_run in zip(bounded, unbounded, strict=True):
        assert (bounded_run.keys_kept, bounded_run.removed_events, bounded_run.entries_written) == (
            unbounded_run.keys_kept, unbounded_run.removed_events, unbounded_run.entries_written)


class _CrashInRound:
    """A progress callback that crashes when ``phase`` starts for the ``round``-th time."""

    def __init__(self, phase: str, round_: int, error: BaseException) -> None:
        self.phase, self.round, self.error, self.starts = phase, round_, error, 0

    def __call__(self, phase: str, done: int, _total: int) -> None:
        if phase == self.phase and done == 0:
            self.starts += 1
            if self.starts == self.round:
                raise self.error


@pytest.mark.parametrize("phase", ["phase-one", "phase-two"])
def test_a_crash_between_rounds_leaves_the_last_rounds_view_serving_and_the_next_run_converges(
    tmp_path: Path, phase: str,
) -> None:
    broker = _start(tmp_path)
    _append(broker.ledger, _workload(1, 40))
    stop = broker.ledger.last_confirmed_position()
    ledgers_before = set(broker.data_dir.ledgers.list())
    config = CompactionConfig(engine="local", incremental=False, read_batch_entries=4, memory_budget_bytes=4 * KEY_MAP_BYTES_PER_KEY)
    with pytest.raises(SimulatedCrash):
        Compactor(config).compact(broker.topic, progress=_CrashInRound(phase, 2, SimulatedCrash("round 2")))
    created = set(broker.data_dir.ledgers.list()) - ledgers_before
    _kill(broker)

    restarted = _start(tmp_path)
    record = CursorStore(restarted.data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION)
    assert record is not None
    horizon = record.mark_delete_position
    assert EARLIEST < horizon < stop  # round one published, round two did not
    view = restarted.topic.view
    assert view is not None and view.ledger_id in created
    assert restarted.orphans == sorted(created - {view.ledger_id})  # round two's unpublished ledger, if any
    assert len(restarted.orphans) == (1 if phase == "phase-two" else 0)
    _assert_serves(restarted.topic, horizon)
    _assert_no_stray_ledgers(restarted)
    _assert_converges(restarted, tmp_path)


def test_a_failure_in_a_later_round_fails_the_run_and_keeps_the_earlier_rounds_view(tmp_path: Path) -> None:
    broker = _start(tmp_path)
    _append(broker.ledger, _workload(1, 40))
    stop = broker.ledger.last_confirmed_position()
    config = CompactionConfig(engine="local", incremental=False, read_batch_entries=4, memory_budget_bytes=4 * KEY_MAP_BYTES_PER_KEY)
    with pytest.raises(RuntimeError, match="round 3"):
        Compactor(config).compact(broker.topic, progress=_CrashInRound("phase-two", 3, RuntimeError("round 3")))
    assert broker.topic.record.failures == 1
    view = broker.topic.view
    assert view is not None and view.horizon < stop
    _assert_serves(broker.topic, view.horizon)
    _assert_no_stray_ledgers(broker)  # the failed round deleted its ledger
    figures = Compactor(config).compact(broker.topic)
    assert figures.rounds >= 1 and figures.horizon == str(stop)
    _assert_serves(broker.topic, stop)
    broker.data_dir.close()


def test_a_key_map_that_keeps_deletes_tells_them_apart_from_live_keys_and_counts_its_peak() -> None:
    key_map = KeyMap(keep_deleted=True)
    a, b, c = key_hash("a"), key_hash("b"), key_hash("c")
    key_map.put(a, 5)
    key_map.put(b, 7)
    key_map.delete(a)
    assert key_map.keys_bound == 3 and key_map.nbytes == 3 * KEY_MAP_BYTES_PER_KEY  # buffered, not merged
    assert (len(key_map), key_map.live_keys()) == (2, 1)  # a is deleted, still held
    assert key_map.holds(a) and key_map.holds(b) and not key_map.holds(c)
    assert key_map.sorted_positions().tolist() == [7]
    assert key_map.nbytes == 2 * KEY_MAP_BYTES_PER_KEY and key_map.nbytes_max == 3 * KEY_MAP_BYTES_PER_KEY
    plain = KeyMap()
    plain.put(a, 5)
    plain.delete(a)
    assert len(plain) == 0 and not plain.holds(a)
