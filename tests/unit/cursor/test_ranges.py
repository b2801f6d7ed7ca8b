"""``AckedRanges`` against a plain set of ``(ledger_id, entry_id)`` pairs.

The set is the model: every operation of ``AckedRanges`` has a one-line meaning over it
(membership, "forget everything at or before", "count in a half-open interval"), and the
runs must be exactly the maximal consecutive stretches of the set inside each ledger.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from cursor.ranges import AckedRanges
from ledger.position import Position

# Few ledgers and short ledgers, so that adds collide, merge and touch run ends often.
ledger_ids = st.integers(min_value=1, max_value=4)
entry_ids = st.integers(min_value=0, max_value=12)
positions = st.builds(Position, ledger_ids, entry_ids)
# Bounds for drop_through / count_between may also be "(L, -1)" or in an unused ledger.
bounds = st.builds(Position, st.integers(min_value=0, max_value=5), st.integers(min_value=-1, max_value=13))


def model_runs(model: set[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The maximal runs of consecutive entry ids per ledger, ascending."""
    runs: list[tuple[int, int, int]] = []
    for ledger_id, entry_id in sorted(model):
        if runs and runs[-1][0] == ledger_id and runs[-1][2] == entry_id - 1:
            runs[-1] = (ledger_id, runs[-1][1], entry_id)
        else:
            runs.append((ledger_id, entry_id, entry_id))
    return runs


def key(position: Position) -> tuple[int, int]:
    return (position.ledger_id, position.entry_id)


def assert_agrees(ranges: AckedRanges, model: set[tuple[int, int]]) -> None:
    runs = list(ranges.runs())
    assert runs == model_runs(model)
    assert len(ranges) == len(runs)
    # disjoint, sorted, and never two adjacent runs in one ledger (they would have merged)
    for (ledger_a, first_a, last_a), (ledger_b, first_b, _) in itertools.pairwise(runs):
        assert (ledger_a, last_a) < (ledger_b, first_b)
        if ledger_a == ledger_b:
            assert first_b > last_a + 1
        assert first_a <= last_a
    for ledger_id, first, last in runs:
        assert ranges.run_containing(Position(ledger_id, first)) == (first, last)
        assert ranges.run_containing(Position(ledger_id, last)) == (first, last)
        assert Position(ledger_id, first - 1) not in ranges
        assert Position(ledger_id, last + 1) not in ranges


