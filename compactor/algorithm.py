"""The two phases of compaction, as pure functions over entries (Pulsar's TwoPhaseCompactor).

Input to both phases is the same stream of ``Entry(position, data)`` in position order: the
previous compacted ledger's entries (carrying their original positions) followed by the
raw entries after the previous horizon, up to and including the stop marker. Neither phase
touches storage, the clock or settings; the runner (``compactor.runner``) does the I/O.

Phase one (``phase_one``) — what is the latest message of every key?

1. Every entry is parsed; a server marker is skipped (it carries no application data).
2. Every message of the entry (one, or one per batch slot) that a previous run has not
   already dropped (``compacted_out``) is looked at, in order:
   * a keyed message with a value: its position becomes the key's latest;
   * a keyed tombstone (empty or null value): the key is deleted;
   * a key-less message: not in the map (phase two keeps it iff ``retain_null_key``).
3. An entry whose bytes cannot be parsed or whose payload cannot be decoded is *opaque*:
   it takes no part in the map and phase two keeps it whole (Pulsar keeps an undecodable
   batch whole rather than failing the run).

Phase two (``phase_two``) — what survives, in original order?

* A message survives iff its position is some key's latest (equivalently: the map holds
  exactly its position for its key), or it is key-less and ``retain_null_key`` is set.
  Tombstones never survive; markers never survive; opaque entries survive whole.
* A non-batched survivor is written verbatim. A batch with survivors keeps its slot
  numbering: if every slot not already dropped survives it is written verbatim, else it is
  rewritten with the dropped slots emptied (``compacted_out``, no payload bytes). A batch
  with no survivor is not written.
* Positions and message ids never change, so compacting twice equals compacting once, and
  compacting A, then the result plus B, equals compacting A+B.

Removed events (the run's ``removed_events``) = messages read − messages kept, an exact
count where Pulsar's counter is an approximation (it counts a tombstone once, though it
removes two messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from compactor.encoder import rewrite_batch
from compactor.errors import MalformedEntryError
from compactor.keymap import U64, KeyMap, PositionPacker, key_hash
from compactor.message import Message, ParsedEntry, is_batch, is_encrypted, is_marker, iter_messages, parse_entry
from ledger.managed_ledger import Entry
from ledger.position import Position

__all__ = ["CompactedEntry", "PhaseOneResult", "compact", "phase_one", "phase_two"]


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
    """

    key_map: KeyMap = field(default_factory=KeyMap)
    packer: PositionPacker = field(default_factory=PositionPacker)
    entries_read: int = 0
    messages_read: int = 0
    bytes_read: int = 0
    markers: int = 0
    opaque_entries: int = 0
    last_position: Position | None = None


@dataclass(frozen=True, slots=True)
class CompactedEntry:
    """One entry of the compacted view.

    Attributes:
        position: the entry's original position in the raw topic (entry level).
        data: the entry bytes: verbatim, or a batch rewritten with dropped slots emptied.
        batch_size: number of slots (0 for a non-batched or opaque entry).
        surviving: batch indexes a reader should get (empty for non-batched entries).
        messages: messages this entry delivers: the surviving slots of a readable batch,
            else 1 (non-batched, encrypted and undecodable entries count as one).
    """

    position: Position
    data: bytes
    batch_size: int = 0
    surviving: tuple[int, ...] = ()

    @property
    def messages(self) -> int:
        return len(self.surviving) if self.batch_size else 1


def _decode(entry: Entry) -> tuple[ParsedEntry, list[Message]] | None:
    """(parsed entry, its messages), or None for an opaque entry.

    A marker's payload is server data, not a value: it is never decoded, so a marker is
    skipped even when its payload would not decode.
    """
    try:
        parsed = parse_entry(entry.data)
        if is_marker(parsed.metadata):
            return parsed, []
        return parsed, list(iter_messages(parsed))
    except MalformedEntryError:  # UndecodablePayloadError included
        return None


def phase_one(entries: Iterable[Entry], *, retain_null_key: bool = False) -> PhaseOneResult:
    """Build the key map from ``entries`` (see the module docstring, phase one)."""
    del retain_null_key  # key-less messages never enter the map; phase two decides
    result = PhaseOneResult()
    key_map, packer = result.key_map, result.packer
    for entry in entries:
        assert result.last_position is None or entry.position > result.last_position, "out of order"
        result.last_position = entry.position
        result.entries_read += 1
        result.bytes_read += len(entry.data)
        decoded = _decode(entry)
        if decoded is None:
            result.opaque_entries += 1
            continue
        parsed, messages = decoded
        if is_marker(parsed.metadata):
            result.markers += 1
            continue
        for message in messages:
            if message.compacted_out:
                continue
            result.messages_read += 1
            if message.key is None:
                continue
            if message.is_tombstone:
                key_map.delete(key_hash(message.key))
            else:
                key_map.put(key_hash(message.key), packer.pack(entry.position.with_batch_index(message.batch_index)))
    return result


def phase_two(
    entries: Iterable[Entry], result: PhaseOneResult, *, retain_null_key: bool = False
) -> Iterator[CompactedEntry]:
    """The surviving entries of the same stream, in order (see the module docstring)."""
    retained = result.key_map.sorted_positions()
    for entry in entries:
        decoded = _decode(entry)
        if decoded is None:
            yield CompactedEntry(entry.position, entry.data)
            continue
        parsed, messages = decoded
        if is_marker(parsed.metadata):
            continue
        keep = [m.batch_index for m in messages if _survives(m, entry.position, result.packer, retained, retain_null_key)]
        if not keep:
            continue
        if not is_batch(parsed.metadata) or is_encrypted(parsed.metadata):
            yield CompactedEntry(entry.position, entry.data)
            continue
        live = [m.batch_index for m in messages if not m.compacted_out]
        data = entry.data if keep == live else rewrite_batch(parsed, set(keep))
        yield CompactedEntry(entry.position, data, len(messages), tuple(keep))


def _survives(
    message: Message, position: Position, packer: PositionPacker, retained: U64, retain_null_key: bool
) -> bool:
    if message.compacted_out or message.is_tombstone:
        return False
    if message.key is None:
        return retain_null_key
    packed = packer.pack_known(position.with_batch_index(message.batch_index))
    if packed is None:
        return False
    index = int(np.searchsorted(retained, np.uint64(packed)))
    return index < len(retained) and int(retained[index]) == packed


def compact(entries: list[Entry], *, retain_null_key: bool = False) -> list[CompactedEntry]:
    """Both phases over an in-memory stream: the reference the engines must agree with."""
    result = phase_one(entries, retain_null_key=retain_null_key)
    return list(phase_two(entries, result, retain_null_key=retain_null_key))
