from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.position import EARLIEST, LATEST, Position

positions = st.builds(
    Position,
    st.integers(0, 2**40),
    st.integers(-1, 2**40),
    st.integers(-1, 1000),
    st.integers(-1, 16),
)


@given(positions, positions)
def test_order_is_ledger_then_entry_then_batch_index(a: Position, b: Position) -> None:
    assert (a < b) == ((a.ledger_id, a.entry_id, a.batch_index) < (b.ledger_id, b.entry_id, b.batch_index))


@given(positions)
def test_sentinels_bound_every_position(p: Position) -> None:
    assert EARLIEST < p < LATEST


def test_partition_takes_no_part_in_equality() -> None:
    assert Position(3, 4, 1, partition=0) == Position(3, 4, 1, partition=5)


@given(positions)
def test_str_parse_round_trip(p: Position) -> None:
    assert Position.parse(str(p)) == p


def test_str_is_pulsar_admin_form() -> None:
    assert str(Position(12, 7)) == "12:7"
    assert str(Position(12, 7, 3)) == "12:7:3"


@pytest.mark.parametrize("text", ["", "1", "a:b", "1:2:3:4", "1:x"])
def test_parse_rejects_garbage_with_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not a position"):
        Position.parse(text)


def test_entry_position_drops_batch_index() -> None:
    assert Position(1, 2, 5).entry_position() == Position(1, 2)
    assert Position(1, 2, 5).entry_position() < Position(1, 2, 0)
