"""The compacted ledger's entry format and the compacted view read from it.

A compacted ledger is a plain ledger (custom metadata: component ``compacted-ledger``, the
topic, ``compactedTo``) whose entries are, in original topic order::

    compacted entry := u32:id_size · MessageIdData · u32:data_size · data      (big-endian)
    MessageIdData   := ledgerId, entryId        the entry's ORIGINAL position
                       batch_size               slots in the batch (absent: not a batch)
                       ack_set                  bitset words of the surviving slots
    data            := the entry bytes (a batch rewritten with dropped slots emptied)

This is Pulsar's RawMessage layout; ``ack_set`` is the surviving-slot mask that dispatch
sends with the message, because the C++ client ignores ``compacted_out`` (bit i set = slot
i is delivered).

``CompactedView`` is one immutable value (ledger ids, horizon, entries, size) and answers
the questions readers ask of one published compacted view: one or more sealed compacted
ledgers in stream order (a run's output may be several, each one contiguous piece of the
stream), whose entries are concatenated into one index space ``0..entries-1``; an empty
ledger in the list holds no index. It answers
its ``horizon`` (the last raw position it covers), the ceiling search for the first
compacted entry at or after a position (batch index ignored, Pulsar's ``findStartPoint``
with its 100-entry id cache), reading n entries from a position (across ledgers), every
entry in order (the compactor's input for the next run), and the last surviving message
id, exactly as over one ledger holding the same entries.

**Dead marks.** A view built by incremental runs carries, per ledger, the entries and batch
slots later data superseded (``compactor.view.marks.LedgerMarks``). The view applies them
here, in one place, so every reader gets them by construction: the index space counts only
entries with a live message (a wholly dead entry is absent), and an entry with dead slots
comes with its ``surviving`` slots less the dead ones (its bytes as stored: the mask is what
a reader delivers by, as for slots phase two emptied; ``CompactedEntry.emptied`` gives the
bytes with the dead slots emptied, for whoever parses them). ``entries``, the search,
``last_message_id`` and ``live_segments`` are all over the live entries; ``segments`` and
``size`` describe the stored ledgers.
"""

from __future__ import annotations

import bisect
import struct
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError

from compactor.errors import CompactorError
from compactor.view.marks import LedgerMarks
from ledger.errors import PositionOutOfRangeError
from ledger.position import Position
from ledger.storage.base import LedgerStore
from message.encoder import rewrite_batch
from message.entry import ParsedEntry, batch_slots, parse_entry
from message.proto import pulsar_api_pb2 as pb

__all__ = ["CompactedEntry", "CompactedView", "ack_set_words", "decode_compacted_entry", "encode_compacted_entry"]

_U32 = struct.Struct(">I")
# Pulsar's DEFAULT_STARTPOINT_CACHE_SIZE: ids of compacted entries kept for the search.
START_POINT_CACHE_ENTRIES_MAX = 100
# Entries read from the compacted ledger per store read when iterating all of it.
READ_BATCH_ENTRIES_MAX = 1000


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

    def emptied(self) -> bytes:
        """The entry's bytes with every slot not in ``surviving`` emptied (``compacted_out``):
        what a full rewrite would have stored for it. The bytes as stored when no slot is
        hidden (a non-batched entry, or every live slot surviving)."""
        if not self.batch_size:
            return self.data
        parsed = parse_entry(self.data)
        if parsed.metadata.num_messages_in_batch == len(self.surviving) or _live_slots(parsed) == self.surviving:
            return self.data
        return rewrite_batch(parsed, set(self.surviving))

    def without(self, dead: frozenset[int]) -> CompactedEntry:
        """This entry with the batch slots ``dead`` no longer surviving."""
        if not dead or not self.batch_size:
            return self
        return CompactedEntry(self.position, self.data, self.batch_size,
                              tuple(index for index in self.surviving if index not in dead))


def _live_slots(parsed: ParsedEntry) -> tuple[int, ...]:
    """The batch indexes of a parsed batch's slots that are not ``compacted_out``."""
    return tuple(slot.batch_index for slot in batch_slots(parsed) if not slot.metadata.compacted_out)


