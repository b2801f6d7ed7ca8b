"""The two phases of compaction, as pure functions over entries (Pulsar's TwoPhaseCompactor).

Input to both phases is the same stream of ``Entry(position, data)`` in position order: the
previous compacted ledger's entries (carrying their original positions) followed by the
raw entries after the previous horizon, up to and including the stop marker. Neither phase
touches storage, the clock or settings; the runner (``compactor.runs.runner``) does the I/O.

Phase one (``phase_one``) — what is the latest message of every key?

1. Every entry is read (``compactor.local.scan``: keys and tombstones only, no ``Message``
   objects); a server marker is skipped (it carries no application data).
2. Every message of the entry (one, or one per batch slot) that a previous run has not
   already dropped (``compacted_out``) is looked at, in order:
   * a keyed message with a value: its position becomes the key's latest;
   * a keyed tombstone (empty or null value): the key is deleted;
   * a key-less message: not in the map (phase two keeps it iff ``retain_null_key``);
   * a chunk (``compactor.local.chunks``): only the last chunk of a chunked message counts, as
     its key's value (never a tombstone); where it completes is recorded in ``chunks``.
3. An entry whose bytes cannot be parsed or whose payload cannot be decoded is *opaque*:
   it takes no part in the map and phase two keeps it whole (Pulsar keeps an undecodable
   batch whole rather than failing the run).

Phase two (``phase_two``) — what survives, in original order? Which slots of an entry
survive is ``compactor.local.slot_rule``'s one rule, which every engine applies; phase two
brings its lookup (is the slot's packed position retained?):

* A message survives iff its position is some key's latest (equivalently: the map holds
  exactly its position for its key), or it is key-less and ``retain_null_key`` is set.
  A chunk survives iff its chunked message does (all its chunks or none), or that
  message is not complete in the stream (``compactor.local.chunks``); it is written verbatim.
  Tombstones never survive (but young ones, below); markers never survive; opaque entries survive whole.
* A non-batched survivor is written verbatim. A batch with survivors keeps its slot
  numbering: if every slot not already dropped survives it is written verbatim, else it is
  rewritten with the dropped slots emptied (``compacted_out``, no payload bytes). A batch
  with no survivor is not written.
* Positions and message ids never change, so compacting twice equals compacting once, and
  compacting A, then the result plus B, equals compacting A+B.
* An entry with no retained slot that is neither opaque nor a chunk (phase one lists
  those in ``parse_again``) has nothing to keep and is skipped unread, unless key-less
  messages are retained (then every entry is read, as it is when ``parse_again`` is None).
* The stream comes in position order and packed positions keep that order, so phase two
  finds the retained positions in one ascending walk (``AscendingLookup``), not a search
  per message; a batch is split into slots once, and rewritten from those slots.

Tombstone retention (Kafka's ``delete.retention.ms``, the ``deleteRetentionMs`` policy):
with ``keep_tombstones_since_ms`` set, a tombstone whose entry was published at or after
that time is *young* and counts as a value in both phases: it becomes its key's latest
and survives while it is, so a read-compacted reader sees the delete. An older tombstone
deletes its key as above. ``None`` (the default) is Pulsar's behaviour: every tombstone
deletes. The cut-off is an argument, never the clock: the runner computes it once per run
(now − retention), so both phases and every engine decide alike.

Removed events (the run's ``removed_events``) = messages read − messages kept, an exact
count where Pulsar's counter is an approximation (it counts a tombstone once, though it
removes two messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from compactor.local.chunks import ChunkedMessages, EntryAt
from compactor.local.keymap import (
    AscendingLookup,
    KeyMap,
    KeyMapLimitError,
    PositionPacker,
    key_hash,
)
from compactor.local.scan import EntryScan, ScannedMessage, scan_entry
from compactor.local.slot_rule import is_young, surviving_slots
from compactor.view.view import CompactedEntry  # phase two's output, defined with its format
from ledger.managed_ledger import Entry
from ledger.position import Position
from message.encoder import rewrite_slots

__all__ = ["CompactedEntry", "PhaseOneResult", "compact", "fold_entry", "is_young", "kept_entry", "phase_one", "phase_two"]


@dataclass
class PhaseOneResult:
    """What phase one learned.

    Attributes:
        key_map: each live key's latest packed position.
        packer: the packing of positions used by ``key_map``.
        entries_read, messages_read: what phase one looked at (markers and dropped slots
            not counted as messages).
        bytes_read: total entry bytes read.
        markers: server markers skipped.
        opaque_entries: entries kept whole because they could not be decoded.
        last_position: the last entry read (the stop marker), or None for no entries.
        chunks: where the stream's chunked messages complete (``compactor.local.chunks``).
        parse_again: the entries phase two must read whatever the key map holds (opaque
            entries and chunks); None when whoever ran phase one did not record them (the
            Spark engine), and then phase two reads every entry.
    """

    key_map: KeyMap = field(default_factory=KeyMap)
    packer: PositionPacker = field(default_factory=PositionPacker)
    entries_read: int = 0
    messages_read: int = 0
    bytes_read: int = 0
    markers: int = 0
    opaque_entries: int = 0
    last_position: Position | None = None
    chunks: ChunkedMessages = field(default_factory=ChunkedMessages)
    parse_again: set[Position] | None = None


def phase_one(
    entries: Iterable[Entry], *, retain_null_key: bool = False, keep_tombstones_since_ms: int | None = None
) -> PhaseOneResult:
    """Build the key map from ``entries`` (see the module docstring, phase one)."""
    del retain_null_key  # key-less messages never enter the map; phase two decides
    parse_again: set[Position] = set()
    result = PhaseOneResult(parse_again=parse_again)
    for entry in entries:
        fold_entry(result, entry, scan_entry(entry.data), keep_tombstones_since_ms)
    return result


def fold_entry(result: PhaseOneResult, entry: Entry, scan: EntryScan, keep_tombstones_since_ms: int | None) -> None:
    """Phase one of one entry (``scan`` is ``scan_entry(entry.data)``): count it and fold
    its messages into ``result``; ``result.parse_again`` must be a set."""
    assert result.parse_again is not None
    assert result.last_position is None or entry.position > result.last_position, "out of order"
    result.last_position = entry.position
    result.entries_read += 1
    result.bytes_read += len(entry.data)
    if scan.kind == "opaque":
        result.opaque_entries += 1
        result.parse_again.add(entry.position)
    elif scan.kind == "marker":
        result.markers += 1
    else:
        result.messages_read += len(scan.messages)
        if scan.chunk is not None:
            result.parse_again.add(entry.position)
            _chunk(result, entry.position, scan)
            return
        young = is_young(scan.publish_time, keep_tombstones_since_ms)
        _update(result.key_map, result.packer, entry.position, scan.messages, young)


def _chunk(result: PhaseOneResult, position: Position, scan: EntryScan) -> None:
    """A chunk: only a last one counts, as its key's value (``compactor.local.chunks``)."""
    assert scan.chunk is not None
    if not scan.chunk.is_last:
        return
    [(_, key, _)] = scan.messages
    result.chunks.complete(key_hash(scan.chunk.uuid), _at(position), keyless=key is None)
    if key is not None:
        result.key_map.put(key_hash(key), result.packer.pack_slot(result.packer.pack_entry(position), -1))


