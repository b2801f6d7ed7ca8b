"""A round of the local engine over key indexes: phase one as array work, phase two as copying.

``compactor.local.rounds`` parses every entry of a round twice. Over ledgers with a key index
(``compactor.local.key_index``) a round needs no parsing at all, except of the batches it must
rewrite:

* **Phase one** (``IndexedRound.plan``) reads each input ledger's index, not its entries.
  The clean part (the previous view's ledgers) is only counted. The dirty part's keyed rows
  become arrays ``(hash_high, hash_low, value)`` where the value is the row's number in the
  dirty stream, or ``DELETED`` for a tombstone that is no longer young; a stable sort by
  hash keeps each key's last value (Kafka's cleaner's offset map, built in bulk). The map
  holds at most ``capacity_keys`` keys, as a parsing round's does: the rows wait unsorted
  while the map and they fit the budget (24 bytes each, as the map's), and when a ledger's
  rows would pass it they are merged and the round stops before the first entry whose new
  key would not fit (a round takes at least one dirty entry). Then the clean part's keyed
  rows are looked up in the map: a clean value survives iff the dirty part never wrote its
  key. Keys are compared by their high 64 bits, with the low 64 bits checked wherever the
  high ones match: two keys differing only in the low half (about one chance in 2**64 per
  pair of keys) make the round give up on the index (``IndexUnavailable``) and parse.
* **Phase two** (``IndexedRound.survivors``) decides every row from arrays, then reads
  only the entries with a survivor: an entry all of whose messages survive is copied as
  stored (no parse); a batch with some dropped slots is decompressed, cut into slots at the
  index's ``slot_end`` and rewritten (``message.encoder.rewrite_slots``: one metadata
  parse, no slot parse); an entry with no survivor is never read.

The rules are ``compactor.local.rounds``' and ``compactor.local.algorithm``'s (tombstones, young
tombstones, key-less messages, markers, undecodable entries kept whole, ``compacted_out``
slots): the one ``compactor.local.slot_rule``, in its array form, so an indexed round's view equals a parsing round's byte for byte
(``tests/unit/compactor/test_indexed.py``). A round whose input holds a chunk gives up on
the index (``IndexUnavailable``): chunks need ``compactor.local.chunks``' bookkeeping, which
parses. Where a round stops when the budget fills may differ from a parsing round's (the
parsing round counts a batch's keys before it dedups them); every round's view is valid,
and the run's last view is the same.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from compactor.engine import LedgerRange
from compactor.errors import CompactorError
from compactor.local.key_index import (
    COLUMNS,
    FLAG_CHUNK,
    FLAG_COMPACTED_OUT,
    FLAG_KEYLESS,
    FLAG_MARKER,
    FLAG_OPAQUE,
    FLAGS_NOT_A_MESSAGE,
    FLAGS_NOT_A_VALUE,
    KeyIndex,
    entry_starts,
)
from compactor.local.slot_rule import LatestRows, old_tombstones, surviving_rows
from compactor.record import RoundFigures
from compactor.view.marks import LedgerMarks
from compactor.view.view import CompactedEntry, decode_compacted_entry
from ledger.position import Position
from message.compression import decompress
from message.encoder import COMPACTED_OUT_SLOT, reframe_batch
from message.entry import parse_header

__all__ = ["DELETED", "IndexUnavailable", "IndexedRound", "OutputIndex", "compacted_entries"]

U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
Rows = dict[str, npt.NDArray[Any]]
"""Index columns by name (``compactor.local.key_index``), some rows of them."""

DELETED = np.uint64((1 << 64) - 1)
"""The value of a key whose last message in the dirty part is a tombstone that is not young."""
_BYTES_PER_KEY = 24  # a row waiting to be merged, and a key in the map: high, low, value
# The index columns each step reads.
# (``publish_time`` too, where tombstones may be young.)
_PHASE_ONE = ("flags", "hash_high", "hash_low", "entry_bytes")
_CLEAN = ("flags", "hash_high", "hash_low")
_PHASE_TWO = ("batch_index", "batch_size", "flags", "slot_end")
_POSITIONS = ("ledger_id", "entry_id")  # a compacted range's (a raw one's are its ledger and stored index)
_OUTPUT = ("hash_high", "hash_low", "publish_time")  # what the written ledger's index needs besides
# Entries with a survivor asked for at once in phase two.
READ_BATCH_ENTRIES_MAX = 1000


class IndexUnavailable(CompactorError):
    """The round's input cannot be compacted from its indexes (a chunk, or two keys whose
    hashes share their high 64 bits): the caller parses instead."""


@dataclass
class _KeyMap:
    """The dirty part's keys: high halves (sorted, distinct), low halves and values."""

    high: U64 = field(default_factory=lambda: np.empty(0, np.uint64))
    low: U64 = field(default_factory=lambda: np.empty(0, np.uint64))
    value: U64 = field(default_factory=lambda: np.empty(0, np.uint64))
    waiting: list[tuple[U64, U64, U64]] = field(default_factory=list)
    waiting_rows: int = 0
    nbytes_max: int = 0

    def add(self, high: U64, low: U64, value: U64) -> None:
        """Rows in stream order, merged later."""
        self.waiting.append((high, low, value))
        self.waiting_rows += len(high)
        self.nbytes_max = max(self.nbytes_max, (len(self.high) + self.waiting_rows) * _BYTES_PER_KEY)

    def merge(self) -> None:
        """Fold the waiting rows in: a stable sort by high half keeps each key's last value."""
        if not self.waiting:
            return
        parts = [(self.high, self.low, self.value), *self.waiting] if len(self.high) else self.waiting
        self.waiting, self.waiting_rows = [], 0
        high = parts[0][0] if len(parts) == 1 else np.concatenate([part[0] for part in parts])
        order = np.argsort(high, kind="stable")
        high = high[order]  # one sorted column at a time: the unsorted one is let go at once
        same = high[1:] == high[:-1]
        last = np.ones(len(high), dtype=bool)
        last[:-1] = ~same
        low = (parts[0][1] if len(parts) == 1 else np.concatenate([part[1] for part in parts]))[order]
        if np.any(same & (low[1:] != low[:-1])):
            raise IndexUnavailable("two keys' hashes share their high 64 bits")
        del same
        value = (parts[0][2] if len(parts) == 1 else np.concatenate([part[2] for part in parts]))[order[last]]
        del parts, order
        self.high, self.low, self.value = high[last], low[last], value

    def find(self, high: U64, low: U64) -> Mask:
        """Which of the keys ``(high, low)`` the (merged) map holds, deleted or not."""
        if not len(self.high):
            return np.zeros(len(high), dtype=bool)
        at = np.searchsorted(self.high, high)
        inside = at < len(self.high)
        found = np.zeros(len(high), dtype=bool)
        found[inside] = self.high[at[inside]] == high[inside]
        if np.any(found & (self.low[np.minimum(at, len(self.low) - 1)] != low)):
            raise IndexUnavailable("two keys' hashes share their high 64 bits")
        return found

    def new_keys(self, high: U64) -> Mask:
        """Which of ``high`` (stream order) is the first of its key, a key not in the (merged)
        map."""
        at = np.searchsorted(self.high, high)
        inside = at < len(self.high)
        new = np.ones(len(high), dtype=bool)
        new[inside] = self.high[at[inside]] != high[inside]
        first = np.zeros(len(high), dtype=bool)
        _, first_at = np.unique(high[new], return_index=True)
        first[np.flatnonzero(new)[first_at]] = True
        return first


