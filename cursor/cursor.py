"""Managed cursors: how far a subscription (or a reader) has read and acknowledged.

Behaviour follows Pulsar's ``ManagedCursorImpl`` (reference ``managed-ledger.md`` §3):

* ``mark_delete_position`` (MD): every entry at or before it is acknowledged; it may be
  ``(L, -1)``. It never moves backwards except through ``reset``.
* ``read_position`` (RP): the next entry to hand out; always after MD. It is **not**
  persisted: after a reopen ``RP = next_valid_position(MD)``, so everything unacknowledged
  is delivered again (duplicates, never loss).
* Individually acknowledged entries after MD are kept as runs (``AckedRanges``); when the
  entry right after MD becomes acknowledged, MD jumps over the whole run, across empty or
  deleted ledgers too.
* ``properties`` (``dict[str, int]``, Pulsar's mark-delete properties) are versioned with
  MD: a durable cursor persists ``(MD, ranges, properties)`` **in one transaction**, and
  only then changes its in-memory state, so a failed persist changes neither. A
  mark-delete without properties keeps the latest ones (never clears them); only
  ``reset`` without ``keep_properties`` clears them.
* Durable cursors hold data against trimming and survive reopen; non-durable ones (readers)
  live in memory only. A durable cursor persists through the ``CursorStore`` it is given
  (``store=``, ``cursor.store``: the cursor layer's tables on the shared database), never
  through the managed ledger.
* **Deferred persistence** (``deferred=True``: a subscription's cursor, the
  de-duplication cursor). Every change — the creation, acknowledgements (``mark_delete``,
  ``delete``), ``reset``, ``retreat_into_trimmed``, ``delete_durable`` — changes memory
  first (the in-memory state is what dispatch reads) and queues the new ``(MD, ranges,
  properties)`` (or the deletion) with the ``CursorStore``, whose thread writes it:
  acknowledgements on the persist schedule (at most ``mark_delete_rate_limit`` times a
  second; with 0, at once), the others at once. Nothing is committed on the caller's
  thread; ``when_written()`` is a future of the moment what is queued is durable (what the
  broker waits for before it answers a subscribe, a seek or an unsubscribe). A crash loses
  at most the changes queued and not yet written: acknowledgements are delivered again
  (at-least-once); the persisted state is always one the cursor had, never older than a
  previous persisted one. ``close`` writes what is queued. Without ``deferred`` (the
  ``__compaction`` cursor, whose mark-delete is the publish of a run), every change is
  persisted first, on the caller's thread, and memory changes only once it is.
* A read-compacted subscription also reads compacted entries whose raw ledgers were
  trimmed (they keep their original positions). Its ``compacted_successor`` names them:
  they can then be acknowledged like entries, and MD stops at the first unacknowledged one
  instead of crossing the trimmed prefix for free; ``retreat_into_trimmed`` puts the MD of
  a subscription that consumed none of them back before them.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future

from cursor.errors import CursorError, InvalidMarkDeletePositionError, MarkDeleteBackwardsError
from cursor.ranges import AckedRanges
from cursor.store import Also, CursorRecord, CursorStore
from ledger.managed_ledger import Entry, ManagedLedger
from ledger.position import EARLIEST, LATEST, Position

__all__ = ["UNACKED_RANGES_PERSIST_MAX", "InitialPosition", "ManagedCursor"]

# Pulsar's managedLedgerMaxUnackedRangesToPersist: beyond this many runs of acknowledged
# entries only the first ones are persisted; the rest are redelivered after a crash.
UNACKED_RANGES_PERSIST_MAX = 10_000
# Upper bound on entries one read_entries call pulls from the managed ledger per round.
READ_BATCH_ENTRIES_MAX = 1_000


class InitialPosition(enum.Enum):
    """Where a new durable cursor starts (Pulsar's ``InitialPosition``)."""

    LATEST = "Latest"
    EARLIEST = "Earliest"


class ManagedCursor:
    """One cursor over ``ledger``; build it with ``open_durable`` or ``open_non_durable``.

    A durable cursor needs ``store``, where it persists; a non-durable one has none.
    """

    def __init__(
        self,
        ledger: ManagedLedger,
        name: str,
        *,
        durable: bool,
        mark_delete_position: Position,
        properties: Mapping[str, int] | None = None,
        acked: AckedRanges | None = None,
        clock: Callable[[], float] = time.time,
        store: CursorStore | None = None,
        deferred: bool = False,
    ) -> None:
        if durable and store is None:
            raise ValueError(f"durable cursor {name} needs a CursorStore")
        self.ledger = ledger
        self.name = name
        self.durable = durable
        self.store = store
        self.deferred = deferred
        self._clock = clock
        self._mark_delete_position = mark_delete_position.entry_position()
        self._properties: dict[str, int] = dict(properties or {})
        self._acked = acked or AckedRanges()
        self.read_position = ledger.next_valid_position(self._mark_delete_position)
        self._confirmed = EARLIEST  # the last confirmed entry as last seen (a lower bound)
        self.messages_consumed_counter = 0
        self.compacted_successor: Callable[[Position], Position | None] | None = None
        """Read-compacted subscriptions: the first compacted entry after a position that lies
        before the first ledger (its raw ledger trimmed), or None; unset for the others."""

    # -- construction ---------------------------------------------------------------

    @classmethod
    def open_durable(
        cls,
        ledger: ManagedLedger,
        name: str,
        initial_position: InitialPosition = InitialPosition.LATEST,
        *,
        store: CursorStore,
        clock: Callable[[], float] = time.time,
        deferred: bool = False,
        create_at_once: bool = False,
    ) -> ManagedCursor:
        """Recover durable cursor ``name`` from ``store``, or create it there at
        ``initial_position``; ``deferred``: changes are persisted by the store's thread
        (see "Deferred persistence"), the creation too unless ``create_at_once`` (then it is
        persisted before this returns, on the caller's thread).

        ``initial_position`` only matters when the cursor is created. A recovered position
        in a ledger that no longer exists moves to ``(next ledger, -1)`` unless it is before
        every ledger left (trimmed: kept as is); one beyond the last confirmed entry is
        clamped to it.
        """
        record = store.load(ledger.name, name)
        if record is None:
            if initial_position is InitialPosition.EARLIEST:
                start = ledger.first_position()
            else:
                start = ledger.last_confirmed_position()
            cursor = cls(ledger, name, durable=True, mark_delete_position=start, clock=clock, store=store,
                         deferred=deferred)
            if cursor._persists_later and not create_at_once:
                cursor._persist_later(start, cursor._acked, cursor._properties, at_once=True)
            else:
                cursor._persist(start, cursor._acked, cursor._properties)
            return cursor
        position = _clamp_recovered(ledger, record.mark_delete_position)
        acked = AckedRanges(_existing_runs(ledger, record.individually_deleted))
        acked.drop_through(position)
        return cls(ledger, name, durable=True, mark_delete_position=position,
                   properties=record.properties, acked=acked, clock=clock, store=store, deferred=deferred)

    @classmethod
    def open_non_durable(
        cls, ledger: ManagedLedger, name: str, start: Position, *, inclusive: bool = True
    ) -> ManagedCursor:
        """A memory-only cursor whose first read returns the first entry at or after
        ``start`` (``inclusive``) or after it; ``EARLIEST``/``LATEST`` are understood.
        A batch index in ``start`` is ignored: the client filters slots of that entry."""
        start = start.entry_position()
        if start == EARLIEST:
            mark_delete_position = ledger.first_position()
        elif start == LATEST or start > ledger.last_confirmed_position():
            mark_delete_position = ledger.last_confirmed_position()
        elif inclusive:
            mark_delete_position = ledger.previous_position(start.entry_position())
        else:
            mark_delete_position = start.entry_position()
        return cls(ledger, name, durable=False, mark_delete_position=mark_delete_position)

    # -- state ----------------------------------------------------------------------

    @property
    def mark_delete_position(self) -> Position:
        """Every entry at or before this position is acknowledged."""
        return self._mark_delete_position

    @property
    def properties(self) -> dict[str, int]:
        """The mark-delete properties (a copy)."""
        return dict(self._properties)

    @property
    def acked_ranges(self) -> AckedRanges:
        """Individually acknowledged entries after the mark-delete position (a copy)."""
        return self._acked.copy()

    def is_acknowledged(self, position: Position) -> bool:
        """True when the entry at ``position`` is at or before MD or individually acked."""
        entry = position.entry_position()
        return entry <= self._mark_delete_position or entry in self._acked

    def _in_trimmed_prefix(self, position: Position) -> bool:
        """A position before the first ledger, in a ledger the topic trimmed."""
        return position.ledger_id < self.ledger.first_position().ledger_id

    def _next_position(self, position: Position) -> Position:
        """The entry after ``position``: the managed ledger's, or a compacted entry in the
        trimmed prefix before it (read-compacted subscriptions)."""
        following = self.ledger.next_valid_position(position)
        if self.compacted_successor is not None and self._in_trimmed_prefix(position):
            compacted = self.compacted_successor(position)
            if compacted is not None and compacted < following:
                return compacted
        return following

    def previous_position(self, position: Position) -> Position:
        """The entry before ``position``; in the trimmed prefix, the one before it in its
        ledger (a read-compacted subscription's cumulative ack inside a compacted batch)."""
        if self.compacted_successor is not None and self._in_trimmed_prefix(position):
            return Position(position.ledger_id, position.entry_id - 1)
        return self.ledger.previous_position(position)

    def _acknowledgeable(self, position: Position) -> bool:
        """An entry of the managed ledger, or (read-compacted) one in the trimmed prefix."""
        if self.compacted_successor is not None:
            if self._in_trimmed_prefix(position):
                return position.entry_id >= 0
        elif position.ledger_id == self._confirmed.ledger_id and 0 <= position.entry_id <= self._confirmed.entry_id:
            return True  # an entry before a confirmed one in its ledger exists (only an acked prefix is trimmed)
        return self.ledger.is_valid_position(position)

    def is_individually_acknowledged(self, position: Position) -> bool:
        """True when the entry at ``position`` is in the individually acknowledged runs
        after MD (what a read-compacted reader, which walks compacted positions the
        cursor does not read itself, must skip)."""
        return position.entry_position() in self._acked

    # -- reading --------------------------------------------------------------------

    def read_entries(self, max_entries: int) -> list[Entry]:
        """Up to ``max_entries`` unacknowledged entries from the read position on; the read
        position moves past what is returned (and past acknowledged entries skipped)."""
        result: list[Entry] = []
        while len(result) < max_entries:
            want = min(max_entries - len(result), READ_BATCH_ENTRIES_MAX)
            batch = self.ledger.read_entries(self.read_position, want)
            if not batch:
                break
            result.extend(entry for entry in batch if entry.position not in self._acked)
            self.read_position = self.ledger.next_valid_position(batch[-1].position)
        return result

    def has_more_entries(self) -> bool:
        """True when an entry at or after the read position is confirmed."""
        return self.read_position <= self.ledger.last_confirmed_position()

    def seek(self, read_position: Position) -> None:
        """Move only the read position, never to or before MD (a read-compacted reader
        walking the compacted view behind MD keeps its own position there)."""
        floor = self.ledger.next_valid_position(self._mark_delete_position)
        self.read_position = max(read_position.entry_position(), floor)

    def rewind(self) -> None:
        """Read again from the first entry after MD (what a reconnecting consumer gets)."""
        self.read_position = self.ledger.next_valid_position(self._mark_delete_position)

    # -- acknowledging --------------------------------------------------------------

    def mark_delete(self, position: Position, properties: Mapping[str, int] | None = None, *,
                    also: Also | None = None) -> None:
        """Cumulative acknowledgement of everything up to and including ``position``.

        ``properties=None`` keeps the latest properties. Raises
        ``InvalidMarkDeletePositionError`` past the last confirmed entry and
        ``MarkDeleteBackwardsError`` before MD; nothing changes then. ``also(db)`` runs
        inside the persisting transaction (``CursorStore.save``); only a durable cursor that
        persists at once (not ``deferred``) takes it.
        """
        if also is not None and (self.store is None or self._persists_later):
            raise CursorError(f"cursor {self.name}: only a cursor persisted at once runs statements with its save",
                              topic=self.ledger.name, cursor=self.name)
        position = position.entry_position()
        self._check_confirmed([position])
        if position < self._mark_delete_position:
            raise MarkDeleteBackwardsError(
                f"cursor {self.name}: mark-delete {position} is before {self._mark_delete_position}",
                topic=self.ledger.name, cursor=self.name,
            )
        new_properties = self._properties if properties is None else dict(properties)
        self._apply(position, self._acked.copy(), new_properties, also)

    def delete(self, positions: Iterable[Position]) -> None:
        """Individual acknowledgement of ``positions``; already acknowledged ones are skipped.

        Any position past the last confirmed entry fails the whole call, changing nothing.
        """
        entries = [position.entry_position() for position in positions]
        self._check_confirmed(entries)
        acked: AckedRanges | None = None  # copied on the first new entry: the installed one never changes
        for entry in entries:
            if not self.is_acknowledged(entry) and self._acknowledgeable(entry):
                if acked is None:
                    acked = self._acked.copy()
                acked.add(entry)
        if acked is not None:  # nothing new must not move the read position (a read-compacted reader's)
            self._apply(self._mark_delete_position, acked, self._properties)

    def retreat_into_trimmed(self, position: Position) -> None:
        """Move MD back to ``position``, before the first ledger, keeping acknowledgements
        and properties: a read-compacted subscription that acknowledged nothing of the
        ledgers left (MD at the first ledger's start) consumed none of the compacted entries
        whose raw ledgers were trimmed; this makes MD say so. Persisted first (deferred:
        queued)."""
        if self._mark_delete_position != self.ledger.first_position() or not self._in_trimmed_prefix(position):
            raise CursorError(
                f"cursor {self.name}: cannot move MD {self._mark_delete_position} back to {position}",
                topic=self.ledger.name, cursor=self.name,
            )
        position = position.entry_position()
        if self._persists_later:
            self._mark_delete_position = position
            self._persist_later(position, self._acked, self._properties, at_once=True)
        else:
            self._persist(position, self._acked, self._properties)
            self._mark_delete_position = position

    def reset(self, position: Position, *, keep_properties: bool = False) -> None:
        """Seek the subscription: the next read returns the first entry at or after
        ``position``; MD moves to the entry before it (possibly backwards); individual acks
        are forgotten; properties are cleared unless ``keep_properties`` (compaction cursor).
        Persisted first; a deferred cursor's is queued (``when_written()`` tells when durable).
        """
        position = position.entry_position()
        if position == EARLIEST:
            read_position = self.ledger.next_valid_position(self.ledger.first_position())
        elif position == LATEST or position > self.ledger.last_confirmed_position():
            read_position = self.ledger.next_valid_position(self.ledger.last_confirmed_position())
        elif self.ledger.is_valid_position(position.entry_position()):
            read_position = position.entry_position()
        else:
            read_position = self.ledger.next_valid_position(self.ledger.previous_position(position))
        mark_delete_position = self.ledger.previous_position(read_position)
        properties = self._properties if keep_properties else {}
        acked = AckedRanges()
        if not self._persists_later:
            self._persist(mark_delete_position, acked, properties)
        self._mark_delete_position = mark_delete_position
        self._acked = acked
        self._properties = dict(properties)
        self.read_position = read_position
        if self._persists_later:
            self._persist_later(mark_delete_position, acked, self._properties, at_once=True)

    def _check_confirmed(self, positions: list[Position]) -> None:
        """Raise unless every position is at or before the last confirmed entry (asking the
        managed ledger only when one is past the last confirmed entry seen: it only grows)."""
        if all(position <= self._confirmed for position in positions):
            return
        last = self._confirmed = self.ledger.last_confirmed_position()
        for position in positions:
            if position > last:
                raise InvalidMarkDeletePositionError(
                    f"cursor {self.name}: {position} is after the last confirmed entry {last}",
                    topic=self.ledger.name, cursor=self.name,
                )

    def _apply(self, position: Position, acked: AckedRanges, properties: Mapping[str, int],
               also: Also | None = None) -> None:
        """Advance MD over acknowledged runs, persist, and only then change memory.

        ``acked`` is a fresh copy (never the installed one): once installed, an
        ``AckedRanges`` and a properties dict are never changed again, so a deferred
        persist can build its record from them later, on the writer's thread."""
        before = self._mark_delete_position
        position = self._advance(position, acked)
        assert position >= before, f"cursor {self.name}: an acknowledgement moved MD back from {before} to {position}"
        acked.drop_through(position)
        later = self._persists_later
        if not later:
            self._persist(position, acked, properties, also)
        if before.ledger_id == position.ledger_id and self.compacted_successor is None:
            self.messages_consumed_counter += position.entry_id - before.entry_id  # entries are dense in a ledger
        else:
            self.messages_consumed_counter += self.ledger.entries_between(before, position)
        self._mark_delete_position = position
        self._acked = acked
        if properties is not self._properties:
            self._properties = dict(properties)
        if self.read_position <= position:
            self.read_position = self._next_position(position)
        if later:
            self._persist_later(position, acked, self._properties)

    def _advance(self, position: Position, acked: AckedRanges) -> Position:
        """``position`` moved over every acknowledged run that directly follows it.

        Short path (no compacted entries in play): an acknowledged entry right after
        ``position`` in its ledger is the next entry (entries are dense in a ledger, and
        only valid, confirmed entries are ever acknowledged), and with no run after
        ``position`` nothing more can follow; only a gap or a ledger boundary asks the
        managed ledger."""
        last_confirmed: Position | None = None
        while True:
            if self.compacted_successor is None:
                run = acked.run_at(position.ledger_id, position.entry_id + 1)
                if run is not None:
                    position = Position(position.ledger_id, run[1])
                    continue
                if not acked.any_after(position):
                    return position
            following = self._next_position(position)
            run = acked.run_containing(following)
            if run is None:
                return position
            if last_confirmed is None:
                last_confirmed = self.ledger.last_confirmed_position()
            if following > last_confirmed:
                return position
            position = Position(following.ledger_id, run[1])

    @property
    def writes_acks_at_once(self) -> bool:
        """A durable cursor whose acknowledgements are written without waiting for the
        persist schedule: not ``deferred``, or its store has no rate limit (0). Then
        ``when_written()`` right after an acknowledgement resolves once it is committed
        (the broker's ack receipt waits for it); otherwise an acknowledgement waits for the
        next scheduled write, up to ``1 / mark_delete_rate_limit`` seconds."""
        if self.store is None or not self.durable:
            return False
        return not self.deferred or self.store.mark_delete_rate_limit == 0

    @property
    def _persists_later(self) -> bool:
        """Changes are queued for the store's thread (see "Deferred persistence")."""
        return self.deferred and self.store is not None

    def _persist_later(self, position: Position, acked: AckedRanges, properties: Mapping[str, int], *,
                       at_once: bool = False) -> None:
        """Queue ``(MD, ranges, properties)``, installed and never changed again, for the
        store's thread (its record is built when it is written): on the persist schedule,
        or due now (``at_once``: a creation, a reset)."""
        if self.store is not None:
            queue = self.store.save_soon_from if at_once else self.store.save_later_from
            queue(self.ledger.name, self.name, lambda: self._record(position, acked, properties))

    def _persist(self, position: Position, acked: AckedRanges, properties: Mapping[str, int],
                 also: Also | None = None) -> None:
        """Write ``(MD, ranges, properties)`` in one transaction, now (durable cursors only),
        with ``also``'s statements."""
        if self.store is not None:
            self.store.save(self._record(position, acked, properties), also)

    def _record(self, position: Position, acked: AckedRanges, properties: Mapping[str, int]) -> CursorRecord:
        runs = tuple(itertools.islice(acked.runs(), UNACKED_RANGES_PERSIST_MAX))
        return CursorRecord(
            topic=self.ledger.name, name=self.name, mark_delete_position=position,
            individually_deleted=runs, properties=dict(properties),
            last_active_ms=int(self._clock() * 1000),
        )

    def close(self) -> None:
        """Write what is queued of this cursor's state now (a clean stop loses nothing)."""
        if self.store is not None and self.durable:
            self.store.flush(self.ledger.name, self.name)

    def when_written(self) -> Future[None]:
        """A future that resolves once this cursor's queued state is durable (at once when
        nothing is queued, or the cursor is not durable); see ``CursorStore.when_written``."""
        if self.store is not None and self.durable:
            return self.store.when_written(self.ledger.name, self.name)
        done = Future[None]()
        done.set_result(None)
        return done

    def flush_soon(self) -> None:
        """Have what is queued of this cursor's state written now, in the background."""
        if self.store is not None and self.durable:
            self.store.flush_soon(self.ledger.name, self.name)

    # -- backlog --------------------------------------------------------------------

    def backlog_entries(self) -> int:
        """Entries after MD up to the last confirmed one, less those acknowledged."""
        last = self.ledger.last_confirmed_position()
        md = max(self._mark_delete_position, self.ledger.first_position())  # the trimmed prefix holds none
        return self.ledger.entries_between(md, last) - self._acked.count_between(md, last)

    def entries_to_read(self) -> int:
        """Unacknowledged entries from the read position to the last confirmed one."""
        last = self.ledger.last_confirmed_position()
        before_read = max(self.ledger.previous_position(self.read_position), self.ledger.first_position())
        return self.ledger.entries_between(before_read, last) - self._acked.count_between(before_read, last)

    def estimated_backlog_bytes(self) -> int:
        """Bytes after MD, estimated as Pulsar does (individual acks ignored)."""
        return self.ledger.estimate_backlog_bytes(self._mark_delete_position)

    def delete_durable(self, also: Also | None = None) -> None:
        """Remove a durable cursor's persisted state (unsubscribe); it stops holding data.
        ``also(db)`` runs inside the delete transaction (on the caller's thread); without
        it, a deferred cursor's deletion is queued (``when_written()`` tells when durable)."""
        if self.store is not None:
            if self._persists_later and also is None:
                self.store.delete_later(self.ledger.name, self.name)
            else:
                self.store.delete(self.ledger.name, self.name, also)


def _existing_runs(ledger: ManagedLedger, runs: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Recovered acknowledged runs cut to the entries the ledgers hold (a crash without
    fsync may have lost a tail that was acknowledged): the cursor relies on every
    acknowledged entry being a confirmed one. Runs in ledgers no longer listed are kept
    (the trimmed prefix; ``drop_through`` or the compacted view decide about them)."""
    counts = {record.ledger_id: record.entries for record in ledger.ledger_list()}
    kept = []
    for ledger_id, first, last in runs:
        entries = counts.get(ledger_id)
        if entries is None:
            kept.append((ledger_id, first, last))
        elif first < entries:
            kept.append((ledger_id, first, min(last, entries - 1)))
    return kept


def _clamp_recovered(ledger: ManagedLedger, position: Position) -> Position:
    """A recovered MD must not pass the last entry, and one in a ledger that left the list
    moves to ``(next ledger, -1)`` — unless every ledger left is after it (the trimmed
    prefix): it is kept there, as it still precedes every entry, and ``(next ledger, -1)``
    would read as a cursor that never acknowledged anything, which a read-compacted
    subscription takes as "read the compacted view from the earliest" (whose entries keep
    their positions in trimmed ledgers), delivering everything it consumed again."""
    last = ledger.last_confirmed_position()
    if position > last:
        return last
    ledger_ids = [record.ledger_id for record in ledger.ledger_list()]
    if position.ledger_id in ledger_ids or all(ledger_id > position.ledger_id for ledger_id in ledger_ids):
        return position
    later = [ledger_id for ledger_id in ledger_ids if ledger_id > position.ledger_id]
    return Position(later[0], -1) if later else ledger.first_position()
