"""A compacted view of several ledgers answers every reader question exactly as the
one-ledger view of the same entries (issue 13, point 1).

The property: any split of a compacted entry list into ledgers, in order, empty ledgers
included, gives a ``CompactedView`` whose reads of every range, ceiling searches,
``read_from``, ``position_at``, ``iter_all`` and ``last_message_id`` equal those of the
view over one ledger holding all the entries.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactor.view.view import CompactedEntry, CompactedView, encode_compacted_entry
from ledger import MemoryLedgerStore
from ledger.errors import LedgerNotFoundError, PositionOutOfRangeError
from ledger.position import Position

HORIZON = Position(1 << 20, 0)


@st.composite
def compacted_entries(draw: st.DrawFn) -> list[CompactedEntry]:
    """0-25 compacted entries at strictly increasing positions, some of them batches."""
    count = draw(st.integers(0, 25))
    entries, ledger_id, entry_id = [], 3, 0
    for index in range(count):
        if draw(st.booleans()):
            ledger_id, entry_id = ledger_id + draw(st.integers(1, 3)), 0
        entry_id += draw(st.integers(0, 3))
        position = Position(ledger_id, entry_id)
        entry_id += 1
        if draw(st.integers(0, 3)) == 0:
            size = draw(st.integers(1, 70))
            surviving = tuple(sorted(draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=size))))
            entries.append(CompactedEntry(position, b"batch-%d" % index, size, surviving))
        else:
            entries.append(CompactedEntry(position, b"m-%d" % index))
    return entries


def write_ledger(store: MemoryLedgerStore, entries: list[CompactedEntry]) -> int:
    ledger_id = store.create({"component": "compacted-ledger"})
    for entry in entries:
        store.append(ledger_id, encode_compacted_entry(entry)).result(timeout=10)
    store.close(ledger_id)
    return ledger_id


def split(entries: list[CompactedEntry], cuts: list[int]) -> list[list[CompactedEntry]]:
    """``entries`` cut at ``cuts`` (sorted, repeats make empty pieces)."""
    bounds = [0, *sorted(cuts), len(entries)]
    return [entries[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def split_views(draw: st.DrawFn) -> tuple[list[CompactedEntry], CompactedView, CompactedView]:
    """The entries, the one-ledger view of them and a view of the same entries split into
    1-6 ledgers (some empty)."""
    entries = draw(compacted_entries())
    cuts = draw(st.lists(st.integers(0, len(entries)), max_size=5))
    store = MemoryLedgerStore()
    one = CompactedView(store, [write_ledger(store, entries)], HORIZON)
    pieces = [write_ledger(store, piece) for piece in split(entries, cuts)]
    return entries, one, CompactedView(store, pieces, HORIZON)


def probes(entries: list[CompactedEntry]) -> list[Position]:
    """Positions to search for: every entry's, one before and after it, the extremes."""
    out = [Position(-1, -1), Position(0, 0), Position(1 << 30, 0)]
    for entry in entries:
        at = entry.position
        out += [at, Position(at.ledger_id, at.entry_id - 1), Position(at.ledger_id, at.entry_id + 1),
                Position(at.ledger_id, at.entry_id, 5), Position(at.ledger_id + 1, -1)]
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_views())
def test_a_view_of_several_ledgers_answers_every_reader_question_as_one_ledger(
    views: tuple[list[CompactedEntry], CompactedView, CompactedView],
) -> None:
    entries, one, many = views
    assert (many.entries, many.size, many.horizon) == (one.entries, one.size, one.horizon) == (
        len(entries), one.size, HORIZON)
    assert sum(count for _, count in many.segments) == len(entries)
    assert many.ledger_id == many.ledger_ids[0] and [i for i, _ in many.segments] == list(many.ledger_ids)
    assert list(many.iter_all()) == list(one.iter_all()) == entries
    for first in range(len(entries)):
        for last in range(first, len(entries)):
            assert many.read(first, last) == entries[first:last + 1]
        assert many.position_at(first) == one.position_at(first) == entries[first].position
    for position in probes(entries):
        assert many.find_start(position) == one.find_start(position)
        for max_entries in (1, 3, 100):
            assert many.read_from(position, max_entries) == one.read_from(position, max_entries)
    assert many.last_message_id() == one.last_message_id()


def test_reads_outside_the_view_are_refused_as_a_ledger_would() -> None:
    store = MemoryLedgerStore()
    entries = [CompactedEntry(Position(3, i), b"m") for i in range(4)]
    view = CompactedView(store, [write_ledger(store, entries[:2]), write_ledger(store, []),
                                 write_ledger(store, entries[2:])], HORIZON)
    assert view.segments == ((view.ledger_ids[0], 2), (view.ledger_ids[1], 0), (view.ledger_ids[2], 2))
    for first, last in ((-1, 0), (2, 4), (3, 2)):
        with pytest.raises(PositionOutOfRangeError):
            view.read(first, last)
    assert view.read(1, 2) == entries[1:3]


def test_a_view_of_only_empty_ledgers_is_empty() -> None:
    store = MemoryLedgerStore()
    view = CompactedView(store, [write_ledger(store, []), write_ledger(store, [])], HORIZON)
    assert (view.entries, list(view.iter_all()), view.last_message_id()) == (0, [], None)
    assert view.find_start(Position(0, 0)) is None and view.read_from(Position(0, 0), 10) == []


def test_a_view_needs_a_ledger_lists_none_twice_and_names_a_missing_one() -> None:
    store = MemoryLedgerStore()
    present = write_ledger(store, [])
    with pytest.raises(ValueError, match="at least one"):
        CompactedView(store, [], HORIZON)
    with pytest.raises(ValueError, match="twice"):
        CompactedView(store, [present, present], HORIZON)
    with pytest.raises(LedgerNotFoundError):
        CompactedView(store, [present, present + 100], HORIZON)
    view = CompactedView(store, present, HORIZON)  # a bare id: the one-ledger view, as before
    assert view.ledger_ids == (present,)
    with pytest.raises(AttributeError):
        view.ledger_ids = (1,)
