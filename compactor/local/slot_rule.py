"""Which messages of an entry survive compaction: the one rule, written once, in two forms.

Every engine decides what survives of an entry by this rule; all it brings is its own
answer to "is this keyed message its key's latest?" (its key map, its set of retained
positions, its sorted array of them) and to "does this chunk's chunked message survive?"
(``compactor.local.chunks``, or the Spark engine's dropped chunks):

* an entry that does not decode (*opaque*) survives whole; a server marker never does;
* a chunk survives iff its chunked message does;
* a slot a previous run emptied (``compacted_out``) is not a message: it never survives;
* a tombstone that is not young (``is_young``: Kafka's ``delete.retention.ms``) never
  survives;
* a key-less message survives iff ``retain_null_key``;
* a keyed message (a young tombstone included) survives iff it is its key's latest.

``surviving_slots`` is the rule over one scanned entry (``compactor.local.scan``), for the
engines that parse (``algorithm.phase_two``, ``rounds``' clean part, the Spark engine's
``rewrite.group_phase_two``). ``surviving_rows`` is the same rule over key-index rows
(``compactor.local.key_index``: one row per message, emptied slot, marker or opaque entry),
as numpy array work, for the engines that read indexes (``indexed``, the Spark engine's
``index_scan.survivors``). ``tests/unit/compactor/test_slot_rule.py`` checks that the two
agree on every kind of entry (hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from compactor.local.key_index import (
    FLAG_CHUNK,
    FLAG_COMPACTED_OUT,
    FLAG_KEYLESS,
    FLAG_MARKER,
    FLAG_OPAQUE,
    FLAG_TOMBSTONE,
)
from compactor.local.scan import EntryScan

__all__ = ["ChunkRows", "Latest", "LatestRows", "is_young", "old_tombstones", "surviving_rows", "surviving_slots"]

Mask = npt.NDArray[np.bool_]

Latest = Callable[[int, str], bool]
"""``latest(batch_index, key)``: whether the entry's keyed message at ``batch_index`` is its
key's latest (asked only of keyed messages that are not old tombstones, in batch order)."""
LatestRows = Callable[[Mask], Mask]
"""``latest(asked)``: for the rows ``asked`` (keyed messages that are not old tombstones),
in order, whether each is its key's latest: one flag per asked row."""
ChunkRows = Callable[[Mask], Mask]
"""``chunk_survives(asked)``: for the chunk rows ``asked``, in order, whether each one's
chunked message survives: one flag per asked row."""

_KEYED = FLAG_KEYLESS | FLAG_MARKER | FLAG_OPAQUE | FLAG_COMPACTED_OUT | FLAG_CHUNK  # none of these: a keyed message
_MESSAGE = FLAG_MARKER | FLAG_OPAQUE | FLAG_COMPACTED_OUT | FLAG_CHUNK  # none of these: a message


def is_young(publish_time: int, keep_tombstones_since_ms: int | None) -> bool:
    """Whether an entry's tombstones are young (kept as values): published at or after the
    cut-off; never without one (Pulsar's behaviour: every tombstone deletes)."""
    return keep_tombstones_since_ms is not None and publish_time >= keep_tombstones_since_ms


def surviving_slots(
    scan: EntryScan, *, keep_tombstones_since_ms: int | None, retain_null_key: bool, latest: Latest,
    chunk_survives: bool = False,
) -> list[int]:
    """The batch indexes of ``scan``'s messages that survive, in order (the module
    docstring's rule); ``chunk_survives``: for a chunk, whether its chunked message
    survives (the caller asks ``compactor.local.chunks``), ignored for any other entry. -1 names an entry's one message (a single message or a chunk) and an
    opaque entry, which survives whole; an empty list: nothing of the entry survives."""
    if scan.kind == "opaque":
        return [-1]
    if scan.kind == "marker":
        return []
    if scan.chunk is not None:
        return [-1] if chunk_survives else []
    young = is_young(scan.publish_time, keep_tombstones_since_ms)
    keep = []
    for batch_index, key, tombstone in scan.messages:  # compacted_out slots are not among them
        if tombstone and not young:
            continue
        if key is None:
            if retain_null_key:
                keep.append(batch_index)
        elif latest(batch_index, key):
            keep.append(batch_index)
    return keep


def old_tombstones(flags: npt.NDArray[np.uint8], publish_time: npt.NDArray[np.int64] | None,
                   keep_tombstones_since_ms: int | None) -> Mask:
    """Which rows are tombstones that are not young (``publish_time`` may be None when
    ``keep_tombstones_since_ms`` is)."""
    old: Mask = (flags & FLAG_TOMBSTONE) != 0
    if keep_tombstones_since_ms is not None:
        assert publish_time is not None, "young tombstones need the publish_time column"
        old &= publish_time < keep_tombstones_since_ms
    return old


def surviving_rows(
    flags: npt.NDArray[np.uint8], *, old: Mask, retain_null_key: bool, latest: LatestRows,
    chunk_survives: ChunkRows | None = None,
) -> Mask:
    """Which of the index rows ``flags`` survive (the module docstring's rule, as
    ``surviving_slots`` decides it): ``old`` says which are tombstones that are not young
    (``old_tombstones``); ``chunk_survives`` None: the rows hold no chunk."""
    keep: Mask = (flags & FLAG_OPAQUE) != 0  # undecodable entries survive whole
    message = (flags & _MESSAGE) == 0
    if retain_null_key:
        keep |= message & ((flags & FLAG_KEYLESS) != 0) & ~old
    asked = ((flags & _KEYED) == 0) & ~old
    keep[asked] = latest(asked)
    if chunk_survives is not None:
        chunks = (flags & FLAG_CHUNK) != 0
        keep[chunks] = chunk_survives(chunks)
    return keep