@dataclass
class _Source:
    """One range of the round's input and its index rows (those of the range's entries)."""

    range: LedgerRange
    rows: int  # how many of the range's rows the round takes (all but where it stopped)
    dirty_base: int = 0  # the dirty-stream number of the first row (dirty sources)
    clean_keep: Mask | None = None  # the clean part's surviving rows, decided in phase one


class IndexedRound:
    """One round over indexes (see the module docstring).

    ``load(range, columns)`` gives the index of a range's ledger (at least ``columns``); ``read(range, stored)`` the stored
    bytes of its entries ``stored`` (ascending indexes in the ledger; charged to the run's
    throttle by the caller).
    """

    def __init__(
        self, ranges: tuple[LedgerRange, ...], *, capacity_keys: int, keep_tombstones_since_ms: int | None,
        retain_null_key: bool, load: Callable[[LedgerRange, tuple[str, ...]], KeyIndex],
        read: Callable[[LedgerRange, list[int]], list[bytes]], dead: Mapping[int, LedgerMarks] | None = None,
    ) -> None:
        self.ranges = ranges
        self.capacity_keys = capacity_keys
        self.keep_since = keep_tombstones_since_ms
        self._young: tuple[str, ...] = () if keep_tombstones_since_ms is None else ("publish_time",)
        self.retain_null_key = retain_null_key
        self._load, self._read = load, read
        self._dead = dict(dead or {})  # the clean ledgers' dead marks (``compactor.view.marks``)
        self.key_map = _KeyMap()
        self.filled = False
        self.stop: Position | None = None
        self.entries_read = self.messages_read = self.bytes_read = self.markers = self.opaque_entries = 0
        self.clean_keys_kept = 0
        self._plan: list[_Source] = []

    @property
    def keys_kept(self) -> int:
        """Live keys of the view this round writes (known once ``survivors`` is consumed)."""
        return self.clean_keys_kept + int(np.count_nonzero(self.key_map.value != DELETED))

    def figures(self, ledger_id: int, entries_written: int, bytes_written: int, messages_kept: int) -> RoundFigures:
        """The round's figures, given what ``survivors`` wrote (known once it is consumed)."""
        return RoundFigures(ledger_id, entries_written, bytes_written, messages_kept, self.keys_kept,
                            self.entries_read, self.messages_read, self.bytes_read, self.markers,
                            self.opaque_entries)

    # -- phase one ------------------------------------------------------------------------

    def plan(self) -> None:
        """Phase one; raises ``IndexUnavailable`` when the round must parse instead."""
        dirty_rows = 0
        for whole in self.ranges:
            rows = self._rows(whole, _PHASE_ONE + self._young)
            if np.any(rows["flags"] & FLAG_CHUNK):
                raise IndexUnavailable(f"ledger {whole.ledger_id} holds a chunked message")
            source = _Source(whole, len(rows["flags"]), dirty_rows)
            if not whole.compacted:
                rows = self._fold(rows, dirty_rows, first=not self._dirty_planned())
                source.rows = len(rows["flags"])
                dirty_rows += source.rows
            self._count(whole, rows)
            self._plan.append(source)
            if self.filled:
                break
        self.key_map.merge()
        for source in self._plan:
            if source.range.compacted:
                rows = self._rows(source.range, _CLEAN + ("batch_index",) + self._young)
                source.clean_keep = self._clean_keep(rows)
                marks = self._dead.get(source.range.ledger_id)
                if marks is not None and marks.any_dead:  # dead slots are not the view's
                    source.clean_keep &= ~marks.dead_rows(rows["stored"], rows["batch_index"])

    def _dirty_planned(self) -> bool:
        return any(not source.range.compacted for source in self._plan)

    def _rows(self, whole: LedgerRange, columns: tuple[str, ...]) -> Rows:
        """The index rows of ``whole``'s entries (``columns`` of them, and ``stored``)."""
        index = self._load(whole, columns)
        stored = index["stored"]
        first, last = np.searchsorted(stored, [whole.first_entry_id, whole.last_entry_id + 1])
        return {name: column[first:last] for name, column in index.columns.items()}

    def _fold(self, rows: Rows, base: int, *, first: bool) -> Rows:
        """Add one dirty range's keyed rows to the map; when the budget fills, the rows are
        cut before the first entry that does not fit (the round's stop), and returned."""
        flags = rows["flags"]
        keyed = np.flatnonzero((flags & FLAGS_NOT_A_VALUE) == 0)
        high, low = rows["hash_high"][keyed], rows["hash_low"][keyed]
        value = keyed.astype(np.uint64) + np.uint64(base)
        deleted = old_tombstones(flags, rows.get("publish_time"), self.keep_since)[keyed]
        value[deleted] = DELETED
        key_map = self.key_map
        if len(key_map.high) + key_map.waiting_rows + len(keyed) > self.capacity_keys:
            key_map.merge()
            end = self._cut(rows, keyed, key_map.new_keys(high), first)
            if end is not None:
                rows = {name: column[:end] for name, column in rows.items()}
                kept = keyed < end
                high, low, value = high[kept], low[kept], value[kept]
                self.filled = True
        key_map.add(high, low, value)
        return rows

    def _cut(self, rows: Rows, keyed: npt.NDArray[np.intp], new: Mask, first: bool) -> int | None:
        """Where the range's rows end when the map fills in it (None: it does not), by a
        parsing round's rule: the round stops before the first entry (not the round's first)
        whose keyed messages, added to the distinct keys met before it, pass the budget."""
        stored = rows["stored"]
        starts = entry_starts(stored)
        keyed_rows = np.zeros(len(stored), dtype=np.int64)
        keyed_rows[keyed] = 1
        new_rows = np.zeros(len(stored) + 1, dtype=np.int64)
        new_rows[keyed[new] + 1] = 1
        met_before = len(self.key_map.high) + np.cumsum(new_rows)[starts]
        over = np.flatnonzero(met_before + np.add.reduceat(keyed_rows, starts) > self.capacity_keys)
        over = over[over > 0] if first else over
        return int(starts[over[0]]) if len(over) else None

    def _count(self, whole: LedgerRange, rows: Rows) -> None:
        """Count a range's entries, messages, bytes, markers and opaque entries; a raw range's last entry is the
        round's stop so far (a raw ledger's entries are stored at their entry ids)."""
        stored = rows["stored"]
        if not len(stored):
            return
        starts = entry_starts(stored)
        self.entries_read += len(starts)
        self.bytes_read += int(rows["entry_bytes"][starts].astype(np.int64).sum())
        self.messages_read += int(np.count_nonzero((rows["flags"] & FLAGS_NOT_A_MESSAGE) == 0))
        self.markers += int(np.count_nonzero(rows["flags"] & FLAG_MARKER))
        self.opaque_entries += int(np.count_nonzero(rows["flags"] & FLAG_OPAQUE))
        if not whole.compacted:
            self.stop = Position(whole.ledger_id, int(stored[-1]))

    def _clean_keep(self, rows: Rows) -> Mask:
        """A clean keyed value is still its key's latest iff the dirty part never wrote its
        key (``slot_rule``)."""
        def latest(asked: Mask) -> Mask:
            return ~self.key_map.find(rows["hash_high"][asked], rows["hash_low"][asked])

        return self._keep(rows, latest)

    def _keep(self, rows: Rows, latest: LatestRows) -> Mask:
        """The surviving rows (``slot_rule.surviving_rows``) given the lookup ``latest``."""
        flags = rows["flags"]
        old = old_tombstones(flags, rows.get("publish_time"), self.keep_since)
        return surviving_rows(flags, old=old, retain_null_key=self.retain_null_key, latest=latest)

    # -- phase two ------------------------------------------------------------------------

    def survivors(self, output: OutputIndex | None = None) -> Iterator[CompactedEntry]:
        """Phase two: the surviving entries of the round's stream, in order; ``output``
        collects the key index of the ledger they make (``OutputIndex``)."""
        retained = np.sort(self.key_map.value[self.key_map.value != DELETED])
        for source in self._plan:
            columns = _PHASE_TWO + self._young + (_POSITIONS if source.range.compacted else ()) + (
                () if output is None else _OUTPUT)
            rows = {name: column[: source.rows] for name, column in self._rows(source.range, columns).items()}
            if source.clean_keep is not None:
                keep = source.clean_keep
                self.clean_keys_kept += int(np.count_nonzero(keep & ((rows["flags"] & FLAGS_NOT_A_VALUE) == 0)))
            else:
                keep = self._dirty_keep(rows, source.dirty_base, retained)
            whole = source.range
            yield from compacted_entries(rows, keep, partial(self._read, whole), compacted=whole.compacted,
                                         raw_ledger_id=None if whole.compacted else whole.ledger_id, output=output)

    def _dirty_keep(self, rows: Rows, base: int, retained: U64) -> Mask:
        """A dirty keyed value is its key's latest iff its stream number is retained."""
        count = len(rows["flags"])
        low, high = np.searchsorted(retained, [base, base + count])
        last = np.zeros(count, dtype=bool)
        last[(retained[low:high] - np.uint64(base)).astype(np.int64)] = True
        return self._keep(rows, lambda asked: last[asked])


