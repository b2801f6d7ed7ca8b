"""The one slot rule (``compactor.local.slot_rule``): what it keeps, and its two forms agree.

* The pure rule, by example: an opaque entry survives whole, a marker never; a chunk iff
  its chunked message does; a keyed message (a young tombstone included) iff it is its
  key's latest, and only such messages are asked about; an old tombstone never; a key-less
  message iff ``retain_null_key``.
* Agreement (hypothesis): over generated streams of every entry kind (chunks, batches with
  emptied slots, markers, undecodable entries, every codec), with any lookup, the array
  form (``surviving_rows`` over the entries' key-index rows) keeps exactly the slots the
  pure form (``surviving_slots`` over the scanned entries) keeps, and asks its lookup
  about exactly the same messages.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.local.key_index import build_index
from compactor.local.scan import EntryScan, scan_entry
from compactor.local.slot_rule import old_tombstones, surviving_rows, surviving_slots
from message.entry import Chunk
from tests.strategies import StreamEntry, stream_entries

PROPERTY = settings(max_examples=200, deadline=None)
PUBLISHED_AT = 1_700_000_000_000  # every generated entry's publish time (tests.strategies)
CUTOFFS = st.sampled_from([None, PUBLISHED_AT, PUBLISHED_AT + 1])  # retention: none, all young, none young


def _batch(*messages: tuple[int, str | None, bool], publish_time: int = 10) -> EntryScan:
    return EntryScan("batch", messages, batch_size=1 + max(index for index, _, _ in messages),
                     publish_time=publish_time)


@pytest.mark.parametrize(("since", "retain_null_key", "latest_keys", "kept", "asked"), [
    # old tombstones never survive, nor are asked about; key-less messages only when retained
    (None, False, {"a", "b"}, [0, 3], [0, 3]),
    (None, True, {"a", "b"}, [0, 2, 3], [0, 3]),
    # a young tombstone is a value: it survives iff it is its key's latest
    (10, False, {"a", "b"}, [0, 1, 3], [0, 1, 3]),
    (10, False, {"b"}, [1, 3], [0, 1, 3]),
    (11, True, set(), [2], [0, 3]),
])
def test_the_rule_keeps_latest_values_young_tombstones_and_key_less_messages_only_when_retained(
    since: int | None, retain_null_key: bool, latest_keys: set[str], kept: list[int], asked: list[int],
) -> None:
    # slot 4 was emptied by a previous run: the scan does not list it
    scan = _batch((0, "a", False), (1, "b", True), (2, None, False), (3, "b", False))
    questions: list[int] = []

    def latest(batch_index: int, key: str) -> bool:
        questions.append(batch_index)
        return key in latest_keys

    assert surviving_slots(scan, keep_tombstones_since_ms=since, retain_null_key=retain_null_key,
                           latest=latest) == kept
    assert questions == asked


def test_opaque_entries_survive_whole_markers_never_chunks_with_their_message() -> None:
    def never(batch_index: int, key: str) -> bool:
        raise AssertionError("only keyed messages are asked about")

    rule = {"keep_tombstones_since_ms": None, "retain_null_key": True, "latest": never}
    assert surviving_slots(EntryScan("opaque"), **rule) == [-1]  # type: ignore[arg-type]
    assert surviving_slots(EntryScan("marker"), **rule) == []  # type: ignore[arg-type]
    chunk = EntryScan("single", ((-1, "k", False),), chunk=Chunk("u", 0, 2))
    assert surviving_slots(chunk, chunk_survives=True, **rule) == [-1]  # type: ignore[arg-type]
    assert surviving_slots(chunk, chunk_survives=False, **rule) == []  # type: ignore[arg-type]


def _coin(seed: int, *where: int) -> bool:
    """A drawn lookup: a fixed pseudo-random answer per seed and place (ints hash alike in
    every process)."""
    return bool(hash((seed, *where)) >> 3 & 1)


@PROPERTY
@given(stream_entries(max_size=40), st.booleans(), CUTOFFS, st.integers(0, 2**32), st.integers(0, 2**32))
def test_the_array_form_keeps_and_asks_about_exactly_what_the_pure_rule_does(
    stream: list[StreamEntry], retain_null_key: bool, since: int | None, latest_seed: int, chunk_seed: int,
) -> None:
    pure: list[tuple[int, int, int]] = []
    pure_asked: list[tuple[int, int, int]] = []
    for item in stream:
        place = (item.position.ledger_id, item.position.entry_id)
        scan = scan_entry(item.data)

        def latest(batch_index: int, key: str, place: tuple[int, int] = place) -> bool:
            pure_asked.append((*place, batch_index))
            return _coin(latest_seed, *place, batch_index)

        kept = surviving_slots(scan, keep_tombstones_since_ms=since, retain_null_key=retain_null_key, latest=latest,
                               chunk_survives=scan.chunk is not None and _coin(chunk_seed, *place))
        pure.extend((*place, batch_index) for batch_index in kept)

    rows = build_index((stored, item.position.ledger_id, item.position.entry_id, item.data)
                       for stored, item in enumerate(stream)).columns
    places = list(zip(rows["ledger_id"].tolist(), rows["entry_id"].tolist(), rows["batch_index"].tolist(),
                      strict=True))
    array_asked: list[tuple[int, int, int]] = []

    def latest_rows(asked: np.ndarray) -> np.ndarray:
        chosen = [places[row] for row in np.flatnonzero(asked).tolist()]
        array_asked.extend(chosen)
        return np.array([_coin(latest_seed, *place) for place in chosen], dtype=bool)

    def chunk_rows(asked: np.ndarray) -> np.ndarray:
        return np.array([_coin(chunk_seed, *places[row][:2]) for row in np.flatnonzero(asked).tolist()], dtype=bool)

    flags = rows["flags"]
    keep = surviving_rows(flags, old=old_tombstones(flags, rows["publish_time"], since),
                          retain_null_key=retain_null_key, latest=latest_rows, chunk_survives=chunk_rows)
    assert [places[row] for row in np.flatnonzero(keep).tolist()] == pure
    assert array_asked == pure_asked
