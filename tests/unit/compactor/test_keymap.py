"""The key map and the position packing of phase one (``compactor.local.keymap``).

``KeyMap`` is checked against a dict under random puts and deletes, with the buffer
shrunk (``BUFFER_UPDATES_MIN``) so that a few dozen updates merge many times.
``PositionPacker`` must round-trip, keep the order of positions, and refuse what does not
fit rather than truncate it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.errors import CompactorError
from compactor.local import keymap
from compactor.local.keymap import KeyMap, KeyMapLimitError, PositionPacker, key_hash
from ledger.position import Position

PROPERTY = settings(max_examples=100, deadline=None)
U64_MAX = 2**64 - 1
TOMBSTONE = U64_MAX  # what KeyMap stores for a delete; no position may pack to it
ENTRY_ID_LIMIT = 2**30
BATCH_INDEX_LIMIT = 2**14 - 1
BYTES_PER_KEY = 24

# Hashes that collide often on their high half, so that ``get`` has to look at the low one.
hashes = st.tuples(
    st.sampled_from((0, 1, 2**63, U64_MAX)), st.sampled_from((0, 7, U64_MAX))
) | st.text(max_size=3).map(key_hash)
packed_positions = st.integers(0, U64_MAX - 1)
Operation = tuple[str, tuple[int, int], int]
"""(name, key hash, packed position); "delete" ignores the position, "check" both."""
operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), hashes, packed_positions),
        st.tuples(st.just("delete"), hashes, st.just(0)),
        st.tuples(st.just("check"), st.just((0, 0)), st.just(0)),
    ),
    max_size=120,
)


def small_buffer(updates: int = 4) -> AbstractContextManager[object]:
    return mock.patch.object(keymap, "BUFFER_UPDATES_MIN", updates)


def assert_agrees(
    key_map: KeyMap, model: dict[tuple[int, int], int], seen: set[tuple[int, int]]
) -> None:
    assert len(key_map) == len(model)
    for hashed in seen:
        assert key_map.get(hashed) == model.get(hashed)
    assert key_map.sorted_positions().tolist() == sorted(model.values())
    assert key_map.nbytes == BYTES_PER_KEY * len(model)  # merged: no buffer, no tombstones


# --- KeyMap -------------------------------------------------------------------------------


@PROPERTY
@given(operations, st.sampled_from((1, 4, 16)))
def test_key_map_agrees_with_a_dict(ops: list[Operation], buffer_updates: int) -> None:
    model: dict[tuple[int, int], int] = {}
    seen: set[tuple[int, int]] = set()
    with small_buffer(buffer_updates):
        key_map = KeyMap()
        for name, hashed, packed in ops:
            if name == "put":
                key_map.put(hashed, packed)
                model[hashed] = packed
                seen.add(hashed)
            elif name == "delete":
                key_map.delete(hashed)
                model.pop(hashed, None)
                seen.add(hashed)
            else:
                assert_agrees(key_map, model, seen)
            # The arrays hold at most every hash seen; fewer than max(BUFFER_UPDATES_MIN,
            # arrays / 4) updates wait in the buffer.
            waiting_max = max(buffer_updates, len(seen) // 4)
            assert key_map.nbytes < BYTES_PER_KEY * (len(seen) + waiting_max)
        assert_agrees(key_map, model, seen)


def test_the_last_update_wins_not_the_largest_position() -> None:
    """Stream order decides, in the buffer and across merges (the sort must be stable)."""
    with small_buffer(1_000):
        key_map = KeyMap()
        hashed = key_hash("k")
        for packed in (500, 900, 3, 700, 5):
            key_map.put(hashed, packed)
        assert key_map.get(hashed) == 5
        key_map.put(hashed, 1)  # after a merge
        key_map.delete(key_hash("other"))
        assert key_map.get(hashed) == 1


def test_many_equal_hashes_in_one_merge_keep_stream_order() -> None:
    """Large enough for numpy to leave insertion sort; still the last update per key wins."""
    with small_buffer(10_000):
        key_map = KeyMap()
        expected = {}
        for step in range(3_000):
            hashed = key_hash(str(step % 7))
            packed = (step * 7_919) % 5_000
            key_map.put(hashed, packed)
            expected[hashed] = packed
        for hashed, packed in expected.items():
            assert key_map.get(hashed) == packed


def test_delete_then_put_then_delete_in_one_buffer() -> None:
    with small_buffer(100):
        key_map = KeyMap()
        hashed = key_hash("k")
        key_map.put(hashed, 1)
        key_map.merge()
        key_map.delete(hashed)
        key_map.put(hashed, 2)
        key_map.delete(hashed)
        assert key_map.get(hashed) is None
        assert len(key_map) == 0
        key_map.put(hashed, 3)
        assert key_map.get(hashed) == 3


def test_merges_are_amortised_and_the_buffer_stays_below_a_quarter_of_the_map() -> None:
    with small_buffer(4):
        key_map = KeyMap()
        for step in range(4_000):
            key_map.put(key_hash(str(step)), step)
        # Merges happen at 4, 5, 6, ... growing by a quarter: far fewer than one per update.
        assert 10 < key_map.merges < 60
        assert key_map.nbytes <= BYTES_PER_KEY * (4_000 + 4_000 // 4)
        assert len(key_map) == 4_000
        assert key_map.nbytes == BYTES_PER_KEY * 4_000


def test_the_default_buffer_merges_only_when_asked() -> None:
    key_map = KeyMap()
    for step in range(100):
        key_map.put(key_hash(str(step)), step)
    assert key_map.merges == 0
    assert key_map.nbytes == BYTES_PER_KEY * 100  # buffered updates cost 24 bytes each too
    assert len(key_map) == 100
    assert key_map.merges == 1


def test_an_empty_map() -> None:
    key_map = KeyMap()
    assert (len(key_map), key_map.get(key_hash("k")), key_map.nbytes) == (0, None, 0)
    assert key_map.sorted_positions().tolist() == []
    key_map.delete(key_hash("k"))
    assert len(key_map) == 0


def test_key_hash_is_128_bits_stable_and_takes_any_text() -> None:
    assert key_hash("k") == key_hash("k")
    assert key_hash("k") != key_hash("K")
    assert key_hash("") != key_hash("\x00")
    for key in ("", "k", "ключ", "\udcff"):  # a surrogate escape: key bytes that are not UTF-8
        high, low = key_hash(key)
        assert 0 <= high <= U64_MAX and 0 <= low <= U64_MAX
    assert key_hash("\udcff") != key_hash("\udcfe")


# --- PositionPacker -----------------------------------------------------------------------


@st.composite
def sorted_positions(draw: st.DrawFn) -> list[Position]:
    ledger_ids = sorted(draw(st.sets(st.integers(0, 2**63 - 1), min_size=1, max_size=6)))
    positions = {
        Position(
            draw(st.sampled_from(ledger_ids)),
            draw(st.integers(0, ENTRY_ID_LIMIT - 1)),
            draw(st.integers(-1, BATCH_INDEX_LIMIT - 1)),
        )
        for _ in range(draw(st.integers(1, 30)))
    }
    return sorted(positions)


@PROPERTY
@given(sorted_positions())
def test_packing_round_trips_and_keeps_the_order(positions: list[Position]) -> None:
    packer = PositionPacker()
    packed = [packer.pack(position) for position in positions]
    assert packed == sorted(packed) and len(set(packed)) == len(packed)
    assert [packer.unpack(value) for value in packed] == positions
    assert [packer.pack_known(position) for position in positions] == packed
    assert all(0 <= value < TOMBSTONE for value in packed)
    # A ledger met before may come again, out of order, and packs the same.
    assert packer.pack(positions[0]) == packed[0]


def test_pack_known_does_not_learn_a_ledger() -> None:
    packer = PositionPacker()
    assert packer.pack_known(Position(5, 0)) is None
    packer.pack(Position(7, 0))
    assert packer.pack_known(Position(5, 0)) is None
    assert packer.pack_known(Position(7, 3, 2)) == packer.pack(Position(7, 3, 2))


@pytest.mark.parametrize(
    "position",
    [
        Position(1, ENTRY_ID_LIMIT),
        Position(1, -1),
        Position(1, 0, BATCH_INDEX_LIMIT),
        Position(1, 0, -2),
    ],
    ids=["entry id 2**30", "entry id -1", "batch index 2**14-1", "batch index -2"],
)
def test_positions_that_do_not_fit_are_refused(position: Position) -> None:
    packer = PositionPacker()
    with pytest.raises(KeyMapLimitError):
        packer.pack(position)
    packer.pack(Position(1, 0))
    with pytest.raises(KeyMapLimitError):
        packer.pack_known(position)


def test_the_largest_positions_fit() -> None:
    packer = PositionPacker()
    largest = Position(2**63 - 1, ENTRY_ID_LIMIT - 1, BATCH_INDEX_LIMIT - 1)
    assert packer.unpack(packer.pack(largest)) == largest


def test_a_ledger_met_out_of_order_is_refused() -> None:
    packer = PositionPacker()
    packer.pack(Position(10, 0))
    with pytest.raises(KeyMapLimitError, match="ledger 9 met after 10"):
        packer.pack(Position(9, 5))
    assert issubclass(KeyMapLimitError, CompactorError)


def test_too_many_ledgers_are_refused_and_no_position_packs_to_the_tombstone() -> None:
    """Shrunk to 3 ledger bits: ordinals 0..6; the all-ones ordinal is never handed out."""
    with mock.patch.object(keymap, "_LEDGER_BITS", 3):
        packer = PositionPacker()
        for ledger_id in range(7):
            packer.pack(Position(ledger_id, 0))
        with pytest.raises(KeyMapLimitError, match="ledgers"):
            packer.pack(Position(7, 0))
    # At full width, the largest ordinal with the largest entry and slot is not all ones.
    largest = PositionPacker._pack(
        2**20 - 2, Position(0, ENTRY_ID_LIMIT - 1, BATCH_INDEX_LIMIT - 1)
    )
    assert largest == TOMBSTONE - 2**44
