"""The cursor layer's tables on the shared metadata database: durable cursors.

``CursorStore`` owns the ``cursor`` component of ``ledger.database.Database``:

* ``cursors``: each durable cursor's mark-delete position, individually acknowledged
  ranges and when it was last saved;
* ``cursor_properties``: its mark-delete properties (``dict[str, int]``), written with the
  position **in one transaction** by ``save``.

Both tables are declared as the topic's rows (deleted with the topic, in the ledger
layer's delete transaction), and ``cursors``' mark-delete position as a hold: the managed
ledger never trims past the slowest one, persisted.

``ManagedCursor`` gets its store injected (``store=``); nothing else reads or writes these
rows but through this class. Faults are injected through the database's fault points
(``ledger.database``): the transactions here are named ``cursor.save``,
``cursor.save_batch`` (each with a ``cursor.save.between_position_and_properties``
checkpoint per cursor inside) and ``cursor.delete``. ``save`` and ``delete`` take an
optional ``also(connection)``: more statements of a layer above, run inside the same
transaction after the cursor's rows (the compactor's manifest is published with the
``__compaction`` cursor's mark-delete this way).

**Deferred saves: the persist schedule.** ``save`` writes at once, on the caller's thread.
``save_later`` (a subscription's acknowledgements) only queues the cursor's latest record;
a background thread writes it once ``1 / mark_delete_rate_limit`` seconds have passed
since that cursor's previous write (Pulsar's ``managedLedgerDefaultMarkDeleteRateLimit``:
at most that many persists a second per cursor; the first record after a quiet spell is
written at once), every cursor due at the same time in **one transaction**. So a cursor
acknowledged thousands of times a second costs one commit per interval, and nothing waits
for it: the caller's in-memory cursor is what dispatch reads. What a crash (kill -9) can
lose is what was queued and not yet written: the changes made since the start of the
cursor's last committed write, at most one interval plus two commits (the one before the
interval and the one in flight) old, which are delivered again (at-least-once). With no
rate limit (0) each queued record is due at once; ``when_written`` then tells the caller
when its acknowledgement is committed (the broker's ack receipt waits for it).

The order of writes is the order of saves: a write takes the queued records and commits
them under one lock (``_write_lock``), so a persisted state never goes back to an older
one (asserted: a queued acknowledgement never moves a persisted mark-delete back; only a
creation, a reset, or the first write after a ``load`` (a recovery may clamp MD back) may); ``save`` and ``delete`` drop what is queued for their cursor in the same lock (a
queued record never brings a deleted cursor back). ``flush`` writes what is queued now
(a cursor's, a topic's, or all: closing a topic, a clean shutdown); ``discard`` forgets a
topic's queue (the topic is being deleted); ``close`` flushes everything and stops the
thread. A failed background write is logged and retried one interval later (at least
``WRITE_RETRY_MIN_S``); the queued record stays the cursor's newest, which ``load`` returns.

**Waiting for a write, off the caller's thread.** ``when_written(topic, name)`` makes what is
queued for a cursor due now and returns a future that resolves once it is committed (at
once when nothing is queued or being written), or fails with the write's error (the
record stays queued and is retried). ``delete_later`` queues a cursor's deletion the same
way (a deletion is a queued state: ``load`` then returns None, ``list`` leaves it out, a
later save brings it back), and ``flush_later(topic)`` makes a topic's queued records due
now and returns one future for them. The broker's event loop uses these three to answer a
subscribe, an unsubscribe, a seek or a subscription delete only once its cursor state is
durable, without ever committing on the loop. A store without a background thread
(``background=False``), or closed, does each of them at once on the caller's thread.
"""

from __future__ import annotations

import builtins
import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from ledger.database import Database, TopicTable, load_migrations
from ledger.position import Position

__all__ = ["COMPONENT", "MARK_DELETE_RATE_LIMIT", "MIGRATIONS", "TOPIC_TABLES", "Also", "CursorRecord", "CursorStore"]

log = logging.getLogger(__name__)