def compacted_entries(
    rows: Rows, keep: Mask, read: Callable[[list[int]], Iterable[bytes]], *, compacted: bool,
    raw_ledger_id: int | None = None, output: OutputIndex | None = None,
) -> Iterator[CompactedEntry]:
    """The compacted entries of the index ``rows`` of one range whose rows ``keep`` survive,
    in order (phase two of both engines: this module's rounds, ``compactor.spark.index_scan``).

    Only entries with a survivor are read, ``READ_BATCH_ENTRIES_MAX`` at a time through
    ``read`` (stored indexes, ascending, to their stored bytes); a compacted range's
    (``compacted``) are decoded first. An entry that is one message or kept whole is copied
    as stored; a batch is kept as stored when every live slot survives, else cut
    (``_batch``). Positions are the rows' ``ledger_id`` and ``entry_id``, or, given
    ``raw_ledger_id``, that ledger's at the stored index (a raw ledger's entries are stored
    at their entry ids)."""
    stored = rows["stored"]
    if not len(stored):
        return
    starts = entry_starts(stored)
    kept = np.add.reduceat(keep.astype(np.int64), starts)
    messages = np.add.reduceat(((rows["flags"] & FLAGS_NOT_A_MESSAGE) == 0).astype(np.int64), starts)
    ends = np.append(starts[1:], len(stored))
    wanted = np.flatnonzero(kept).tolist()
    starts_of, ends_of, whole_of = starts.tolist(), ends.tolist(), (kept == messages).tolist()
    stored_of = stored[starts].tolist()
    if raw_ledger_id is None:
        ledger_of, entry_of = rows["ledger_id"][starts].tolist(), rows["entry_id"][starts].tolist()
    else:
        ledger_of, entry_of = [raw_ledger_id] * len(stored_of), stored_of
    batched_of = ((rows["batch_size"][starts] > 0) & ((rows["flags"][starts] & FLAG_OPAQUE) == 0)).tolist()
    for first in range(0, len(wanted), READ_BATCH_ENTRIES_MAX):
        entries = wanted[first:first + READ_BATCH_ENTRIES_MAX]
        for entry, data in zip(entries, read([stored_of[entry] for entry in entries]), strict=True):
            if compacted:
                data = decode_compacted_entry(data).data
            position = Position(ledger_of[entry], entry_of[entry])
            start, end = starts_of[entry], ends_of[entry]
            if not batched_of[entry]:  # one message, or an entry kept whole as it is
                survivor = CompactedEntry(position, data)
            else:
                survivor = _batch(position, rows, start, end, keep[start:end], whole_of[entry], data)
            if output is not None:
                output.add(rows, (start, end), keep[start:end], whole_of[entry] or not batched_of[entry], survivor)
            yield survivor