def ack_set_words(surviving: tuple[int, ...], batch_size: int) -> list[int]:
    """The surviving-slot mask as Pulsar's ack_set: int64 words, bit i = slot i delivered."""
    words = [0] * ((batch_size + 63) // 64)
    for index in surviving:
        words[index // 64] |= 1 << (index % 64)
    return [word - (1 << 64) if word >= 1 << 63 else word for word in words]  # int64 on the wire


def encode_compacted_entry(entry: CompactedEntry) -> bytes:
    """The bytes of one compacted-ledger entry (see the module docstring)."""
    message_id = pb.MessageIdData(ledgerId=entry.position.ledger_id, entryId=entry.position.entry_id)
    if entry.batch_size:
        message_id.batch_size = entry.batch_size
        message_id.ack_set.extend(ack_set_words(entry.surviving, entry.batch_size))
    id_bytes = message_id.SerializeToString()
    return _U32.pack(len(id_bytes)) + id_bytes + _U32.pack(len(entry.data)) + entry.data


def decode_compacted_entry(data: bytes) -> CompactedEntry:
    """Inverse of ``encode_compacted_entry``; raises ``CompactorError`` on damaged bytes."""
    try:
        (id_size,) = _U32.unpack_from(data, 0)
        message_id = pb.MessageIdData.FromString(data[4 : 4 + id_size])
        (data_size,) = _U32.unpack_from(data, 4 + id_size)
    except (struct.error, DecodeError) as error:  # both mean the bytes are damaged
        raise CompactorError(f"damaged compacted entry: {error}") from None
    body = data[8 + id_size : 8 + id_size + data_size]
    if len(body) != data_size:
        raise CompactorError("damaged compacted entry: short data")
    position = Position(message_id.ledgerId, message_id.entryId)
    if not message_id.HasField("batch_size"):
        return CompactedEntry(position, body)
    surviving = tuple(
        index for index in range(message_id.batch_size)
        if (message_id.ack_set[index // 64] >> (index % 64)) & 1
    )
    return CompactedEntry(position, body, message_id.batch_size, surviving)


class CompactedView:
    """One published compacted view and the horizon it covers: an immutable value.

    ``ledger_ids`` (stream order), ``segments`` (``(ledger_id, stored entries)`` per
    ledger), ``marks`` (ledger id → ``LedgerMarks``, for the ledgers with any), ``horizon``,
    ``entries`` (live ones, all ledgers) and ``size`` (bytes stored, all ledgers) are fixed
    when the view is built; a run publishes a new view and the topic swaps it in whole
    (``CompactedTopic.publish``). ``ledger_id`` is the first ledger (Pulsar's one
    ``CompactedTopicLedger``: stats, the cursor property). The only thing that changes
    inside is the id cache of the start-point search, a memo of what the ledgers hold.
    """

    __slots__ = ("_ids", "_live", "_starts", "entries", "horizon", "ledger_ids", "live_segments", "marks",
                 "segments", "size", "sizes", "store")

    store: LedgerStore
    ledger_ids: tuple[int, ...]
    segments: tuple[tuple[int, int], ...]
    live_segments: tuple[tuple[int, int], ...]
    marks: dict[int, LedgerMarks]
    sizes: tuple[int, ...]
    horizon: Position
    entries: int
    size: int
    _starts: tuple[int, ...]
    _live: tuple[npt.NDArray[np.integer[Any]] | None, ...]
    _ids: OrderedDict[int, Position]

    def __init__(self, store: LedgerStore, ledger_ids: Sequence[int] | int, horizon: Position,
                 marks: Mapping[int, LedgerMarks] | None = None) -> None:
        """Read each sealed ledger's entry count and size (``LedgerNotFoundError`` naming
        the first one that is gone). ``ledger_ids``: at least one, in stream order (a bare
        id is a one-ledger view); ``marks``: the dead marks of its ledgers (those of other
        ledgers are ignored; a ledger with none has nothing dead)."""
        ids = (ledger_ids,) if isinstance(ledger_ids, int) else tuple(int(i) for i in ledger_ids)
        if not ids:
            raise ValueError("a compacted view needs at least one ledger (an empty one when nothing survived)")
        if len(set(ids)) != len(ids):
            raise ValueError(f"a compacted view lists a ledger twice: {ids}")
        counts = tuple(store.last_add_confirmed(ledger_id) + 1 for ledger_id in ids)
        sizes = tuple(store.info(ledger_id).size_bytes for ledger_id in ids)
        kept = {ledger_id: mark for ledger_id, mark in (marks or {}).items() if ledger_id in ids}
        for ledger_id, count in zip(ids, counts, strict=True):
            if ledger_id in kept and kept[ledger_id].entries != count:
                raise ValueError(f"dead marks of ledger {ledger_id} cover {kept[ledger_id].entries} entries, "
                                 f"it has {count}")
        live = tuple(kept[i].live_stored() if i in kept else None for i in ids)
        live_counts = tuple(count if stored is None else len(stored) for count, stored in zip(counts, live, strict=True))
        starts = [0]
        for count in live_counts:
            starts.append(starts[-1] + count)
        fields = {"store": store, "ledger_ids": ids, "segments": tuple(zip(ids, counts, strict=True)),
                  "live_segments": tuple(zip(ids, live_counts, strict=True)), "marks": kept,
                  "sizes": sizes, "horizon": horizon.entry_position(), "entries": starts[-1],
                  "size": sum(sizes), "_starts": tuple(starts), "_live": live, "_ids": OrderedDict[int, Position]()}
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"CompactedView is immutable: cannot set {name}")

    def __repr__(self) -> str:
        return (f"CompactedView(ledger_ids={list(self.ledger_ids)}, horizon={self.horizon}, "
                f"entries={self.entries}, size={self.size})")

    @property
    def ledger_id(self) -> int:
        """The first compacted ledger (Pulsar's ``CompactedTopicLedger``)."""
        return self.ledger_ids[0]

    def marks_of(self, ledger_id: int) -> LedgerMarks | None:
        """The dead marks of ``ledger_id`` (None: nothing of it is dead)."""
        return self.marks.get(ledger_id)

    @property
    def dead_messages(self) -> int:
        """Messages of the view's ledgers that later data superseded (not delivered)."""
        return sum(mark.dead_messages for mark in self.marks.values())

    def read(self, first_index: int, last_index: int, *, emptied: bool = False) -> list[CompactedEntry]:
        """Compacted entries ``first_index..last_index`` (inclusive) of the view, across
        its ledgers, dead ones skipped and dead slots off ``surviving`` (with ``emptied``,
        their bytes emptied too: ``CompactedEntry.emptied``, for a rewrite that parses them);
        ``PositionOutOfRangeError`` unless ``0 <= first <= last < entries``."""
        if not 0 <= first_index <= last_index < self.entries:
            raise PositionOutOfRangeError(
                f"compacted view {list(self.ledger_ids)}: read {first_index}..{last_index} "
                f"outside 0..{self.entries - 1}", ledger_id=self.ledger_id)
        entries: list[CompactedEntry] = []
        index = first_index
        while index <= last_index:
            segment = self._segment_of(index)
            start, end = self._starts[segment], self._starts[segment + 1]  # end: exclusive
            last = min(last_index, end - 1)
            entries.extend(self._read_segment(segment, index - start, last - start, emptied))
            index = last + 1
        return entries

    def _read_segment(self, segment: int, first: int, last: int, emptied: bool) -> list[CompactedEntry]:
        """Live entries ``first..last`` of one ledger (its live index space)."""
        ledger_id, live = self.ledger_ids[segment], self._live[segment]
        if live is None:
            stored = [(first, last)]
        else:  # the runs of consecutive stored indexes among the live ones asked for
            wanted = live[first:last + 1]
            breaks = np.flatnonzero(np.diff(wanted.astype(np.int64)) != 1) + 1
            stored = [(int(run[0]), int(run[-1])) for run in np.split(wanted, breaks)]
        entries = [decode_compacted_entry(d) for low, high in stored for d in self.store.read(ledger_id, low, high)]
        mark = self.marks.get(ledger_id)
        if mark is None or not len(mark.dead_slots):
            return entries
        at = np.concatenate([np.arange(low, high + 1, dtype=np.int64) for low, high in stored])
        starts = np.searchsorted(mark.dead_slots, at << 32)
        ends = np.searchsorted(mark.dead_slots, (at + 1) << 32)
        for place in np.flatnonzero(ends > starts).tolist():  # the entries with dead slots only
            dead = frozenset(int(key) & 0xFFFFFFFF for key in mark.dead_slots[starts[place]:ends[place]])
            entry = entries[place].without(dead)
            if emptied:
                entry = CompactedEntry(entry.position, entry.emptied(), entry.batch_size, entry.surviving)
            entries[place] = entry
        return entries

    def _segment_of(self, index: int) -> int:
        """The place in ``ledger_ids`` of the ledger holding ``index`` (0 <= index <
        entries): the last one starting at or before it, so empty ledgers are skipped."""
        return bisect.bisect_right(self._starts, index, hi=len(self.ledger_ids)) - 1

    def position_at(self, index: int) -> Position:
        """The original position of compacted entry ``index`` (through the id cache)."""
        cached = self._ids.get(index)
        if cached is not None:
            self._ids.move_to_end(index)
            return cached
        position = self.read(index, index)[0].position
        self._ids[index] = position
        if len(self._ids) > START_POINT_CACHE_ENTRIES_MAX:
            self._ids.popitem(last=False)
        return position

    def find_start(self, position: Position) -> int | None:
        """Index of the first compacted entry at or after ``position`` (entry level), or
        None when the ledger is empty or every entry is before ``position``."""
        target = position.entry_position()
        low, high = 0, self.entries
        while low < high:  # invariant: entries before low are < target, from high on ≥ target
            middle = (low + high) // 2
            if self.position_at(middle) < target:
                low = middle + 1
            else:
                high = middle
        return low if low < self.entries else None

    def read_from(self, position: Position, max_entries: int) -> list[CompactedEntry]:
        """Up to ``max_entries`` compacted entries at or after ``position``."""
        start = self.find_start(position)
        if start is None:
            return []
        return self.read(start, min(self.entries - 1, start + max_entries - 1))

    def iter_all(self) -> Iterator[CompactedEntry]:
        """Every compacted entry in order."""
        for first in range(0, self.entries, READ_BATCH_ENTRIES_MAX):
            yield from self.read(first, min(self.entries - 1, first + READ_BATCH_ENTRIES_MAX - 1))

    def last_message_id(self) -> Position | None:
        """The last surviving message (its batch index: the last surviving slot), or None
        when every key was deleted (an empty compacted ledger)."""
        if self.entries == 0:
            return None
        last = self.read(self.entries - 1, self.entries - 1)[0]
        batch_index = last.surviving[-1] if last.batch_size else -1
        return last.position.with_batch_index(batch_index)