COMPONENT = "cursor"
# Pulsar's managedLedgerDefaultMarkDeleteRateLimit: persists a second per cursor of the
# records queued with ``save_later``; 0 writes each at once (every acknowledgement a commit).
MARK_DELETE_RATE_LIMIT = 1.0
# A failed background write is retried one interval later, and never sooner than this
# (with no rate limit the interval is 0: a failing disk must not spin the thread).
WRITE_RETRY_MIN_S = 0.1
MIGRATIONS = load_migrations("cursor", COMPONENT)
TOPIC_TABLES = (
    TopicTable("cursors", "topic", hold=("mark_delete_ledger_id", "mark_delete_entry_id")),
    TopicTable("cursor_properties", "topic"),
)


@dataclass(frozen=True, slots=True)
class CursorRecord:
    """A durable cursor's persisted state.

    Attributes:
        topic, name: which cursor.
        mark_delete_position: every entry at or before it is acknowledged.
        individually_deleted: acknowledged ranges after it, as inclusive
            ``(ledger_id, first_entry_id, last_entry_id)`` triples.
        properties: the mark-delete properties, versioned with the position.
        last_active_ms: when the cursor was last saved.
    """

    topic: str
    name: str
    mark_delete_position: Position
    individually_deleted: tuple[tuple[int, int, int], ...] = ()
    properties: Mapping[str, int] = field(default_factory=dict)
    last_active_ms: int = 0


CursorKey = tuple[str, str]  # (topic, cursor name)
Also = Callable[[sqlite3.Connection], None]
"""More statements run inside a cursor write's transaction (``save``, ``delete``)."""
Snapshot = Callable[[], CursorRecord]  # a queued cursor's record, built when it is written
Queued = Snapshot | None  # a queued state: a record to write, or None: the cursor's deletion


