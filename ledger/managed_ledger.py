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
  holds exactly the entries up to and including the one that filled it. Opened with
  ``roll_over_in_background`` (the broker does), the seal and the creation (their fsyncs
  and metadata commits) run on a thread of their own instead of the appender's: appends
  that arrive meanwhile wait in memory, in order (Pulsar's pending adds while a ledger is
  created), and go to the new ledger once it exists, so the appender never blocks on a
  roll-over's I/O.
* **A failed write** (Pulsar's answer to a BookKeeper write error): the append's future
  fails with ``LedgerIOError``, and so do the appends in flight behind it; none is ever
  reported durable unless it is. The next append seals the failed ledger at its last
  durable entry (an empty one leaves the list) and goes to a new ledger. When that cannot
  be done yet (the disk is still full), that append fails the same way and the next one
  tries again: the topic recovers by itself once the store works. With
  ``roll_over_in_background`` that roll past a failed ledger runs on a roll-over thread
  too (the appends meanwhile wait, as behind a full ledger), never on the appender's.
* **A failed roll-over backs off** (Pulsar's ``WaitTimeAfterLedgerCreationFailureMs``):
  for ``roll_over_retry_ms`` after a roll-over failed, appends that would need one fail
  at once with ``LedgerIOError``, touching no file; the first append (or
  ``ready_for_appends`` call) after that tries again. Its failures are logged at most once
  per ``ROLL_OVER_WARNING_INTERVAL_MS`` per topic. ``ready_for_appends`` tells the broker
  whether to take a new producer (one refused by a full disk retries with backoff, so its
  client's send timeout runs out instead of being restarted by each reconnect).
* **Last confirmed position**: the last durable entry of the current ledger, else the last
  entry of the nearest non-empty earlier ledger, else ``(first ledger, -1)``.
* **Reads** go forward from any position across ledgers, skipping missing (trimmed) and
  empty ledgers, never past the last confirmed position.
* **Trimming** deletes a prefix of closed ledgers that every durable cursor has consumed
  (the slowest persisted mark-delete position bounds it; with no durable cursor every
  closed ledger is a candidate), within the retention policy; the current ledger is never
  deleted. References leave the metadata store before data leaves the ledger store; that
  commit runs without the ledger's lock (one trim at a time), so appends never wait for it.

This module is longer than the project's 600 lines on purpose: everything here reads or
changes the ledger list under the one ``_lock`` (appends, roll-over, reads, positions,
trimming), and splitting it would spread that lock's users over modules.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterator
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
from ledger.storage.base import LedgerStore

__all__ = ["Entry", "ManagedLedger", "ManagedLedgerConfig"]

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
        # thread, which may hold a ledger's I/O lock that a roll-over under ``_lock`` waits
        # for: so never ``_lock`` there, only this leaf lock, held for a few assignments.
        self._counts_lock = threading.Lock()
        self._empty_ledgers: list[_Ledger] = []  # sealed, empty, still listed: to remove
        self._pending_entries = 0  # appended to the current ledger, durable or not
        self._pending_bytes = 0
        self._listeners: list[Callable[[Position], None]] = []
        self.entries_added_counter = 0
        self.closed = False
        self._background = roll_over_in_background
        self._rolling = False  # a background roll-over is in flight: appends wait in _queued
        self._queued: list[tuple[bytes, Future[Position]]] = []
        self._rolled = threading.Event()  # set while no roll-over is in flight
        self._rolled.set()
        self._on_sealed = on_sealed
        # The back-off after a failed roll-over (under ``_lock``): when the last try failed
        # (None once one succeeds) and why; futures of ``ready_for_appends`` waiting on a try.
        self._roll_failed_at_ms: int | None = None
        self._roll_failure = ""
        self._ready_waiters: list[Future[None]] = []
        self._warned_at_ms: int | None = None  # the last roll-over warning logged
        self._unwarned_failures = 0  # failed tries since that warning

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
        ``roll_over_in_background`` moves roll-overs off the appending thread.
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
        managed._create_ledger()
        return managed

    def _recover(self, record: LedgerRecord) -> _Ledger | None:
        """Seal a ledger left open by the last run; None if its data is gone."""
        if not record.is_open:
            return _Ledger(record.ledger_id, record.entries, record.size_bytes,
                           record.created_at_ms, record.closed_at_ms)
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

    def _create_ledger(self) -> None:
        """Create the next current ledger: ledger store first, then its reference."""
        self._add_current(self._new_ledger())

    def _add_current(self, ledger: _Ledger) -> None:
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
            if self.closed:
                raise LedgerError(f"managed ledger {self.name} is closed")
            if self._rolling:
                self._queued.append((data, outer))
            else:
                self._append_locked(data, outer)
        return outer

    def _append_locked(self, data: bytes, outer: Future[Position], *, inline: bool = False) -> None:
        """Submit one entry to the current ledger (caller holds the lock); roll over after
        the append that fills it. In the background mode an append that finds the current
        ledger failed (or sealed, or empty ledgers to drop) waits in ``_queued`` for a
        roll-over thread to roll past it, as behind a full one; ``inline`` rolls past it
        on the caller's thread (the foreground mode, and that thread's own retry)."""
        inline = inline or not self._background
        if self._backing_off():
            outer.set_exception(self._backoff_error())
            return
        if not inline and self._must_roll():
            self._start_roll_over((data, outer))
            return
        try:
            ledger, inner = self._submit(data, inline=inline)
        except LedgerFencedError as error:
            if inline:
                outer.set_exception(self._append_failure(error))
            else:  # fenced by a failure not reported yet: roll past it, then append
                self._start_roll_over((data, outer))
            return
        except (LedgerError, MetadataError) as error:
            outer.set_exception(self._append_failure(error))
            return
        self._pending_entries += 1
        self._pending_bytes += len(data)
        self.entries_added_counter += 1
        size = len(data)
        inner.add_done_callback(lambda done: self._on_durable(done, outer, ledger, size))
        if self._current_is_full():
            if self._background:
                self._start_roll_over(None)
            else:
                self._roll_over_after_append()

    def _must_roll(self) -> bool:
        """Whether the next append needs I/O first (``_writable_ledger``): the current
        ledger failed or is sealed, or empty ledgers wait to leave the list."""
        if not self._ledgers:  # deleted: the append fails as it always did
            return False
        current = self._ledgers[-1]
        return self._needs_roll(current) or (bool(self._empty_ledgers) and not self._in_retry_window())

    @staticmethod
    def _needs_roll(current: _Ledger) -> bool:
        return current.failed or bool(current.closed_at_ms)

    def _in_retry_window(self) -> bool:
        """Whether a roll-over failed less than ``roll_over_retry_ms`` ago (caller holds the lock)."""
        failed_at = self._roll_failed_at_ms
        return failed_at is not None and self._now_ms() - failed_at < self.config.roll_over_retry_ms

    def _backing_off(self) -> bool:
        """Whether the next append needs a roll-over that must not be tried yet (caller holds the lock)."""
        return bool(self._ledgers) and self._needs_roll(self._ledgers[-1]) and self._in_retry_window()

    def _backoff_error(self) -> LedgerIOError:
        assert self._roll_failed_at_ms is not None
        wait_ms = self._roll_failed_at_ms + self.config.roll_over_retry_ms - self._now_ms()
        return LedgerIOError(f"managed ledger {self.name}: cannot roll over ({self._roll_failure}); "
                             f"the next try is in {max(wait_ms, 0)} ms")

    def _roll_over_failed(self, error: BaseException) -> None:
        """Start the back-off after a failed roll-over; log it at most once per
        ``ROLL_OVER_WARNING_INTERVAL_MS`` (caller holds the lock)."""
        now_ms = self._now_ms()
        self._roll_failed_at_ms, self._roll_failure = now_ms, str(error)
        if self._warned_at_ms is not None and now_ms - self._warned_at_ms < ROLL_OVER_WARNING_INTERVAL_MS:
            self._unwarned_failures += 1
            return
        log.warning("topic %s: roll-over failed (%d failed tries not logged since the last warning), the "
                    "next try is in %d ms: %s", self.name, self._unwarned_failures, self.config.roll_over_retry_ms,
                    error)
        self._warned_at_ms, self._unwarned_failures = now_ms, 0

    def _roll_over_succeeded(self) -> None:
        if self._roll_failed_at_ms is not None:
            log.info("topic %s: roll-over succeeded; appends are taken again", self.name)
        self._roll_failed_at_ms = None
        self._warned_at_ms, self._unwarned_failures = None, 0

    def ready_for_appends(self) -> Future[None]:
        """Whether the topic takes appends now, for admitting a producer: resolved at once
        unless the current ledger failed or is sealed. While a roll-over past it failed less
        than ``roll_over_retry_ms`` ago it fails at once with ``LedgerIOError``; otherwise a
        roll-over is tried (on a roll-over thread in the background mode) and the future
        gets its outcome. Never blocks on I/O in the background mode."""
        ready: Future[None] = Future()
        with self._lock:
            if self.closed or not self._ledgers or not self._needs_roll(self._ledgers[-1]):
                ready.set_result(None)
            elif self._in_retry_window():
                ready.set_exception(self._backoff_error())
            elif self._background:
                self._ready_waiters.append(ready)
                if not self._rolling:
                    self._start_roll_over(None)
            else:
                try:
                    self._writable_ledger()
                except (LedgerError, MetadataError) as error:
                    ready.set_exception(self._append_failure(error))
                else:
                    ready.set_result(None)
        return ready

    def _start_roll_over(self, trigger: tuple[bytes, Future[Position]] | None) -> None:
        """Start a roll-over thread (caller holds the lock); appends wait in ``_queued``
        meanwhile, ``trigger`` (the append that asked for it, if any) first."""
        self._rolling = True
        self._rolled.clear()
        if trigger is not None:
            self._queued.insert(0, trigger)
        threading.Thread(target=self._roll_over_in_background, args=(trigger[1] if trigger else None,),
                         daemon=True, name=f"roll-over {self.name}").start()

    def _submit(self, data: bytes, *, inline: bool = True) -> tuple[_Ledger, Future[int]]:
        """Hand ``data`` to the current ledger, first rolling past a failed one (``inline``:
        on this thread; else a fenced ledger raises, for a roll-over thread)."""
        for attempt in range(2):
            current = self._writable_ledger() if inline else self._current()
            if current.failed and not inline:  # failed since ``_must_roll`` looked (the flusher)
                raise LedgerFencedError(f"ledger {current.ledger_id} failed a write", ledger_id=current.ledger_id)
            try:
                return current, self.store.append(current.ledger_id, data)
            except LedgerFencedError:  # fenced by a failure whose appends have not reported yet
                current.failed = True
                if attempt or not inline:
                    raise
            except LedgerIOError:  # the write failed at call time: this entry is not stored
                current.failed = True
                raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _writable_ledger(self) -> _Ledger:
        """The current ledger, once it accepts appends (Pulsar's answer to a BookKeeper
        write error): a failed one is sealed at its last durable entry, and a new one
        created after a sealed one. Raises when the store or the metadata refuses."""
        current = self._current()
        if self._needs_roll(current) and self._in_retry_window():
            raise self._backoff_error()
        try:
            if current.failed and not current.closed_at_ms:
                self._seal(current)
                log.warning("topic %s: ledger %d failed; sealed at %d entries, rolling over",
                            self.name, current.ledger_id, current.entries)
            if current.closed_at_ms:
                self._create_ledger()
                if current.entries == 0 and current not in self._empty_ledgers:  # it does not stay in the list
                    self._empty_ledgers.append(current)
                self._roll_over_succeeded()
        except (LedgerError, MetadataError) as error:
            self._roll_over_failed(error)
            raise
        while self._empty_ledgers and not self._in_retry_window():  # harmless while listed (reads skip them): retried each append
            try:
                self._remove_empty(self._empty_ledgers[0])
            except MetadataError as error:
                self._roll_over_failed(error)  # empty ledger stays listed (reads skip it) until a later try
                break
            self._empty_ledgers.pop(0)
        return self._ledgers[-1]

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

    def _current_is_full(self) -> bool:
        current = self._ledgers[-1]
        full = (self._pending_entries >= self.config.max_entries_per_ledger
                or self._pending_bytes >= self.config.max_size_per_ledger_bytes)
        old_enough = self._now_ms() - current.created_at_ms >= self.config.min_rollover_time_ms
        return full and old_enough

    def _roll_over_after_append(self) -> None:
        """Roll over; the append that filled the ledger is taken already, so a failure here
        is not its failure: the ledger is marked, and the next append rolls over."""
        try:
            sealed = self._ledgers[-1]
            self._seal_current()
            self._create_ledger()
            self._log_roll_over(sealed, self._ledgers[-1])
        except (LedgerError, MetadataError) as error:
            self._roll_over_failed(error)
            if not self._ledgers[-1].closed_at_ms:
                self._ledgers[-1].failed = True

    def _log_roll_over(self, sealed: _Ledger, current: _Ledger) -> None:
        log.debug("topic %s: ledger %d rolled over at %d entries, %d bytes; ledger %d is current",
                  self.name, sealed.ledger_id, sealed.entries, sealed.size_bytes, current.ledger_id,
                  extra={"event": "ledger-roll-over", "topic": self.name, "sealed_ledger_id": sealed.ledger_id,
                         "ledger_id": current.ledger_id})

    def _roll_over_in_background(self, trigger: Future[Position] | None) -> None:
        """Seal the current ledger (full, or failed: cut back to its last durable entry)
        unless it is sealed already, create the next one and drop the empty ones, without
        the lock (no append reaches the ledger list: they wait in ``_queued``), then hand
        the waiting appends to the new ledger in order. A failure leaves the ledger marked:
        the append that asked for this roll past a failed ledger (``trigger``) fails with
        it, as it would have on its own thread, and the waiting appends after it take the
        ordinary path, each starting its own try (the topic recovers by itself)."""
        with self._lock:
            current = self._ledgers[-1]
            roll = trigger is None or current.failed or bool(current.closed_at_ms)  # else: empty ones only
        new: _Ledger | None = None
        failure: Exception | None = None
        try:
            if roll and not current.closed_at_ms:
                failed = current.failed
                self._seal(current)
                if failed:
                    log.warning("topic %s: ledger %d failed; sealed at %d entries, rolling over",
                                self.name, current.ledger_id, current.entries)
            if roll:
                new = self._new_ledger()
        except Exception as error:  # noqa: BLE001 - an append must never wait forever on a roll-over
            failure = error
        with self._lock:
            if failure is not None:
                self._roll_over_failed(failure)
            elif roll:
                self._roll_over_succeeded()
            if roll and current.closed_at_ms and current.entries == 0:
                if current not in self._empty_ledgers:
                    self._empty_ledgers.append(current)  # every append to it failed: it leaves the list
            elif roll and not current.closed_at_ms:
                current.failed = True
            if new is not None:
                self._add_current(new)
                self._log_roll_over(current, new)
        self._remove_empty_ledgers()
        with self._lock:
            self._rolling = False
            waiters, self._ready_waiters = self._ready_waiters, []
            for ready in waiters:
                if failure is None:
                    ready.set_result(None)
                else:
                    ready.set_exception(self._append_failure(failure))
            while self._queued and not self._rolling:
                data, outer = self._queued.pop(0)
                if self.closed:
                    outer.set_exception(LedgerError(f"managed ledger {self.name} is closed"))
                elif outer is trigger and failure is not None:
                    outer.set_exception(self._append_failure(failure))
                else:
                    self._append_locked(data, outer, inline=outer is trigger)
            if not self._rolling:
                self._rolled.set()

    def _remove_empty_ledgers(self) -> None:
        """Drop the empty, sealed ledgers waiting to leave the list, outside the lock (a
        roll-over thread: appends wait in ``_queued``); only once a writable ledger is
        current, never the current one. A failure leaves them for the next try."""
        with self._lock:
            if self._ledgers[-1].closed_at_ms:
                return
            empty = [ledger for ledger in self._empty_ledgers if ledger is not self._ledgers[-1]]
        for ledger in empty:
            try:
                self.metadata.remove_ledgers([ledger.ledger_id])
            except MetadataError as error:  # it stays listed (reads skip it) until a later try
                with self._lock:
                    self._roll_over_failed(error)
                return
            with self._lock:
                if ledger in self._ledgers:  # trimming may have dropped it already
                    self._ledgers.remove(ledger)
                if ledger in self._empty_ledgers:
                    self._empty_ledgers.remove(ledger)
            self._delete_quietly(ledger.ledger_id)

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
        with self._quiet_lock():
            if not self.closed:
                self._seal_current()
                self.closed = True

    @contextmanager
    def _quiet_lock(self) -> Iterator[None]:
        """Hold the lock at a moment when no roll-over is in flight."""
        while True:
            self._rolled.wait()
            with self._lock:
                if not self._rolling:
                    yield
                    return

    # -- the ledger list and positions --------------------------------------------------

    def ledger_list(self) -> list[LedgerRecord]:
        """The ledger list, ascending; the current ledger shows its confirmed counts."""
        with self._lock:
            return [self._record(ledger) for ledger in self._ledgers]

    def _record(self, ledger: _Ledger) -> LedgerRecord:
        entries, size = self._counts(ledger)
        return LedgerRecord(ledger.ledger_id, self.name, "data", entries, size,
                            ledger.created_at_ms, ledger.closed_at_ms)

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
            count = 0
            for ledger in self._ledgers:
                entries = self._counts(ledger)[0]
                low = after.entry_id + 1 if ledger.ledger_id == after.ledger_id else 0
                high = upto.entry_id if ledger.ledger_id == upto.ledger_id else entries - 1
                if after.ledger_id <= ledger.ledger_id <= upto.ledger_id:
                    count += max(0, min(high, entries - 1) - max(low, 0) + 1)
            return count

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
        with self._quiet_lock():
            self.closed = True
            ledger_ids = self.metadata.delete_topic(self.name)
            self._ledgers = []
        for ledger_id in ledger_ids:
            self.store.delete(ledger_id)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
