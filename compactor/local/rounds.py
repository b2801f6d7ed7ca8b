"""The local engine in bounded memory: a run in rounds whose key map never passes the budget.

The design is Kafka's cleaner's (and RocketMQ's): phase one fills the key map up to the
budget and stops at the entry where it filled; that round compacts up to there and
publishes it as the horizon; the next round starts from that view. A view only has to
cover a prefix of the topic up to its horizon (``pulsar-compaction.md``), so every round's
publish is a valid view, and a run that dies between rounds leaves the last one serving.

A round's input stream is the runner's: the previous compacted ledger (the *clean* part,
positions at or before the horizon), then the raw entries after the horizon (the *dirty*
part). Its key map (``KeyMap(keep_deleted=True)``) holds the dirty part's keys only, a
tombstone as a "deleted" entry, so it grows with the keys written since the horizon, never
with the topic's live keys:

* Phase one (``round_phase_one``) folds the dirty entries into the map as
  ``compactor.local.algorithm.phase_one`` does. Before an entry it checks that the map, with the
  entry's keyed messages added, stays within ``capacity_keys``; when it would not, the
  round stops before that entry (its *stop*). A round takes at least one dirty entry, so a
  single batch with more keys than the budget passes it by that batch alone. Clean entries
  only count, and say where their chunked messages complete (``compactor.local.chunks``).
* Phase two (``round_phase_two``): a clean message survives iff it survives today and its
  key is not in the map (a previous compacted ledger holds at most one value per key, so
  the dirty part decides: a later value or a delete of the key drops it); tombstones that
  are no longer young, markers and pending chunks follow ``compactor.local.slot_rule``.
  The dirty part then goes through ``compactor.local.algorithm.phase_two`` with the map's live
  positions, unchanged.

So one round over the whole stream equals ``compactor.local.algorithm.compact``, and rounds
compose because compacting A, then the result plus B, equals compacting A+B
(``tests/unit/compactor/test_rounds.py`` checks both, byte for byte).

Memory: the map holds at most ``capacity_keys`` entries of 24 bytes
(``KEY_MAP_BYTES_PER_KEY``), plus a merge's transient copy of them; chunked-message
completions take 33 bytes per chunked message (not per key), the clean part's completions
a further 48.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from compactor.engine import KEY_MAP_BYTES_PER_KEY
from compactor.local.algorithm import (
    CompactedEntry,
    PhaseOneResult,
    fold_entry,
    kept_entry,
    phase_two,
)
from compactor.local.chunks import EntryAt, Retained, UuidHash
from compactor.local.keymap import KeyMap, key_hash
from compactor.local.scan import EntryScan, scan_entry
from compactor.local.slot_rule import surviving_slots
from compactor.record import RoundFigures
from ledger.managed_ledger import Entry
from ledger.position import Position

__all__ = ["RoundPhaseOne", "capacity_keys", "round_phase_one", "round_phase_two"]


def capacity_keys(memory_budget_bytes: int) -> int:
    """The keys a round's map may hold within ``memory_budget_bytes`` (at least one)."""
    return max(1, memory_budget_bytes // KEY_MAP_BYTES_PER_KEY)


@dataclass
class RoundPhaseOne:
    """What a round's phase one learned.

    Attributes:
        result: counts over the clean and the dirty entries read; ``key_map`` holds the
            dirty part's keys (deleted ones included); ``chunks`` the completions of both
            parts; ``last_position`` is the round's stop (None: no dirty entry).
        horizon: the last position of the clean part.
        clean_completions: the clean part's keyed chunk completions (uuid hash, where,
            key hash).
        key_map_bytes_max: the most bytes the map held at once.
        filled: the round stopped because the map was full (else it read every entry).
        clean_keys_kept: keyed values of the clean part that survived (set by phase two).
    """

    result: PhaseOneResult
    horizon: Position
    clean_completions: list[tuple[UuidHash, EntryAt, tuple[int, int]]] = field(default_factory=list)
    key_map_bytes_max: int = 0
    filled: bool = False
    clean_keys_kept: int = 0

    @property
    def stop(self) -> Position | None:
        """The last entry of the round (None: it read no entry after the horizon)."""
        return self.result.last_position

    @property
    def keys_kept(self) -> int:
        """Live keys of the view this round writes (young tombstones included)."""
        return self.clean_keys_kept + self.result.key_map.live_keys()

    def figures(self, ledger_id: int, entries_written: int, bytes_written: int, messages_kept: int) -> RoundFigures:
        """The round's figures, given what its phase two wrote (known once it is consumed)."""
        result = self.result
        return RoundFigures(ledger_id, entries_written, bytes_written, messages_kept, self.keys_kept,
                            result.entries_read, result.messages_read, result.bytes_read, result.markers,
                            result.opaque_entries)


def round_phase_one(
    entries: Iterable[Entry], *, horizon: Position, capacity_keys: int, keep_tombstones_since_ms: int | None = None,
) -> RoundPhaseOne:
    """Phase one of a round over ``entries`` (see the module docstring); the iterator is
    left where the round stopped."""
    result = PhaseOneResult(key_map=KeyMap(keep_deleted=True), parse_again=set())
    one = RoundPhaseOne(result, horizon)
    key_map = result.key_map
    stream = iter(entries)
    for entry in stream:
        scan = scan_entry(entry.data)
        if entry.position > horizon:  # the first dirty entry: always taken
            fold_entry(result, entry, scan, keep_tombstones_since_ms)
            break
        _clean(one, entry, scan)
    else:
        result.last_position = None  # the clean part alone: nothing to compact
        return one
    for entry in stream:
        scan = scan_entry(entry.data)
        updates = _updates(scan)
        if key_map.keys_bound + updates > capacity_keys and not _room(key_map, updates, capacity_keys):
            one.filled = True
            break
        fold_entry(result, entry, scan, keep_tombstones_since_ms)
    one.key_map_bytes_max = key_map.nbytes_max
    return one


def _clean(one: RoundPhaseOne, entry: Entry, scan: EntryScan) -> None:
    """Count a clean entry, and record where a chunked message completes in it."""
    result = one.result
    result.entries_read += 1
    result.bytes_read += len(entry.data)
    result.last_position = entry.position
    if scan.kind == "opaque":
        result.opaque_entries += 1
        return
    if scan.kind == "marker":
        result.markers += 1
        return
    result.messages_read += len(scan.messages)
    if scan.chunk is not None and scan.chunk.is_last:
        [(_, key, _)] = scan.messages
        uuid_hash, at = key_hash(scan.chunk.uuid), (entry.position.ledger_id, entry.position.entry_id)
        result.chunks.complete(uuid_hash, at, keyless=key is None)
        if key is not None:
            one.clean_completions.append((uuid_hash, at, key_hash(key)))


def _updates(scan: EntryScan) -> int:
    """The key-map updates folding ``scan`` makes at most."""
    if scan.kind in ("opaque", "marker"):
        return 0
    if scan.chunk is not None:
        return int(scan.chunk.is_last and scan.messages[0][1] is not None)
    return sum(1 for _, key, _ in scan.messages if key is not None)


def _room(key_map: KeyMap, updates: int, capacity: int) -> bool:
    """``updates`` more keys keep ``key_map`` within ``capacity`` (merging if need be)."""
    if key_map.keys_bound + updates <= capacity:
        return True
    key_map.merge()
    return key_map.keys_bound + updates <= capacity


def round_phase_two(
    entries: Iterable[Entry], one: RoundPhaseOne, *, retain_null_key: bool = False,
    keep_tombstones_since_ms: int | None = None,
) -> Iterator[CompactedEntry]:
    """The survivors of the round's stream (clean part, then the dirty part up to the
    round's stop), in order; see the module docstring."""
    retained = _retained_chunks(one, retain_null_key)
    stream = iter(entries)
    for entry in stream:
        if entry.position > one.horizon:
            yield from phase_two(itertools.chain((entry,), stream), one.result, retain_null_key=retain_null_key,
                                 keep_tombstones_since_ms=keep_tombstones_since_ms)
            return
        survivor = _clean_survivor(one, entry, scan_entry(entry.data), retained, retain_null_key,
                                   keep_tombstones_since_ms)
        if survivor is not None:
            yield survivor


def _retained_chunks(one: RoundPhaseOne, retain_null_key: bool) -> Retained:
    """Per completion, whether its chunked message survives: a dirty one as phase two
    decides, a clean keyed one iff the dirty part never wrote its key."""
    result = one.result
    retained = result.chunks.retained(result.key_map.sorted_positions(), result.packer, retain_null_key)
    for uuid_hash, at, hashed in one.clean_completions:
        row = result.chunks.end_of(uuid_hash, at)
        assert row is not None
        retained[row] = not result.key_map.holds(hashed)
    return retained


def _clean_survivor(
    one: RoundPhaseOne, entry: Entry, scan: EntryScan, retained: Retained, retain_null_key: bool,
    keep_tombstones_since_ms: int | None,
) -> CompactedEntry | None:
    """What survives of one clean entry, or None; counts its surviving keyed values."""
    key_map = one.result.key_map
    keyed_kept = 0

    def latest(batch_index: int, key: str) -> bool:
        """A clean keyed value is still its key's latest iff the dirty part never wrote the key."""
        nonlocal keyed_kept
        del batch_index
        kept = not key_map.holds(key_hash(key))
        keyed_kept += kept
        return kept

    chunk_survives = scan.chunk is not None and one.result.chunks.survives(
        key_hash(scan.chunk.uuid), (entry.position.ledger_id, entry.position.entry_id), retained)
    keep = surviving_slots(scan, keep_tombstones_since_ms=keep_tombstones_since_ms, retain_null_key=retain_null_key,
                           latest=latest, chunk_survives=chunk_survives)
    if not keep:
        return None
    if scan.chunk is not None:
        keyed_kept = int(scan.chunk.is_last and scan.messages[0][1] is not None)
    one.clean_keys_kept += keyed_kept
    return kept_entry(entry, scan, keep)