class AckedRangesMachine(RuleBasedStateMachine):
    """Random adds, drops and queries on ``AckedRanges`` and on a set, which must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.ranges = AckedRanges()
        self.model: set[tuple[int, int]] = set()

    @rule(position=positions)
    def add(self, position: Position) -> None:
        self.ranges.add(position)
        self.model.add(key(position))

    @rule(position=positions)
    def add_with_batch_index(self, position: Position) -> None:
        """A batch index is ignored for membership: ranges hold whole entries."""
        self.ranges.add(position)
        self.model.add(key(position))
        assert position.with_batch_index(3) in self.ranges

    @rule(position=bounds)
    def drop_through(self, position: Position) -> None:
        self.ranges.drop_through(position)
        self.model = {item for item in self.model if item > key(position)}

    @rule(position=positions)
    def contains(self, position: Position) -> None:
        assert (position in self.ranges) == (key(position) in self.model)
        run = self.ranges.run_containing(position)
        assert (run is not None) == (key(position) in self.model)

    @rule(after=bounds, upto=bounds)
    def count_between(self, after: Position, upto: Position) -> None:
        expected = sum(1 for item in self.model if key(after) < item <= key(upto))
        assert self.ranges.count_between(after, upto) == expected

    @rule()
    def copy_is_independent(self) -> None:
        clone = self.ranges.copy()
        assert clone == self.ranges
        clone.add(Position(99, 0))
        assert Position(99, 0) not in self.ranges
        assert clone != self.ranges

    @rule()
    def rebuild_from_runs(self) -> None:
        """What the metadata store persists (the runs) rebuilds an equal value."""
        assert AckedRanges(self.ranges.runs()) == self.ranges

    @invariant()
    def agrees_with_the_set(self) -> None:
        assert_agrees(self.ranges, self.model)


def test_acked_ranges_agree_with_a_set() -> None:
    run_state_machine_as_test(
        AckedRangesMachine,
        settings=settings(max_examples=100, stateful_step_count=40, deadline=None),
    )


@given(st.lists(st.tuples(ledger_ids, entry_ids, st.integers(min_value=0, max_value=5))))
@settings(deadline=None)
def test_constructor_merges_overlapping_and_adjacent_runs(spans: list[tuple[int, int, int]]) -> None:
    runs = [(ledger_id, first, first + length) for ledger_id, first, length in spans]
    model = {(ledger_id, entry) for ledger_id, first, last in runs for entry in range(first, last + 1)}
    assert_agrees(AckedRanges(runs), model)


@given(st.lists(positions), st.randoms(use_true_random=False))
@settings(deadline=None)
def test_insertion_order_does_not_matter(added: list[Position], random) -> None:
    forward, shuffled = AckedRanges(), AckedRanges()
    for position in added:
        forward.add(position)
    mixed = list(added)
    random.shuffle(mixed)
    for position in mixed:
        shuffled.add(position)
    assert forward == shuffled


# -- examples pinned by hand ---------------------------------------------------------------


def test_pulsar_string_uses_half_open_ranges() -> None:
    ranges = AckedRanges()
    for entry_id in range(5, 10):
        ranges.add(Position(3, entry_id))
    ranges.add(Position(5, 0))
    assert ranges.to_pulsar_string() == "[(3:4..3:9], (5:-1..5:0]]"


def test_pulsar_string_of_nothing() -> None:
    assert AckedRanges().to_pulsar_string() == "[]"


def test_adjacent_adds_merge_into_one_run_and_fill_a_gap() -> None:
    ranges = AckedRanges()
    ranges.add(Position(7, 1))
    ranges.add(Position(7, 3))
    assert list(ranges.runs()) == [(7, 1, 1), (7, 3, 3)]
    assert len(ranges) == 2
    ranges.add(Position(7, 2))
    assert list(ranges.runs()) == [(7, 1, 3)]
    assert len(ranges) == 1
    assert ranges.to_pulsar_string() == "[(7:0..7:3]]"


def test_runs_in_different_ledgers_never_merge() -> None:
    """Whether ``(3, last)`` and ``(4, 0)`` touch depends on the ledger list: not our call."""
    ranges = AckedRanges([(3, 0, 2), (4, 0, 1)])
    assert len(ranges) == 2
    assert ranges.to_pulsar_string() == "[(3:-1..3:2], (4:-1..4:1]]"


def test_drop_through_cuts_a_run_in_the_middle_and_drops_earlier_ledgers() -> None:
    ranges = AckedRanges([(2, 0, 4), (3, 2, 6), (3, 9, 9), (4, 0, 0)])
    ranges.drop_through(Position(3, 4))
    assert list(ranges.runs()) == [(3, 5, 6), (3, 9, 9), (4, 0, 0)]
    ranges.drop_through(Position(3, -1))  # before the first entry: changes nothing
    assert list(ranges.runs()) == [(3, 5, 6), (3, 9, 9), (4, 0, 0)]
    ranges.drop_through(Position(3, 9))
    assert list(ranges.runs()) == [(4, 0, 0)]


@pytest.mark.parametrize(
    ("after", "upto", "expected"),
    [
        (Position(3, -1), Position(5, 100), 7),  # everything
        (Position(3, 5), Position(3, 9), 4),  # (3:5..3:9] holds 6..9
        (Position(3, 9), Position(5, 0), 1),  # only 5:0
        (Position(5, 0), Position(3, 0), 0),  # an empty interval
        (Position(4, 0), Position(4, 7), 0),  # a ledger with no acks
    ],
)
def test_count_between_is_half_open(after: Position, upto: Position, expected: int) -> None:
    ranges = AckedRanges([(3, 4, 9), (5, 0, 0)])
    assert ranges.count_between(after, upto) == expected


def test_equality_is_by_value() -> None:
    assert AckedRanges([(1, 0, 1)]) == AckedRanges([(1, 1, 1), (1, 0, 0)])
    assert AckedRanges([(1, 0, 1)]) != AckedRanges([(1, 0, 2)])
    assert AckedRanges() != [(1, 0, 1)]
    assert repr(AckedRanges([(1, 0, 1)])) == "AckedRanges([(1, 0, 1)])"
