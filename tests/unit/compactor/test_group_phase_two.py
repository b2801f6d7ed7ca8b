"""Phase two of one group (``compactor.spark.rewrite.group_phase_two``), the Spark engine's
executor-side rewrite: cut a stream anywhere into contiguous groups, give each group its
share of phase one's decisions (the retained positions, the dropped chunks), and the
groups' outputs, concatenated, are ``compactor.local.algorithm.phase_two``'s, byte for byte, over
generated streams (batches, tombstones young and old, key-less messages with and without
``retain_null_key``, chunked messages, markers, opaque entries)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.local.algorithm import PhaseOneResult, phase_one, phase_two
from compactor.local.keymap import key_hash
from compactor.local.scan import scan_entry
from compactor.spark.rewrite import At, PackedSlots, Slot, group_phase_two
from ledger.managed_ledger import Entry
from tests.strategies import entries_of, streams

PROPERTY = settings(max_examples=200, deadline=None)
PUBLISHED_AT = 1_700_000_000_000  # every generated entry's publish time
CUTOFFS = st.sampled_from([None, PUBLISHED_AT, PUBLISHED_AT + 1])  # retention: none, all young, none young


def decisions(entries: list[Entry], result: PhaseOneResult, retain_null_key: bool) -> tuple[set[Slot], set[At]]:
    """Phase one's decisions as the Spark engine ships them to the groups, derived from the
    local phase one: the retained positions and the chunks dropped with their message."""
    sorted_positions = result.key_map.sorted_positions()
    retained = set()
    for packed in sorted_positions.tolist():
        position = result.packer.unpack(int(packed))
        retained.add((position.ledger_id, position.entry_id, position.batch_index))
    flags = result.chunks.retained(sorted_positions, result.packer, retain_null_key)
    dropped = set()
    for entry in entries:
        scan = scan_entry(entry.data)
        at = (entry.position.ledger_id, entry.position.entry_id)
        if scan.chunk is not None and not result.chunks.survives(key_hash(scan.chunk.uuid), at, flags):
            dropped.add(at)
    return retained, dropped


def _in_group(entries: list[Entry], slots: set[Slot], ats: set[At]) -> tuple[set[Slot], set[At]]:
    """The share of the decisions whose positions lie in ``entries`` (what co-partitioning
    sends the group)."""
    mine = {(entry.position.ledger_id, entry.position.entry_id) for entry in entries}
    return {slot for slot in slots if slot[:2] in mine}, ats & mine


def _packed(slots: set[Slot]) -> PackedSlots:
    ordered = sorted(slots)
    return PackedSlots(*(np.array([slot[field] for slot in ordered], dtype=np.int64) for field in range(3)))


def test_packed_slots_hold_exactly_their_positions() -> None:
    packed = _packed({(7, 0, -1), (7, 3, 2), (2**40, 1, 0)})
    assert (7, 3, 2) in packed and (2**40, 1, 0) in packed and (7, 0, -1) in packed
    assert (7, 3, 1) not in packed and (8, 0, -1) not in packed and (7, 2**31, 0) not in packed
    assert "x" not in packed


@PROPERTY
@given(stream=streams(max_size=40), cuts=st.lists(st.integers(0, 40), max_size=4), retain_null_key=st.booleans(),
       cutoff=CUTOFFS)
def test_groups_rewritten_apart_give_the_local_phase_two_byte_for_byte(
    stream: list, cuts: list[int], retain_null_key: bool, cutoff: int | None,
) -> None:
    entries = entries_of(stream)
    result = phase_one(entries, keep_tombstones_since_ms=cutoff)
    expected = list(phase_two(entries, result, retain_null_key=retain_null_key, keep_tombstones_since_ms=cutoff))
    retained, dropped = decisions(entries, result, retain_null_key)

    bounds = sorted({0, len(entries), *(min(cut, len(entries)) for cut in cuts)})
    rewritten = []
    for first, last in itertools.pairwise(bounds):
        group = entries[first:last]
        slots, ats = _in_group(group, retained, dropped)
        packed = _packed(slots)  # as the task holds them: 8 bytes a position
        assert set(packed) == slots and len(packed) == len(slots)
        rewritten.extend(group_phase_two(iter(group), packed, ats, retain_null_key=retain_null_key,
                                         keep_tombstones_since_ms=cutoff))
    assert rewritten == expected