def _at(position: Position) -> EntryAt:
    return position.ledger_id, position.entry_id


def _update(
    key_map: KeyMap, packer: PositionPacker, position: Position, messages: Iterable[ScannedMessage],
    young: bool,
) -> None:
    """Fold one entry's live messages into the key map, in batch_index order."""
    packed_entry = -1  # the entry is packed at its first put: only then is its ledger met
    for batch_index, key, tombstone in messages:
        if key is None:
            continue
        if tombstone and not young:
            key_map.delete(key_hash(key))
            continue
        hashed = key_hash(key)
        if packed_entry < 0:
            packed_entry = packer.pack_entry(position)
        key_map.put(hashed, packer.pack_slot(packed_entry, batch_index))


def phase_two(
    entries: Iterable[Entry], result: PhaseOneResult, *, retain_null_key: bool = False,
    keep_tombstones_since_ms: int | None = None,
) -> Iterator[CompactedEntry]:
    """The surviving entries of the same stream, in order (see the module docstring).

    ``entries`` must be the stream phase one read: retained positions are looked up in
    one ascending walk (``AscendingLookup``), which relies on the stream's order.
    """
    sorted_positions = result.key_map.sorted_positions()
    retained = AscendingLookup(sorted_positions)
    chunks = result.chunks
    retained_chunks = chunks.retained(sorted_positions, result.packer, retain_null_key)
    parse_again = None if retain_null_key else result.parse_again
    for entry in entries:
        if parse_again is not None and _nothing_retained(entry.position, result.packer, retained, parse_again):
            continue
        scan = scan_entry(entry.data)
        position = entry.position
        keep = surviving_slots(
            scan, keep_tombstones_since_ms=keep_tombstones_since_ms, retain_null_key=retain_null_key,
            latest=_RetainedSlots(position, result.packer, retained),
            chunk_survives=scan.chunk is not None and chunks.survives(key_hash(scan.chunk.uuid), _at(position),
                                                                      retained_chunks))
        if keep:
            yield kept_entry(entry, scan, keep)