# Rows of a compacted ledger's key index a round holds before handing them on as a part
# (about 70 bytes a row): a large input ledger is not one part.
OUTPUT_PART_ROWS_MAX = 262_144


class OutputIndex:
    """The key index of the compacted ledger a round writes, made from its input's index rows
    as ``compacted_entries`` yields each survivor (no parse): the rows of an entry copied
    whole are its input rows; a cut batch's dropped slots become ``compacted_out`` rows and
    its slot ends are those of the cut body. The rows, handed to ``write`` part after part,
    in order, are ``key_index.build_index`` over the ledger written
    (``tests/unit/compactor/test_indexed.py``, ``tests/unit/compactor/test_incremental.py``).

    It never holds the round's rows, only one part's: ``add`` notes each survivor (its span
    of input rows and a few scalars); the rows of the survivors taken from one input
    ``rows``, at most ``part_rows_max`` of them (or one survivor's), are one part, made at
    once, as array work over all of them, when the next survivor comes from other rows or
    would pass that bound, or at ``finish``, handed to ``write`` (every column of
    ``key_index.COLUMNS``) and let go. Until then the ``rows`` and ``keep`` arrays given to
    ``add`` must not change. The ledger's layout comes from its writer: ``placed`` is told
    each survivor's record offset and stored size once the writer has taken it, before
    the next survivor is asked for (``write_sealed_ledger``'s ``placed``); ``finish`` is
    called once the ledger is written."""

    _COPIED = ("batch_index", "batch_size", "hash_high", "hash_low", "flags", "publish_time", "slot_end")

    def __init__(self, write: Callable[[Rows], object], part_rows_max: int = OUTPUT_PART_ROWS_MAX) -> None:
        self._write = write
        self._part_rows_max = part_rows_max
        self.entries = 0
        self._rows: Rows | None = None  # the input rows of the pending survivors
        self._pending_rows = 0
        self._pending: list[tuple[int, int, bool, int, int, int]] = []  # start, end, whole, position, size
        self._cut_keeps: list[Mask] = []  # each pending cut batch's kept rows, in order
        self._offsets, self._lengths = array("q"), array("q")  # the pending survivors' layout, as placed

    def add(self, rows: Rows, span: tuple[int, int], keep: Mask, whole: bool, survivor: CompactedEntry) -> None:
        """Note ``survivor``, the next entry of the ledger, made from its input ``rows``
        ``span`` (``start, end``): copied as stored when ``whole``, else a batch cut to the
        rows ``keep`` (``keep[i]``: row ``start + i`` survives)."""
        if rows is not self._rows or self._pending_rows >= self._part_rows_max:
            self._flush()  # every pending survivor was placed: the writer took it before asking for this one
            self._rows = rows
        position = survivor.position
        self._pending.append((span[0], span[1], whole, position.ledger_id, position.entry_id, len(survivor.data)))
        self._pending_rows += span[1] - span[0]
        if not whole:
            self._cut_keeps.append(keep)
        self.entries += 1

    def placed(self, offset: int, length: int) -> None:
        """The next survivor's record starts at ``offset`` in the ledger file and stores
        ``length`` bytes."""
        self._offsets.append(offset)
        self._lengths.append(length)

    def finish(self) -> None:
        """Hand on the last part (every survivor was added and placed)."""
        self._flush()
        self._rows = None

    def _flush(self) -> None:
        """Make the rows of the pending survivors (all from ``self._rows``) into one part
        and hand it to ``write``."""
        pending, rows = self._pending, self._rows
        if not pending or rows is None:
            return
        if len(self._offsets) != len(pending):
            raise RuntimeError(f"{len(self._offsets)} survivors placed in the ledger, {len(pending)} expected")
        starts_of, ends_of, whole_of, ledger_of, entry_of, size_of = zip(*pending, strict=True)
        starts, ends = np.array(starts_of, np.int64), np.array(ends_of, np.int64)
        counts = ends - starts
        firsts = np.cumsum(counts) - counts  # each entry's first row in the part
        gather = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - firsts, counts)
        part = {name: rows[name][gather] for name in self._COPIED}
        del gather
        first_stored = self.entries - len(pending)
        part["stored"] = np.repeat(np.arange(first_stored, self.entries, dtype=np.uint32), counts)
        part["ledger_id"] = np.repeat(np.array(ledger_of, np.uint64), counts)
        part["entry_id"] = np.repeat(np.array(entry_of, np.uint64), counts)
        part["entry_bytes"] = np.repeat(np.array(size_of, np.uint32), counts)
        part["entry_offset"] = np.repeat(np.frombuffer(self._offsets, np.int64).astype(np.uint64), counts)
        part["stored_bytes"] = np.repeat(np.frombuffer(self._lengths, np.int64).astype(np.uint32), counts)
        cut = ~np.array(whole_of, dtype=bool)
        if self._cut_keeps:  # the cut batches: what ``_cut_body`` made of them
            at = np.flatnonzero(np.repeat(cut, counts))  # their rows, entry after entry
            dropped = ~np.concatenate(self._cut_keeps)
            part["hash_high"][at[dropped]] = 0
            part["hash_low"][at[dropped]] = 0
            part["flags"][at[dropped]] = FLAG_COMPACTED_OUT | FLAG_KEYLESS
            cut_counts = counts[cut]
            cut_firsts = np.cumsum(cut_counts) - cut_counts  # each cut batch's first row among ``at``
            slot_ends = part["slot_end"][at].astype(np.int64)
            lengths = np.diff(slot_ends, prepend=0)
            lengths[cut_firsts] = slot_ends[cut_firsts]  # a batch's first slot starts at 0
            lengths[dropped] = len(COMPACTED_OUT_SLOT)
            sums = np.cumsum(lengths)
            sums -= np.repeat(sums[cut_firsts] - lengths[cut_firsts], cut_counts)  # summed batch by batch
            part["slot_end"][at] = sums.astype(np.uint32)
        self._pending, self._cut_keeps, self._pending_rows = [], [], 0
        self._offsets, self._lengths = array("q"), array("q")
        self._write({name: part[name] for name, _ in COLUMNS})