class CursorStore:
    """The durable cursors kept in ``database`` (whose cursor tables it brings up to date).

    ``mark_delete_rate_limit``: writes a second per cursor of records queued with
    ``save_later`` (0: ``save_later`` writes at once, as ``save``). ``clock`` (monotonic
    seconds) and ``background`` (False: no thread; the owner calls ``write_due``) are for
    tests of the schedule.
    """

    def __init__(self, database: Database, *, mark_delete_rate_limit: float = MARK_DELETE_RATE_LIMIT,
                 clock: Callable[[], float] = time.monotonic, background: bool = True) -> None:
        if not mark_delete_rate_limit >= 0 or math.isinf(mark_delete_rate_limit):
            raise ValueError(f"mark_delete_rate_limit must be a finite number >= 0, not {mark_delete_rate_limit}")
        self.database = database
        self.mark_delete_rate_limit = mark_delete_rate_limit
        self._interval_s = 1.0 / mark_delete_rate_limit if mark_delete_rate_limit > 0 else 0.0
        self._clock = clock
        self._background = background
        self._queued: dict[CursorKey, Queued] = {}  # the newest state of each cursor, not yet written
        self._waiters: dict[CursorKey, list[Future[None]]] = {}  # ``when_written`` futures of queued states
        self._writing: dict[CursorKey, list[Future[None]]] = {}  # ... of the states a write has taken
        self._in_write: dict[CursorKey, Queued] = {}  # the states a write has taken, until it ends
        self._due: dict[CursorKey, float] = {}  # when each queued record is written
        self._written_at: dict[CursorKey, float] = {}  # when each cursor was last written
        # The invariant "an acknowledgement never moves MD back", checked where it is
        # persisted: each cursor's last written MD, and the cursors whose queued state may
        # hold a move back (a creation, a reset: queued due now) until it is written.
        self._written_md: dict[CursorKey, Position] = {}
        self._may_move_back: set[CursorKey] = set()
        self._lock = threading.Lock()  # _state's lock: ``with self._lock`` is the cheap way to hold it
        self._state = threading.Condition(self._lock)  # guards the three dicts above and _closed
        self._write_lock = threading.Lock()  # one write at a time, in the order of saves
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failed_with: str | None = None  # the last background write error, logged once
        database.register(COMPONENT, MIGRATIONS, topic_tables=TOPIC_TABLES)

    # -- writing ----------------------------------------------------------------------

    def save(self, record: CursorRecord, also: Also | None = None) -> None:
        """Persist position, ranges and properties of a cursor **in one transaction**, now;
        a record of the cursor queued before is dropped (this one is newer). ``also(db)``
        runs inside that transaction, after the cursor's rows (raising: nothing is written)."""
        key = (record.topic, record.name)
        with self._write_lock:
            with self._state:
                self._queued.pop(key, None)
                self._due.pop(key, None)
                self._begin_writing([key])
            try:
                with self.database.transaction("cursor.save", record=record) as db:
                    self._write_rows(db, record)
                    if also is not None:
                        also(db)
            except BaseException as error:
                self._end_writing([key], error)
                raise
            with self._state:
                self._written_at[key] = self._clock()
                self._written_md[key] = record.mark_delete_position
                self._may_move_back.discard(key)
            self._end_writing([key], None)

    def save_later(self, record: CursorRecord) -> None:
        """Queue ``record`` as its cursor's newest state, written on the persist schedule
        (see the module docstring); with no rate limit, ``save`` it now. Never blocks on
        the database when a rate limit is set."""
        self.save_later_from(record.topic, record.name, lambda: record)

    def save_later_from(self, topic: str, name: str, snapshot: Snapshot) -> None:
        """``save_later`` of the record ``snapshot()`` returns when it is written (or
        loaded): the cursor's state *then*, so a cursor acknowledged thousands of times a
        second builds one record per write, not one per acknowledgement. ``snapshot`` is
        called on the writer's thread: it must read one consistent state of the cursor
        (``ManagedCursor`` keeps its persisted state in one immutable tuple for this)."""
        self._queue(topic, name, snapshot, at_once=False)

    def save_soon_from(self, topic: str, name: str, snapshot: Snapshot) -> None:
        """``save_later_from``, due now whatever the schedule (a cursor's creation, a reset):
        written by the thread at once; with no thread (``background=False``), on the
        caller's thread before this returns."""
        self._queue(topic, name, snapshot, at_once=True)

    def _queue(self, topic: str, name: str, snapshot: Snapshot, *, at_once: bool) -> None:
        key = (topic, name)
        with self._lock:  # the condition's own lock, held without its Python-level wrapper
            # no thread (no rate limit, or a write due now); or after close: nothing would write it
            synchronous = self._synchronous_waits if at_once else self._synchronous
            if at_once:
                self._may_move_back.add(key)
            if not synchronous:
                if at_once:
                    self._due[key] = self._clock()
                    self._state.notify()
                    self._start_thread()
                elif key not in self._queued:
                    self._due[key] = max(self._clock(), self._written_at.get(key, -math.inf) + self._interval_s)
                    self._state.notify()
                    self._start_thread()
                self._queued[key] = snapshot
        if synchronous:
            self.save(snapshot())

    def flush(self, topic: str | None = None, name: str | None = None) -> int:
        """Write now, in one transaction, what is queued: for cursor ``name`` of ``topic``,
        every cursor of ``topic``, or every cursor. Returns the number of cursors written;
        raises ``MetadataError`` when the write fails (the records stay queued)."""
        return self._write(lambda key: (topic is None or key[0] == topic) and (name is None or key[1] == name))

    def when_written(self, topic: str, name: str) -> Future[None]:
        """A future that resolves once what is queued for cursor ``name`` of ``topic`` now
        (or being written) is committed, or fails with that write's error; what is queued
        becomes due now. Resolved at once when nothing is (see "Waiting for a write")."""
        key, future = (topic, name), Future[None]()
        with self._state:
            if key in self._queued and not self._synchronous_waits:
                self._waiters.setdefault(key, []).append(future)
                self._due[key] = self._clock()
                self._state.notify()
                return future
            if key in self._writing:
                self._writing[key].append(future)
                return future
            queued = key in self._queued
        try:
            if queued:  # no writer thread: write it now
                self.flush(topic, name)
        except Exception as error:  # noqa: BLE001 - the future carries it
            future.set_exception(error)
        else:
            future.set_result(None)
        return future

    def flush_later(self, topic: str) -> Future[None]:
        """``when_written`` of every cursor of ``topic`` queued now, as one future (the first
        error, once every write ended)."""
        with self._state:
            names = {key[1] for key in [*self._queued, *self._writing] if key[0] == topic}
        return _all_of([self.when_written(topic, name) for name in sorted(names, key=repr)])

    def delete_later(self, topic: str, name: str) -> None:
        """Queue the deletion of cursor ``name`` (written at once, in the background:
        ``when_written`` tells when it is durable); with no writer thread, ``delete`` it now."""
        key = (topic, name)
        with self._state:
            synchronous = self._synchronous_waits
            if not synchronous:
                self._queued[key] = None
                self._due[key] = self._clock()
                self._state.notify()
                self._start_thread()
        if synchronous:
            self.delete(topic, name)

    @property
    def _synchronous(self) -> bool:
        """``save_later`` writes on the caller's thread (the caller holds ``_state``)."""
        return self._closed or (self._interval_s == 0 and not self._background)

    @property
    def _synchronous_waits(self) -> bool:
        """``when_written``, ``delete_later`` work on the caller's thread (caller holds ``_state``)."""
        return self._closed or not self._background

    def _begin_writing(self, keys: builtins.list[CursorKey]) -> None:
        """The waiters of ``keys`` now wait for the write that took them (holding ``_state``)."""
        for key in keys:
            self._writing.setdefault(key, []).extend(self._waiters.pop(key, []))

    def _end_writing(self, keys: builtins.list[CursorKey], error: BaseException | None) -> None:
        """The write that took ``keys`` ended: tell their waiters (outside ``_state``)."""
        with self._state:
            self._in_write = {}
            futures = [future for key in keys for future in self._writing.pop(key, [])]
        for future in futures:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def flush_soon(self, topic: str, name: str) -> None:
        """Have the background thread write cursor ``name``'s queued record now (its last
        consumer left), without waiting for it."""
        with self._state:
            if (topic, name) in self._due:
                self._due[(topic, name)] = self._clock()
                self._state.notify()

    def write_due(self) -> int:
        """Write every queued record whose time has come, in one transaction (the
        background thread's step); the number of cursors written."""
        now = self._clock()
        return self._write(lambda key: self._due.get(key, math.inf) <= now)

    def discard(self, topic: str) -> None:
        """Forget what is queued for ``topic``'s cursors (the topic is being deleted): once
        this returns, no queued record of it is written."""
        with self._write_lock:
            with self._state:
                keys = [key for key in self._queued if key[0] == topic]
                for key in keys:
                    del self._queued[key]
                    del self._due[key]
                for key in [key for key in self._written_at if key[0] == topic]:
                    del self._written_at[key]
                for key in [key for key in self._written_md if key[0] == topic]:
                    del self._written_md[key]
                self._may_move_back -= {key for key in self._may_move_back if key[0] == topic}
                self._begin_writing(keys)
            self._end_writing(keys, None)  # nothing of the topic is left to write

    def queued_count(self) -> int:
        """Cursors whose newest record is queued, not yet written."""
        with self._state:
            return len(self._queued)

    def close(self) -> None:
        """Write everything queued and stop the background thread (a clean shutdown)."""
        with self._state:
            self._closed = True
            self._state.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        self.flush()

    def _write(self, wanted: Callable[[CursorKey], bool]) -> int:
        """Take the queued states ``wanted`` picks and commit them together; on failure
        put them back unless a newer state of the cursor was queued meanwhile."""
        with self._write_lock:
            with self._state:
                taken = [(key, queued) for key, queued in self._queued.items() if wanted(key)]
                for key, _ in taken:
                    del self._queued[key]
                    del self._due[key]
                keys = [key for key, _ in taken]
                self._begin_writing(keys)
                self._in_write = dict(taken)
                may_move_back = {key for key in keys if key in self._may_move_back}
            if not taken:
                return 0
            try:
                # the cursors' states now, the newest (None: deleted)
                states = [(key, None if queued is None else queued()) for key, queued in taken]
                records = [record for _, record in states if record is not None]
                self._check_forward(states, may_move_back)
                with self.database.transaction("cursor.save_batch", records=records) as db:
                    for key, record in states:
                        if record is None:
                            self._delete_rows(db, *key)
                        else:
                            self._write_rows(db, record)
            except BaseException as error:
                with self._state:
                    retry_at = self._clock() + max(self._interval_s, WRITE_RETRY_MIN_S)
                    for key, queued in taken:
                        if key not in self._queued:
                            self._queued[key], self._due[key] = queued, retry_at
                self._end_writing(keys, error)
                raise
            with self._state:
                now = self._clock()
                for key, record in states:
                    if key not in self._queued:  # a reset queued during this write keeps its leave
                        self._may_move_back.discard(key)
                    if record is None:
                        self._written_at.pop(key, None)
                        self._written_md.pop(key, None)
                    else:
                        self._written_at[key] = now
                        self._written_md[key] = record.mark_delete_position
            self._end_writing(keys, None)
            return len(states)

    def _check_forward(self, states: builtins.list[tuple[CursorKey, CursorRecord | None]],
                       may_move_back: set[CursorKey]) -> None:
        """Assert that no queued acknowledgement moves a cursor's persisted MD back: only a
        state queued due now (a creation, a reset) may (P5: a mark-delete never moves back)."""
        for key, record in states:
            written = self._written_md.get(key)
            if record is not None and written is not None and key not in may_move_back:
                assert record.mark_delete_position >= written, (
                    f"cursor {key}: persisted MD would move back from {written} to {record.mark_delete_position}")

    @staticmethod
    def _delete_rows(db: sqlite3.Connection, topic: str, name: str) -> bool:
        """Delete cursor ``name``'s rows; False when it had none."""
        db.execute("DELETE FROM cursor_properties WHERE topic = ? AND cursor = ?", (topic, name))
        return int(db.execute("DELETE FROM cursors WHERE topic = ? AND name = ?", (topic, name)).rowcount) == 1

    def _write_rows(self, db: sqlite3.Connection, record: CursorRecord) -> None:
        md = record.mark_delete_position
        ranges = json.dumps([list(r) for r in record.individually_deleted])
        db.execute(
            "INSERT OR REPLACE INTO cursors (topic, name, mark_delete_ledger_id, "
            "mark_delete_entry_id, individually_deleted, last_active_ms) VALUES (?, ?, ?, ?, ?, ?)",
            (record.topic, record.name, md.ledger_id, md.entry_id, ranges, record.last_active_ms),
        )
        self.database.checkpoint("cursor.save.between_position_and_properties", record=record)
        db.execute("DELETE FROM cursor_properties WHERE topic = ? AND cursor = ?", (record.topic, record.name))
        db.executemany(
            "INSERT INTO cursor_properties (topic, cursor, key, value) VALUES (?, ?, ?, ?)",
            [(record.topic, record.name, k, int(v)) for k, v in sorted(record.properties.items())],
        )

    # -- the background thread -------------------------------------------------------

    def _start_thread(self) -> None:
        """Start the writer thread once (the caller holds ``_state``)."""
        if self._thread is None and self._background:
            self._thread = threading.Thread(target=self._run, name="cursor-persist", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """Sleep until the earliest queued record is due, write what is due, repeat."""
        while True:
            with self._state:
                while not self._closed:
                    wait_s = min(self._due.values(), default=math.inf) - self._clock()
                    if wait_s <= 0:
                        break
                    self._state.wait(None if math.isinf(wait_s) else wait_s)
                if self._closed:
                    return
            try:
                self.write_due()
                self._failed_with = None
            except Exception as error:  # noqa: BLE001 - the thread must live on; the records stay queued
                if str(error) != self._failed_with:
                    log.error("persisting cursors failed, retrying in %.3g s: %s",
                              max(self._interval_s, WRITE_RETRY_MIN_S), error)
                self._failed_with = str(error)

    # -- reading ----------------------------------------------------------------------

    def load(self, topic: str, name: str) -> CursorRecord | None:
        """The newest state of cursor ``name`` on ``topic`` (queued, else persisted), or None."""
        with self._state:  # before the query: a state taken by a write may commit meanwhile
            self._may_move_back.add((topic, name))  # a cursor recovered from it may clamp its MD back
            pending = {**self._in_write, **self._queued}
            queued, state = (topic, name) in pending, pending.get((topic, name))
        if not queued:
            return self.load_persisted(topic, name)
        return None if state is None else state()  # None: its deletion is queued

    def load_persisted(self, topic: str, name: str) -> CursorRecord | None:
        """The persisted state of cursor ``name`` on ``topic`` (what survives a crash), or None."""
        with self.database.reading():
            rows = self.database.query(
                "SELECT mark_delete_ledger_id, mark_delete_entry_id, individually_deleted, "
                "last_active_ms FROM cursors WHERE topic = ? AND name = ?",
                (topic, name),
            )
            if not rows:
                return None
            properties = self.database.query(
                "SELECT key, value FROM cursor_properties WHERE topic = ? AND cursor = ?", (topic, name)
            )
        ledger_id, entry_id, ranges, last_active_ms = rows[0]
        return CursorRecord(
            topic=topic,
            name=name,
            mark_delete_position=Position(ledger_id, entry_id),
            individually_deleted=tuple(tuple(r) for r in json.loads(ranges)),
            properties={key: value for key, value in properties},
            last_active_ms=last_active_ms,
        )

    def list(self, topic: str) -> builtins.list[str]:
        """Names of the durable cursors of ``topic``, sorted: those persisted, less those
        whose deletion is queued, and those created and queued (after the persisted ones)."""
        with self._state:  # before the query: a state taken by a write may commit meanwhile
            pending = {**self._in_write, **self._queued}
        queued = {key[1]: state is not None for key, state in pending.items() if key[0] == topic}
        rows = self.database.query("SELECT name FROM cursors WHERE topic = ? ORDER BY name", (topic,))
        persisted = [row[0] for row in rows]
        created = sorted(name for name, alive in queued.items() if alive and name not in set(persisted))
        return [name for name in persisted if queued.get(name, True)] + created

    def mark_delete_positions(self, topic: str) -> dict[str, Position]:
        """Persisted mark-delete position of every durable cursor of ``topic``."""
        rows = self.database.query(
            "SELECT name, mark_delete_ledger_id, mark_delete_entry_id FROM cursors WHERE topic = ?",
            (topic,),
        )
        return {name: Position(ledger_id, entry_id) for name, ledger_id, entry_id in rows}

    def cursor_property_values(self, cursor: str, key: str) -> set[int]:
        """Values of property ``key`` over every topic's cursor named ``cursor``."""
        rows = self.database.query(
            "SELECT value FROM cursor_properties WHERE cursor = ? AND key = ?", (cursor, key)
        )
        return {row[0] for row in rows}

    def delete(self, topic: str, name: str, also: Also | None = None) -> bool:
        """Forget cursor ``name``, queued record included; False when it was not persisted.
        ``also(db)`` runs inside the delete transaction (as ``save``'s)."""
        key = (topic, name)
        with self._write_lock:
            with self._state:
                self._queued.pop(key, None)
                self._due.pop(key, None)
                self._written_at.pop(key, None)
                self._written_md.pop(key, None)
                self._may_move_back.discard(key)
                self._begin_writing([key])
            try:
                with self.database.transaction("cursor.delete", topic=topic, name=name) as db:
                    deleted = self._delete_rows(db, topic, name)
                    if also is not None:
                        also(db)
            except BaseException as error:
                self._end_writing([key], error)
                raise
            self._end_writing([key], None)
            return deleted


def _all_of(futures: list[Future[None]]) -> Future[None]:
    """One future for ``futures``: done when all are, failed with the first error."""
    combined = Future[None]()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[None]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        errors = [future.exception() for future in futures if future.exception() is not None]
        if errors:
            combined.set_exception(errors[0])
        else:
            combined.set_result(None)

    if not futures:
        combined.set_result(None)
    for future in futures:
        future.add_done_callback(one_done)
    return combined