def kept_entry(entry: Entry, scan: EntryScan, keep: list[int]) -> CompactedEntry:
    """The compacted entry of a single or batch ``entry`` whose live messages ``keep``
    (batch indexes, not empty) survive: verbatim, or a batch with the others emptied."""
    if scan.batch is None:  # non-batched or encrypted: one message, kept verbatim
        return CompactedEntry(entry.position, entry.data)
    batch = scan.batch
    data = entry.data
    if len(keep) < len(scan.messages):  # some live slot is dropped
        data = rewrite_slots(batch.metadata, batch.slots(), set(keep), with_checksum=batch.has_checksum)
    return CompactedEntry(entry.position, data, scan.batch_size, tuple(keep))


def _nothing_retained(
    position: Position, packer: PositionPacker, retained: AscendingLookup, parse_again: set[Position]
) -> bool:
    """The entry at ``position`` has no survivor, known without reading it (key-less
    messages not retained): it is neither opaque nor a chunk, and no retained position is
    one of its slots. Phase one put a position for every keyed value (a young tombstone
    included), so an entry with no retained slot has nothing to keep. A position that does
    not pack is left to the full reading, which fails where it did before."""
    if parse_again and position in parse_again:
        return False
    try:
        packed_entry = packer.pack_entry_known(position)
    except KeyMapLimitError:
        return False
    if packed_entry is None:  # phase one put nothing in this ledger
        return True
    return not retained.any_in(packed_entry, packer.slots_end(packed_entry))


class _RetainedSlots:
    """Phase two's ``slot_rule.Latest`` for the entry at ``position``: a keyed message is
    its key's latest iff its packed position is retained; a position in a ledger phase
    one never packed (no put there) cannot be. The entry is packed at the first question."""

    __slots__ = ("packed_entry", "packer", "position", "retained")

    def __init__(self, position: Position, packer: PositionPacker, retained: AscendingLookup) -> None:
        self.position, self.packer, self.retained = position, packer, retained
        self.packed_entry: int | None = -1  # -1: not packed yet; None: the ledger is unknown

    def __call__(self, batch_index: int, key: str) -> bool:
        del key
        if self.packed_entry == -1:
            self.packed_entry = self.packer.pack_entry_known(self.position)
        return self.packed_entry is not None and self.retained.contains(
            self.packer.pack_slot(self.packed_entry, batch_index))


def compact(
    entries: list[Entry], *, retain_null_key: bool = False, keep_tombstones_since_ms: int | None = None
) -> list[CompactedEntry]:
    """Both phases over an in-memory stream: the reference the engines must agree with."""
    result = phase_one(entries, retain_null_key=retain_null_key, keep_tombstones_since_ms=keep_tombstones_since_ms)
    return list(phase_two(entries, result, retain_null_key=retain_null_key,
                          keep_tombstones_since_ms=keep_tombstones_since_ms))