def _batch(position: Position, rows: Rows, start: int, end: int, keep: Mask, whole: bool, data: bytes) -> CompactedEntry:
    """The compacted entry of the batch whose rows are ``start..end`` (some kept): as
    stored when every live slot is kept, else rewritten."""
    batch_size = int(rows["batch_size"][start])
    surviving = tuple(rows["batch_index"][start:end][keep].tolist())
    if not whole:
        metadata, header_size, has_checksum = parse_header(data)
        body = decompress(metadata.compression, data[header_size:], metadata.uncompressed_size)
        body = _cut_body(body, rows["slot_end"][start:end].tolist(), keep.tolist())
        data = reframe_batch(metadata, body, with_checksum=has_checksum)
    return CompactedEntry(position, data, batch_size, surviving)


def _cut_body(body: bytes, slot_ends: list[int], keep: list[bool]) -> bytes:
    """``body`` with every slot not in ``keep`` replaced by ``COMPACTED_OUT_SLOT`` (as
    ``message.encoder.rewrite_slots`` does)."""
    view = memoryview(body)
    pieces: list[bytes | memoryview] = []
    start = 0
    for end, kept in zip(slot_ends, keep, strict=True):
        pieces.append(view[start:end] if kept else COMPACTED_OUT_SLOT)
        start = end
    return b"".join(pieces)
