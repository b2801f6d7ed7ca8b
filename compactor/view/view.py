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
"""

from __future__ import annotations

import bisect
import struct
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from compactor.errors import CompactorError
from ledger.errors import PositionOutOfRangeError
from ledger.position import Position
from ledger.storage.base import LedgerStore
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

    ``ledger_ids`` (stream order), ``segments`` (``(ledger_id, entry_count)`` per ledger),
    ``horizon``, ``entries`` and ``size`` (bytes, all ledgers) are fixed when the view is
    built; a run publishes a new view and the topic swaps it in whole
    (``CompactedTopic.publish``). ``ledger_id`` is the first ledger (Pulsar's one
    ``CompactedTopicLedger``: stats, the cursor property). The only thing that changes
    inside is the id cache of the start-point search, a memo of what the ledgers hold.
    """

    __slots__ = ("_ids", "_starts", "entries", "horizon", "ledger_ids", "segments", "size", "sizes", "store")

    store: LedgerStore
    ledger_ids: tuple[int, ...]
    segments: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    horizon: Position
    entries: int
    size: int
    _starts: tuple[int, ...]
    _ids: OrderedDict[int, Position]

    def __init__(self, store: LedgerStore, ledger_ids: Sequence[int] | int, horizon: Position) -> None:
        """Read each sealed ledger's entry count and size (``LedgerNotFoundError`` naming
        the first one that is gone). ``ledger_ids``: at least one, in stream order (a bare
        id is a one-ledger view)."""
        ids = (ledger_ids,) if isinstance(ledger_ids, int) else tuple(int(i) for i in ledger_ids)
        if not ids:
            raise ValueError("a compacted view needs at least one ledger (an empty one when nothing survived)")
        if len(set(ids)) != len(ids):
            raise ValueError(f"a compacted view lists a ledger twice: {ids}")
        counts = tuple(store.last_add_confirmed(ledger_id) + 1 for ledger_id in ids)
        sizes = tuple(store.info(ledger_id).size_bytes for ledger_id in ids)
        starts = [0]
        for count in counts:
            starts.append(starts[-1] + count)
        fields = {"store": store, "ledger_ids": ids, "segments": tuple(zip(ids, counts, strict=True)),
                  "sizes": sizes, "horizon": horizon.entry_position(), "entries": starts[-1],
                  "size": sum(sizes), "_starts": tuple(starts), "_ids": OrderedDict[int, Position]()}
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

    def read(self, first_index: int, last_index: int) -> list[CompactedEntry]:
        """Compacted entries ``first_index..last_index`` (inclusive) of the view, across
        its ledgers; ``PositionOutOfRangeError`` unless ``0 <= first <= last < entries``."""
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
            entries.extend(decode_compacted_entry(d) for d in
                           self.store.read(self.ledger_ids[segment], index - start, last - start))
            index = last + 1
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
