"""The managed ledger: one topic's log, a list of ledgers read as one sequence.

Behaviour follows Pulsar's ``ManagedLedgerImpl`` (reference ``managed-ledger.md`` §2):

* **Open** (``ManagedLedger.open``, after a clean stop or a crash): the last ledger of the
  list, if still open, is sealed at its last durable entry (the store truncates a torn
  tail); every empty ledger leaves the list; a brand-new ledger is always created for
  writing — an old ledger is never appended to again.
* **Append** returns a future of the entry's ``Position`` that resolves once the entry is
  durable. After an append that makes the current ledger hold ``max_entries_per_ledger``
  entries or ``max_size_per_ledger_bytes`` bytes (and is older than
  ``min_rollover_time_ms``), that ledger is sealed and a new one is created: a full ledger
  holds exactly the entries up to and including the one that filled it. *When* to roll
  over, and what appends do meanwhile, is ``ledger.roll_over`` (a pure state machine, one
  mode); this module carries out its actions. A roll-over (the seal and the creation,
  their fsyncs and metadata commits) always runs outside the ledger's lock: appends that
  arrive meanwhile wait in memory, in order (Pulsar's pending adds while a ledger is
  created), and go to the new ledger once it exists. Opened with
  ``roll_over_in_background`` (the broker does), it runs on a roll-over thread, so the
  appender never blocks on its I/O; otherwise on the thread whose append started it.
* **A failed write** (Pulsar's answer to a BookKeeper write error): the append's future
  fails with ``LedgerIOError``, and so do the appends in flight behind it; none is ever
  reported durable unless it is. The next append seals the failed ledger at its last
  durable entry (an empty one leaves the list) and goes to a new ledger. When that cannot
  be done yet (the disk is still full), that append fails the same way and the next one
  tries again: the topic recovers by itself once the store works. That roll past a failed
  ledger is a roll-over like any other (the appends meanwhile wait, as behind a full one).
* **A failed roll-over backs off** (Pulsar's ``WaitTimeAfterLedgerCreationFailureMs``):
  for ``roll_over_retry_ms`` after a roll-over failed, appends that would need one fail
  at once with ``LedgerIOError``, touching no file; the first append (or
  ``ready_for_appends`` call) after that tries again. Its failures are logged at most once
  per ``ROLL_OVER_WARNING_INTERVAL_MS`` per topic. ``ready_for_appends`` tells the broker
  whether to take a new producer (one refused by a full disk retries with backoff, so its
  client's send timeout runs out instead of being restarted by each reconnect).
* **Last confirmed position**: the last durable entry of the current ledger, else the last
  entry of the nearest non-empty earlier ledger, else ``(first ledger, -1)``.
* **Snapshot** (``snapshot``): the ledger list with its confirmed counts and the last
  confirmed position, taken under one hold of the lock, so that a reader planning over
  several of them (a compaction run: its stop marker, the entries it will read, the
  per-ledger ranges) asks once and gets answers that agree.
* **Reads** go forward from any position across ledgers, skipping missing (trimmed) and
  empty ledgers, never past the last confirmed position.
* **Trimming** deletes a prefix of closed ledgers that every durable cursor has consumed
  (the slowest persisted mark-delete position bounds it; with no durable cursor every
  closed ledger is a candidate), within the retention policy; the current ledger is never
  deleted. References leave the metadata store before data leaves the ledger store; that
  commit runs without the ledger's lock (one trim at a time), so appends never wait for it.

Invariants asserted here (P5): ledger ids only grow, a ledger is created only after the
current one is sealed, nothing is appended to a sealed ledger, a seal never drops a
confirmed entry, and entries read back come in strictly growing positions from the start.

This module is longer than the project's 600 lines on purpose: everything here reads or
changes the ledger list under the one ``_lock`` (appends, roll-over actions, reads,
positions, trimming), and splitting it would spread that lock's users over modules.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

from ledger.errors import (
    LedgerError,
    LedgerFencedError,
    LedgerIOError,
    LedgerNotFoundError,
    MetadataError,
)
from ledger.metadata import LedgerRecord, MetadataStore
from ledger.position import Position
from ledger.roll_over import (
    Action,
    AdmitProducer,
    AppendEvent,
    CloseEvent,
    CurrentLedger,
    Event,
    FailAppend,
    LogRecovered,
    LogWarning,
    QueueAppend,
    ReadyEvent,
    RejectAppend,
    RollNowEvent,
    RollOverFailedEvent,
    RollOverLimits,
    RollOverState,
    RollOverSucceededEvent,
    SealCurrent,
    SettleWaiters,
    StartRollOver,
    WaitForRollOver,
    WaitReady,
    WriteFencedEvent,
    WrittenEvent,
    step,
)
from ledger.storage.base import LedgerStore

__all__ = ["Entry", "LedgerSnapshot", "ManagedLedger", "ManagedLedgerConfig"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ROLL_OVER_WARNING_INTERVAL_MS = 10_000  # a topic's failed roll-overs: one log line in this long, at most


@dataclass(frozen=True, slots=True)
class ManagedLedgerConfig:
    """Roll-over and retention settings (Pulsar's broker.conf names in the comments). These
    defaults are the broker's: ``api.config.Settings`` takes its ledger defaults from here.

    Attributes:
        max_entries_per_ledger: roll over after this many entries
            (``managedLedgerMaxEntriesPerLedger``, 50000).
        max_size_per_ledger_bytes: roll over after this many bytes
            (``managedLedgerMaxSizePerLedgerMbytes``, 2048 MiB).
        min_rollover_time_ms: a ledger younger than this is never rolled over
            (``managedLedgerMinLedgerRolloverTimeMinutes``; Pulsar's 10 min keeps ledgers
            large on busy topics, compactd's 0 keeps them bounded, which sealed-ledger
            readers such as the Spark engine prefer).
        retention_time_ms: keep consumed ledgers this long after they closed; -1 = forever
            (``defaultRetentionTimeInMinutes``, 0).
        retention_size_bytes: keep consumed ledgers while the topic is at most this large;
            -1 = unlimited (``defaultRetentionSizeInMB``, 0).
        roll_over_retry_ms: after a failed roll-over (a full disk), appends that need one
            fail at once for this long before the next try (Pulsar's
            ``WaitTimeAfterLedgerCreationFailureMs``, 10 s).
    """

    max_entries_per_ledger: int = 50_000
    max_size_per_ledger_bytes: int = 2048 * MIB
    min_rollover_time_ms: int = 0
    retention_time_ms: int = 0
    retention_size_bytes: int = 0
    roll_over_retry_ms: int = 10_000


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry read from a topic: its position and its bytes, verbatim."""

    position: Position
    data: bytes


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """A managed ledger's list and last confirmed position at one instant
    (``ManagedLedger.snapshot``).

    Attributes:
        ledgers: the ledger list, ascending, with the confirmed counts of that instant
            (as ``ManagedLedger.ledger_list``).
        last_confirmed: the last confirmed position of that list (as
            ``ManagedLedger.last_confirmed_position``): ``(first ledger, -1)`` when it holds
            no entry, ``(-1, -1)`` once the topic is deleted.
    """

    ledgers: tuple[LedgerRecord, ...]
    last_confirmed: Position

    def entries_between(self, after: Position, upto: Position) -> int:
        """Number of entries ``p`` of the list with ``after < p <= upto`` (entry level), as
        ``ManagedLedger.entries_between`` counted them at the snapshot's instant."""
        return _entries_between(((record.ledger_id, record.entries) for record in self.ledgers), after, upto)


def _entries_between(counts: Iterable[tuple[int, int]], after: Position, upto: Position) -> int:
    """Entries ``p`` with ``after < p <= upto`` over ``(ledger id, confirmed entries)`` pairs."""
    count = 0
    for ledger_id, entries in counts:
        low = after.entry_id + 1 if ledger_id == after.ledger_id else 0
        high = upto.entry_id if ledger_id == upto.ledger_id else entries - 1
        if after.ledger_id <= ledger_id <= upto.ledger_id:
            count += max(0, min(high, entries - 1) - max(low, 0) + 1)
    return count


@dataclass(slots=True)
class _Ledger:
    """A ledger of the list, as this process tracks it.

    ``entries`` and ``size_bytes`` count its confirmed (durable) entries: fixed once it is
    closed, live while it is open (each completion adds its own entry, under the managed
    ledger's ``_counts_lock``). ``failed`` is set when a write to it failed.
    """

    ledger_id: int
    entries: int
    size_bytes: int
    created_at_ms: int
    closed_at_ms: int  # 0 while open
    failed: bool = False
    offloaded_at_ms: int = 0  # ``LedgerRecord.offloaded_at_ms``
    local_deleted_at_ms: int = 0


class ManagedLedger:
    """One topic's log; build it with ``ManagedLedger.open``."""

    def __init__(
        self,
        name: str,
        store: LedgerStore,
        metadata: MetadataStore,
        config: ManagedLedgerConfig,
        clock: Callable[[], float],
        roll_over_in_background: bool = False,
        on_sealed: Callable[[int, int], None] | None = None,
    ) -> None:
        self.name = name
        self.store = store
        self.metadata = metadata
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._trim_lock = threading.Lock()
        self._ledgers: list[_Ledger] = []  # ascending ids; the last one is the current one
        # Guards the live counts of open ledgers. Completions update them on the flusher
        # thread, which may hold a ledger's I/O lock that a seal waits for: so never
        # ``_lock`` there, only this leaf lock, held for a few assignments.
        self._counts_lock = threading.Lock()
        self._empty_ledgers: list[_Ledger] = []  # sealed, empty, still listed: to remove
        self._pending_entries = 0  # appended to the current ledger, durable or not
        self._pending_bytes = 0
        self._listeners: list[Callable[[Position], None]] = []
        self.entries_added_counter = 0
        self._background = roll_over_in_background
        self._on_sealed = on_sealed
        # The roll-over (``ledger.roll_over``), under ``_lock``: its state, the appends
        # waiting for the one in flight (its trigger first), and the producers waiting on it.
        self._roll = RollOverState(RollOverLimits(
            config.max_entries_per_ledger, config.max_size_per_ledger_bytes, config.min_rollover_time_ms,
            config.roll_over_retry_ms, ROLL_OVER_WARNING_INTERVAL_MS))
        self._queued: list[tuple[bytes, Future[Position]]] = []
        self._trigger: Future[Position] | None = None
        self._ready_waiters: list[Future[None]] = []
        self._rolled = threading.Event()  # set while no roll-over is in flight
        self._rolled.set()

    @property
    def closed(self) -> bool:
        """Whether the managed ledger was closed (or deleted): it takes no append."""
        return self._roll.closed

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        name: str,
        store: LedgerStore,
        metadata: MetadataStore,
        config: ManagedLedgerConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        roll_over_in_background: bool = False,
        on_sealed: Callable[[int, int], None] | None = None,
    ) -> ManagedLedger:
        """Load topic ``name`` (creating it if new) and open a fresh ledger for writing;
        ``roll_over_in_background`` runs roll-overs on a thread of their own instead of the
        thread whose append or ``ready_for_appends`` started them.
        ``on_sealed(ledger_id, entries)`` is called after each ledger of the topic with entries
        is sealed and recorded closed (a roll-over, a close, a ledger the last run left open),
        on the sealing thread: it must return quickly, and what it raises is logged only."""
        managed = cls(name, store, metadata, config or ManagedLedgerConfig(), clock, roll_over_in_background,
                      on_sealed)
        metadata.create_topic(name, managed._now_ms())
        kept: list[_Ledger] = []
        empty: list[int] = []
        for record in metadata.topic_ledgers(name):
            ledger = managed._recover(record)
            if ledger is None or ledger.entries == 0:
                empty.append(record.ledger_id)
            else:
                kept.append(ledger)
        if empty:
            metadata.remove_ledgers(empty)
            for ledger_id in empty:
                store.delete(ledger_id)
        managed._ledgers = kept
        managed._add_current(managed._new_ledger())
        return managed

    def _recover(self, record: LedgerRecord) -> _Ledger | None:
        """Seal a ledger left open by the last run; None if its data is gone."""
        if not record.is_open:
            return _Ledger(record.ledger_id, record.entries, record.size_bytes,
                           record.created_at_ms, record.closed_at_ms, offloaded_at_ms=record.offloaded_at_ms,
                           local_deleted_at_ms=record.local_deleted_at_ms)
        try:
            self.store.close(record.ledger_id)
            info = self.store.info(record.ledger_id)
        except KeyError:  # LedgerNotFoundError: created in the store, data never written
            log.warning("topic %s: ledger %d is missing, dropping it", self.name, record.ledger_id)
            return None
        closed_at_ms = self._now_ms()
        self.metadata.close_ledger(record.ledger_id, entries=info.entries,
                                   size_bytes=info.size_bytes, closed_at_ms=closed_at_ms)
        self._notify_sealed(record.ledger_id, info.entries)
        return _Ledger(record.ledger_id, info.entries, info.size_bytes, record.created_at_ms, closed_at_ms)

    def _add_current(self, ledger: _Ledger) -> None:
        """Make ``ledger`` the current one (caller holds the lock, or nobody else has the
        managed ledger yet)."""
        if self._ledgers:
            previous = self._ledgers[-1]
            assert ledger.ledger_id > previous.ledger_id, (
                f"ledger ids only grow: {ledger.ledger_id} after {previous.ledger_id}")
            assert previous.closed_at_ms, f"ledger {ledger.ledger_id} created before {previous.ledger_id} was sealed"
        self._ledgers.append(ledger)
        self._pending_entries = 0
        self._pending_bytes = 0

    def _new_ledger(self) -> _Ledger:
        """A new, empty, referenced ledger, not yet in the list."""
        ledger_id = self.store.create(
            {"application": "compactd", "component": "managed-ledger", "managed-ledger": self.name}
        )
        now_ms = self._now_ms()
        try:
            self.metadata.add_ledger(self.name, ledger_id, role="data", created_at_ms=now_ms)
        except MetadataError:
            self._delete_quietly(ledger_id)  # never referenced: nobody can miss it
            raise
        return _Ledger(ledger_id, 0, 0, now_ms, 0)

    # -- writing ------------------------------------------------------------------------

    def append(self, data: bytes) -> Future[Position]:
        """Append one entry; the future resolves to its position once it is durable.

        Every failure to store the entry comes through the future, never as a success:
        ``LedgerIOError`` (retriable) when the write or its sync failed, or when the roll
        past an earlier failed ledger (seal it, create the next) could not be done now —
        the next append tries again, so the topic recovers by itself once the store works.
        Appends in flight behind a failed one fail with it. Only a closed or deleted
        managed ledger raises ``LedgerError`` at once.
        """
        outer: Future[Position] = Future()
        with self._lock:
            plan = self._take(data, outer, retry=False)
        self._run_roll_over(plan)
        return outer

    def _step(self, event: Event) -> tuple[Action, ...]:
        """Feed ``event`` to the roll-over (caller holds the lock); its actions, in order."""
        self._roll, actions = step(self._roll, event)
        if self._roll.rolling:
            self._rolled.clear()
        else:
            self._rolled.set()
        return actions

    def _facts(self) -> CurrentLedger:
        """What the roll-over needs to know of the ledger list (caller holds the lock)."""
        if not self._ledgers:  # deleted: closed too, so no append gets this far
            return CurrentLedger()
        current = self._ledgers[-1]
        return CurrentLedger(failed=current.failed, sealed=bool(current.closed_at_ms),
                             empty_ledgers_waiting=bool(self._empty_ledgers))

    def _take(self, data: bytes, outer: Future[Position], *, retry: bool) -> StartRollOver | None:
        """Take one append (caller holds the lock): write it, queue it, or fail it, as the
        roll-over says; returns the roll-over it starts, if any, for ``_run_roll_over``."""
        for action in self._step(AppendEvent(self._now_ms(), self._facts(), retry)):
            if isinstance(action, RejectAppend):
                raise LedgerError(f"managed ledger {self.name} is closed")
            if isinstance(action, QueueAppend):
                self._queue(data, outer, trigger=action.trigger)
            elif isinstance(action, FailAppend):
                outer.set_exception(self._backoff_error(action))
            elif isinstance(action, StartRollOver):
                return action
            else:
                return self._write(data, outer, retry=retry)
        return None

    def _queue(self, data: bytes, outer: Future[Position], *, trigger: bool) -> None:
        if trigger:
            self._queued.insert(0, (data, outer))
            self._trigger = outer
        else:
            self._queued.append((data, outer))

    def _write(self, data: bytes, outer: Future[Position], *, retry: bool) -> StartRollOver | None:
        """Hand ``data`` to the current ledger (caller holds the lock); a ledger fenced by an
        earlier failure starts a roll-over past it, this append first."""
        current = self._current()
        assert not current.closed_at_ms, f"an append to sealed ledger {current.ledger_id}"
        try:
            inner = self.store.append(current.ledger_id, data)
        except LedgerFencedError as error:  # by a failure whose appends have not reported yet
            current.failed = True
            for action in self._step(WriteFencedEvent(retry)):
                if isinstance(action, QueueAppend):
                    self._queue(data, outer, trigger=True)
                elif isinstance(action, StartRollOver):
                    return action
                else:
                    outer.set_exception(error)
            return None
        except LedgerIOError as error:  # the write failed at call time: this entry is not stored
            current.failed = True
            outer.set_exception(error)
            return None
        except (LedgerError, MetadataError) as error:
            outer.set_exception(self._append_failure(error))
            return None
        self._pending_entries += 1
        self._pending_bytes += len(data)
        self.entries_added_counter += 1
        size = len(data)
        inner.add_done_callback(lambda done: self._on_durable(done, outer, current, size))
        age_ms = self._now_ms() - current.created_at_ms
        for action in self._step(WrittenEvent(self._pending_entries, self._pending_bytes, age_ms)):
            assert isinstance(action, StartRollOver), action
            return action
        return None

    def _backoff_error(self, action: FailAppend) -> LedgerIOError:
        assert action.until_ms is not None, "a failure of the back-off names its end"
        wait_ms = action.until_ms - self._now_ms()
        return LedgerIOError(f"managed ledger {self.name}: cannot roll over ({action.failure}); "
                             f"the next try is in {max(wait_ms, 0)} ms")

    def _append_failure(self, error: Exception) -> LedgerError:
        if isinstance(error, LedgerError):
            return error
        failure = LedgerIOError(f"managed ledger {self.name}: cannot roll over: {error}")
        failure.__cause__ = error
        return failure

    def _on_durable(self, inner: Future[int], outer: Future[Position], ledger: _Ledger, size: int) -> None:
        """An append's outcome arrived (possibly on the flusher thread): count it in the
        ledger it was written to, then tell the caller and the listeners."""
        error = inner.exception()
        if error is not None:
            ledger.failed = True  # the store fenced it: the next append rolls past it
            outer.set_exception(error)
            return
        entry_id = inner.result()
        with self._counts_lock:
            if not ledger.closed_at_ms:  # a sealed ledger's counts come from the store
                ledger.entries = max(ledger.entries, entry_id + 1)
                ledger.size_bytes += size
        position = Position(ledger.ledger_id, entry_id)
        outer.set_result(position)
        for listener in list(self._listeners):
            listener(position)

    def ready_for_appends(self) -> Future[None]:
        """Whether the topic takes appends now, for admitting a producer: resolved at once
        unless the current ledger failed or is sealed. While a roll-over past it failed less
        than ``roll_over_retry_ms`` ago it fails at once with ``LedgerIOError``; otherwise a
        roll-over is tried (on a roll-over thread in the background mode) and the future
        gets its outcome. Never blocks on I/O in the background mode."""
        ready: Future[None] = Future()
        plan: StartRollOver | None = None
        with self._lock:
            for action in self._step(ReadyEvent(self._now_ms(), self._facts())):
                if isinstance(action, AdmitProducer):
                    ready.set_result(None)
                elif isinstance(action, FailAppend):
                    ready.set_exception(self._backoff_error(action))
                elif isinstance(action, WaitReady):
                    self._ready_waiters.append(ready)
                else:
                    assert isinstance(action, StartRollOver), action
                    plan = action
        self._run_roll_over(plan)
        return ready

    def roll_over_now(self) -> None:
        """Seal the current ledger now, after its pending appends, and open the next one,
        whatever the limits; nothing when it holds no entry (or the managed ledger is
        closed). Every entry appended before the call is then in a sealed ledger (a Spark
        run over a bucket reads only sealed ledgers). Runs on this thread once no other
        roll-over is in flight; ``LedgerIOError`` when the seal failed."""
        while True:
            self._rolled.wait()
            with self._lock:
                current = self._ledgers[-1] if self._ledgers else None
                has_entries = current is not None and not current.closed_at_ms and self._pending_entries > 0
                actions = self._step(RollNowEvent(has_entries))
                if not any(isinstance(action, WaitForRollOver) for action in actions):
                    break
        plan = next((action for action in actions if isinstance(action, StartRollOver)), None)
        if plan is None or current is None:
            return
        self._roll_over_until_done(plan)
        if not current.closed_at_ms:
            raise LedgerIOError(f"topic {self.name}: ledger {current.ledger_id} could not be sealed now",
                                ledger_id=current.ledger_id)

    # -- rolling over (the actions of ``ledger.roll_over``) -----------------------------

    def _run_roll_over(self, plan: StartRollOver | None) -> None:
        """Carry out a roll-over the roll-over state machine started: on a roll-over thread
        with ``roll_over_in_background``, else on this one (never under the lock)."""
        if plan is None:
            return
        if self._background:
            threading.Thread(target=self._roll_over_until_done, args=(plan,), daemon=True,
                             name=f"roll-over {self.name}").start()
        else:
            self._roll_over_until_done(plan)

    def _roll_over_until_done(self, plan: StartRollOver) -> None:
        """Roll over, then again while the queued appends handed to the new ledger fill it
        (each pass takes appends off a finite queue, so this ends)."""
        following: StartRollOver | None = plan
        while following is not None:
            following = self._roll_over(following)

    def _roll_over(self, plan: StartRollOver) -> StartRollOver | None:
        """Seal the current ledger (full, or failed: cut back to its last durable entry)
        unless it is sealed already, create the next one and drop the empty ones, without
        the lock (no append reaches the ledger list: they wait in ``_queued``), then hand
        the waiting appends to the new ledger in order; returns the roll-over they start."""
        with self._lock:
            current = self._ledgers[-1]
            failed = current.failed
        new: _Ledger | None = None
        failure: Exception | None = None
        try:
            if plan.seal and not current.closed_at_ms:
                self._seal(current)
                if failed:
                    log.warning("topic %s: ledger %d failed; sealed at %d entries, rolling over",
                                self.name, current.ledger_id, current.entries)
            if plan.create:
                new = self._new_ledger()
        except Exception as error:  # noqa: BLE001 - an append must never wait forever on a roll-over
            failure = error
        with self._lock:
            if plan.create and current.closed_at_ms and current.entries == 0:
                if current not in self._empty_ledgers:
                    self._empty_ledgers.append(current)  # every append to it failed: it leaves the list
            elif failure is not None and not current.closed_at_ms:
                current.failed = True  # not sealed: the next append rolls past it
            if new is not None:
                self._add_current(new)
                self._log_roll_over(current, new)
        kept = self._remove_empty_ledgers() if failure is None else None
        with self._lock:
            now_ms = self._now_ms()
            if failure is not None:
                event: Event = RollOverFailedEvent(now_ms, str(failure))
            elif kept is not None:
                event = RollOverFailedEvent(now_ms, str(kept), writable=True)
            else:
                event = RollOverSucceededEvent(now_ms)
            return self._settle(self._step(event), failure)

    def _settle(self, actions: tuple[Action, ...], failure: Exception | None) -> StartRollOver | None:
        """Carry out the end of a roll-over (caller holds the lock): log, answer the waiting
        producers, and take the queued appends again, in order, until one starts another."""
        following: StartRollOver | None = None
        for action in actions:
            if isinstance(action, LogWarning):
                log.warning("topic %s: roll-over failed (%d failed tries not logged since the last warning), the "
                            "next try is in %d ms: %s", self.name, action.unlogged, action.retry_ms, action.error)
            elif isinstance(action, LogRecovered):
                log.info("topic %s: roll-over succeeded; appends are taken again", self.name)
            elif isinstance(action, SettleWaiters):
                error = None if action.error is None or failure is None else self._append_failure(failure)
                waiters, self._ready_waiters = self._ready_waiters, []
                for ready in waiters:
                    if error is None:
                        ready.set_result(None)
                    else:
                        ready.set_exception(error)
                following = self._take_queued(error)
        return following

    def _take_queued(self, error: LedgerError | None) -> StartRollOver | None:
        """Take the appends that waited for the roll-over that just ended (caller holds the
        lock); the trigger fails with ``error`` if there is one, or is taken as a retry."""
        trigger, self._trigger = self._trigger, None
        following: StartRollOver | None = None
        while self._queued and following is None:
            data, outer = self._queued.pop(0)
            if outer is trigger and error is not None:
                outer.set_exception(error)
                continue
            try:
                following = self._take(data, outer, retry=outer is trigger)
            except LedgerError as closed:  # closed meanwhile: it fails as an append would
                outer.set_exception(closed)
        return following

    def _log_roll_over(self, sealed: _Ledger, current: _Ledger) -> None:
        log.debug("topic %s: ledger %d rolled over at %d entries, %d bytes; ledger %d is current",
                  self.name, sealed.ledger_id, sealed.entries, sealed.size_bytes, current.ledger_id,
                  extra={"event": "ledger-roll-over", "topic": self.name, "sealed_ledger_id": sealed.ledger_id,
                         "ledger_id": current.ledger_id})

    def _remove_empty_ledgers(self) -> MetadataError | None:
        """Drop the empty, sealed ledgers waiting to leave the list, outside the lock (the
        appends wait in ``_queued``); only once a writable ledger is current, never the
        current one. A failure is returned and leaves them for the next try."""
        with self._lock:
            if self._ledgers[-1].closed_at_ms:
                return None
            empty = [ledger for ledger in self._empty_ledgers if ledger is not self._ledgers[-1]]
        for ledger in empty:
            try:
                self.metadata.remove_ledgers([ledger.ledger_id])
            except MetadataError as error:  # it stays listed (reads skip it) until a later try
                return error
            with self._lock:
                if ledger in self._ledgers:  # trimming may have dropped it already
                    self._ledgers.remove(ledger)
                if ledger in self._empty_ledgers:
                    self._empty_ledgers.remove(ledger)
            self._delete_quietly(ledger.ledger_id)
        return None

    def _seal_current(self) -> None:
        """Seal the current ledger (its pending appends become durable first); an empty
        one leaves the list."""
        current = self._ledgers[-1]
        if current.closed_at_ms:
            return
        self._seal(current)
        if current.entries == 0:  # never keep an empty ledger in the list
            self._remove_empty(current)

    def _seal(self, ledger: _Ledger) -> None:
        """Seal ``ledger`` in the store (at its last durable entry), then record it closed."""
        self.store.close(ledger.ledger_id)
        info = self.store.info(ledger.ledger_id)
        closed_at_ms = self._now_ms()
        self.metadata.close_ledger(ledger.ledger_id, entries=info.entries,
                                   size_bytes=info.size_bytes, closed_at_ms=closed_at_ms)
        with self._counts_lock:
            assert info.entries >= ledger.entries, (
                f"ledger {ledger.ledger_id} sealed at {info.entries} entries, {ledger.entries} confirmed")
            ledger.entries, ledger.size_bytes = info.entries, info.size_bytes
            ledger.closed_at_ms = closed_at_ms
        self._notify_sealed(ledger.ledger_id, info.entries)

    def _notify_sealed(self, ledger_id: int, entries: int) -> None:
        """Tell ``on_sealed`` that ``ledger_id`` is sealed (not an empty one: it leaves the list)."""
        if self._on_sealed is None or entries == 0:
            return
        try:
            self._on_sealed(ledger_id, entries)
        except Exception:  # a listener's failure never fails a seal
            log.exception("topic %s: the on-sealed hook failed for ledger %d", self.name, ledger_id)

    def _remove_empty(self, ledger: _Ledger) -> None:
        """Drop an empty, sealed ledger: reference first, then data."""
        self.metadata.remove_ledgers([ledger.ledger_id])
        if ledger in self._ledgers:  # trimming may have dropped it already
            self._ledgers.remove(ledger)
        self._delete_quietly(ledger.ledger_id)

    def _delete_quietly(self, ledger_id: int) -> None:
        """Delete an unreferenced ledger; if that fails, start-up collects the orphan."""
        try:
            self.store.delete(ledger_id)
        except (LedgerError, OSError) as error:
            log.warning("topic %s: ledger %d left for orphan collection: %s", self.name, ledger_id, error)

    def add_listener(self, listener: Callable[[Position], None]) -> None:
        """Call ``listener(position)`` after each entry becomes durable (on any thread)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[Position], None]) -> None:
        """Stop calling ``listener``; a no-op when it was not registered."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def close(self) -> None:
        """Seal the current ledger after its pending appends (a roll-over in flight ends
        first, its waiting appends included); no append is taken after."""
        with self._when_idle(CloseEvent()) as actions:
            if any(isinstance(action, SealCurrent) for action in actions):
                self._seal_current()

    @contextmanager
    def _when_idle(self, event: CloseEvent) -> Iterator[tuple[Action, ...]]:
        """Hold the lock at a moment when no roll-over is in flight, with ``event``'s
        actions; the roll-over's state moves on once the body has carried them out."""
        while True:
            self._rolled.wait()
            with self._lock:
                after, actions = step(self._roll, event)
                if not any(isinstance(action, WaitForRollOver) for action in actions):
                    yield actions
                    self._roll = after
                    return

    # -- the ledger list and positions --------------------------------------------------

    def ledger_list(self) -> list[LedgerRecord]:
        """The ledger list, ascending; the current ledger shows its confirmed counts."""
        with self._lock:
            return [self._record(ledger) for ledger in self._ledgers]

    def snapshot(self) -> LedgerSnapshot:
        """The ledger list and the last confirmed position, taken at one instant (one hold
        of the lock): answers that agree, for a reader that plans with several."""
        with self._lock:
            records = tuple(self._record(ledger) for ledger in self._ledgers)
        last = next((Position(record.ledger_id, record.entries - 1) for record in reversed(records) if record.entries),
                    Position(records[0].ledger_id if records else -1, -1))
        return LedgerSnapshot(records, last)

    def _record(self, ledger: _Ledger) -> LedgerRecord:
        entries, size = self._counts(ledger)
        return LedgerRecord(ledger.ledger_id, self.name, "data", entries, size,
                            ledger.created_at_ms, ledger.closed_at_ms, ledger.offloaded_at_ms,
                            ledger.local_deleted_at_ms)

    def _counts(self, ledger: _Ledger) -> tuple[int, int]:
        """(entries, bytes) confirmed in ``ledger``, as one consistent pair."""
        with self._counts_lock:
            return ledger.entries, ledger.size_bytes

    @property
    def current_ledger_id(self) -> int:
        """The ledger appends go to."""
        with self._lock:
            return self._current().ledger_id

    @property
    def number_of_entries(self) -> int:
        """Confirmed entries over every ledger of the list."""
        with self._lock:
            return sum(self._counts(ledger)[0] for ledger in self._ledgers)

    @property
    def total_size(self) -> int:
        """Confirmed bytes over every ledger of the list."""
        with self._lock:
            return sum(self._counts(ledger)[1] for ledger in self._ledgers)

    def last_confirmed_position(self) -> Position:
        """Last durable entry of the log, or ``(first ledger, -1)`` when it has none."""
        with self._lock:
            for ledger in reversed(self._ledgers):
                entries = self._counts(ledger)[0]
                if entries:
                    return Position(ledger.ledger_id, entries - 1)
            return Position(self._ledgers[0].ledger_id if self._ledgers else -1, -1)

    def first_position(self) -> Position:
        """``(first ledger, -1)``: where a cursor starting from the earliest entry marks."""
        with self._lock:
            if not self._ledgers:
                raise LedgerError(f"managed ledger {self.name} is deleted")
            return Position(self._ledgers[0].ledger_id, -1)

    def _current(self) -> _Ledger:
        """The ledger appends go to; ``LedgerError`` once the topic is deleted."""
        if not self._ledgers:
            raise LedgerError(f"managed ledger {self.name} is deleted")
        return self._ledgers[-1]

    def _end_position(self) -> Position:
        """The position right after the last confirmed entry (where the next one will be)."""
        current = self._current()
        return Position(current.ledger_id, self._counts(current)[0])

    def _ceiling(self, ledger_id: int) -> int:
        """Index in the list of the first ledger with id ≥ ``ledger_id`` (may be len)."""
        return bisect.bisect_left([ledger.ledger_id for ledger in self._ledgers], ledger_id)

    def next_valid_position(self, position: Position) -> Position:
        """The first entry after ``position`` (skipping missing and empty ledgers), or the
        end position (right after the last confirmed entry) when there is none."""
        with self._lock:
            end = self._end_position()
            candidate = Position(position.ledger_id, max(position.entry_id + 1, 0))
            for ledger in self._ledgers[self._ceiling(candidate.ledger_id):]:
                if candidate >= end:
                    return end
                entries = self._counts(ledger)[0]
                if ledger.ledger_id == candidate.ledger_id and candidate.entry_id < entries:
                    return candidate
                if ledger.ledger_id > candidate.ledger_id and entries:
                    return Position(ledger.ledger_id, 0)
            return end

    def previous_position(self, position: Position) -> Position:
        """The entry before ``position``: ``(L, e-1)``, else the last entry of the nearest
        non-empty earlier ledger, else ``(first ledger, -1)``."""
        with self._lock:
            if position.entry_id > 0:
                return Position(position.ledger_id, position.entry_id - 1)
            for ledger in reversed(self._ledgers[: self._ceiling(position.ledger_id)]):
                entries = self._counts(ledger)[0]
                if entries:
                    return Position(ledger.ledger_id, entries - 1)
            return self.first_position()

    def is_valid_position(self, position: Position) -> bool:
        """Pulsar's rule: the ledger is in the list and the entry exists, or, in the current
        ledger, is at most one past the last confirmed entry."""
        with self._lock:
            index = self._ceiling(position.ledger_id)
            if index == len(self._ledgers) or self._ledgers[index].ledger_id != position.ledger_id:
                return False
            entries = self._counts(self._ledgers[index])[0]
            if index == len(self._ledgers) - 1:
                return 0 <= position.entry_id <= entries
            return 0 <= position.entry_id < entries

    def entries_between(self, after: Position, upto: Position) -> int:
        """Number of entries ``p`` with ``after < p <= upto`` (entry level)."""
        with self._lock:
            return _entries_between(((ledger.ledger_id, self._counts(ledger)[0]) for ledger in self._ledgers),
                                    after, upto)

    def estimate_backlog_bytes(self, mark_delete_position: Position) -> int:
        """Bytes after ``mark_delete_position``, the consumed part of its ledger estimated
        with that ledger's average entry size (Pulsar's ``estimateBacklogFromPosition``)."""
        with self._lock:
            total = 0
            for ledger in self._ledgers:
                entries, size = self._counts(ledger)
                if ledger.ledger_id > mark_delete_position.ledger_id:
                    total += size
                elif ledger.ledger_id == mark_delete_position.ledger_id and entries:
                    consumed = min(mark_delete_position.entry_id + 1, entries)
                    total += size - size * consumed // entries
            return total

    # -- reading ------------------------------------------------------------------------

    def read_entries(self, start: Position, max_entries: int, *, end: Position | None = None) -> list[Entry]:
        """Up to ``max_entries`` entries from ``start`` (inclusive, entry level) forward,
        never past ``end`` (inclusive) nor the last confirmed position."""
        assert max_entries > 0, "a read must ask for at least one entry"
        with self._lock:
            bound = self.last_confirmed_position()
            if end is not None:
                bound = min(bound, end.entry_position())
            plan = self._read_plan(Position(start.ledger_id, max(start.entry_id, 0)), max_entries, bound)
        result: list[Entry] = []
        for ledger_id, first, last in plan:
            try:
                stored = self.store.read(ledger_id, first, last)
            except LedgerNotFoundError:
                if self._listed(ledger_id):
                    raise
                continue  # trimmed (on another thread) since the plan was made: reads skip it
            # read back as planned: the positions grow from ``start``, one per entry
            assert len(stored) == last - first + 1, f"ledger {ledger_id}: read {len(stored)} of {first}..{last}"
            assert not result or result[-1].position < Position(ledger_id, first), "positions only grow"
            for offset, data in enumerate(stored):
                result.append(Entry(Position(ledger_id, first + offset), data))
        return result

    def _listed(self, ledger_id: int) -> bool:
        with self._lock:
            return any(ledger.ledger_id == ledger_id for ledger in self._ledgers)

    def _read_plan(self, position: Position, max_entries: int, bound: Position) -> list[tuple[int, int, int]]:
        """Inclusive ``(ledger_id, first, last)`` ranges to read; caller holds the lock."""
        plan: list[tuple[int, int, int]] = []
        remaining = max_entries
        for ledger in self._ledgers[self._ceiling(position.ledger_id):]:
            first = position.entry_id if ledger.ledger_id == position.ledger_id else 0
            if remaining == 0 or Position(ledger.ledger_id, first) > bound:
                break
            last = self._counts(ledger)[0] - 1
            if ledger.ledger_id == bound.ledger_id:
                last = min(last, bound.entry_id)
            last = min(last, first + remaining - 1)
            if last >= first:
                plan.append((ledger.ledger_id, first, last))
                remaining -= last - first + 1
        return plan

    # -- offload (``ledger.offload`` drives it) -------------------------------------------

    def record_offloaded(self, ledger_id: int, offloaded_at_ms: int) -> bool:
        """Record that sealed ledger ``ledger_id``'s bucket copy was verified (one metadata
        transaction, then the list); False when it is no longer in the list (trimmed or
        deleted meanwhile)."""
        with self._lock:
            ledger = next((ledger for ledger in self._ledgers if ledger.ledger_id == ledger_id), None)
            if ledger is None or not ledger.closed_at_ms:
                return False
        if not self.metadata.record_offloaded(ledger_id, offloaded_at_ms):
            return False
        with self._lock:
            ledger.offloaded_at_ms = offloaded_at_ms
        return True

    def record_local_deleted(self, ledger_ids: Sequence[int], deleted_at_ms: int) -> list[int]:
        """Record (before their files go) that the local copies of the offloaded
        ``ledger_ids`` are let go; the ids recorded."""
        recorded = self.metadata.record_local_deleted(ledger_ids, deleted_at_ms)
        with self._lock:
            for ledger in self._ledgers:
                if ledger.ledger_id in recorded:
                    ledger.local_deleted_at_ms = deleted_at_ms
        return recorded

    # -- trimming -----------------------------------------------------------------------

    def trim(self) -> list[int]:
        """Delete the consumed prefix of closed ledgers that retention lets go.

        Returns the ids deleted. The bound is the slowest *persisted* mark-delete position
        of the durable cursors (the positions the cursor layer holds on the shared database,
        ``MetadataStore.held_positions``), so only durably consumed data is ever deleted.
        """
        with self._trim_lock:  # one trim at a time: each deletes what it chose
            with self._lock:
                if self.closed:
                    return []
                bound = self._slowest_reader_ledger_id()
                doomed = self._ledgers_to_trim(bound)
                if not doomed:
                    return []
            # the commit (an fsync) without the ledger's lock: no append waits for it. The
            # doomed ledgers are sealed and before the current one: nothing else changes them
            self.metadata.remove_ledgers(doomed)
            with self._lock:
                self._ledgers = [ledger for ledger in self._ledgers if ledger.ledger_id not in doomed]
        for ledger_id in doomed:  # quietly: a topic delete meanwhile may have deleted some
            self._delete_quietly(ledger_id)
        log.info("topic %s: trimmed ledgers %s", self.name, doomed)
        return doomed

    def _slowest_reader_ledger_id(self) -> int:
        """Ledgers with a smaller id than this are consumed by every durable cursor."""
        positions = self.metadata.held_positions(self.name)
        if not positions:
            return self._ledgers[-1].ledger_id + 1
        slowest = min(positions)
        index = self._ceiling(slowest.ledger_id)
        if index < len(self._ledgers) and self._ledgers[index].ledger_id == slowest.ledger_id:
            ledger = self._ledgers[index]
            if ledger.closed_at_ms and slowest.entry_id >= ledger.entries - 1:
                return ledger.ledger_id + 1
        return slowest.ledger_id

    def _ledgers_to_trim(self, bound: int) -> list[int]:
        """The deletable prefix: closed, below ``bound``, and released by retention."""
        now_ms = self._now_ms()
        retention_time, retention_size = self.config.retention_time_ms, self.config.retention_size_bytes
        total = sum(self._counts(ledger)[1] for ledger in self._ledgers)
        doomed: list[int] = []
        released = 0
        for ledger in self._ledgers[:-1]:  # the current ledger is never deleted
            if ledger.ledger_id >= bound:
                break
            released += ledger.size_bytes
            expired = retention_time >= 0 and now_ms - ledger.closed_at_ms > retention_time
            over_quota = retention_size >= 0 and total - released >= retention_size
            if not (expired or over_quota):
                break
            doomed.append(ledger.ledger_id)
        return doomed

    def delete(self) -> None:
        """Delete the topic: references first (one transaction), then every ledger's data."""
        with self._when_idle(CloseEvent(seal=False)):
            ledger_ids = self.metadata.delete_topic(self.name)
            self._ledgers = []
        for ledger_id in ledger_ids:  # unreferenced now: what fails is collected as an orphan
            self._delete_quietly(ledger_id)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
