"""A topic's compaction state: its published compacted view and its record.

The persistent state of compaction is the durable ``__compaction`` cursor and the
compactor's manifest (``compactor.view.manifest``): the cursor's mark-delete position is the
**horizon**, its property ``CompactedTopicLedger`` the id of the view's first compacted
ledger (Pulsar's constants; properties are longs), and the manifest lists every ledger of
the view in stream order. Both are written in **one transaction** (the manifest through the
cursor save's ``also`` hook). ``CompactedTopic`` owns that cursor and the topic's manifest
rows: ``restore`` opens the cursor once when a topic loads (the broker has it created at
the earliest entry, so that nothing is trimmed before a compaction covered it) and rebuilds
the view from the manifest (a topic published before the manifest existed, with the
property only, restores as a one-ledger view); a run
gets it from ``cursor`` and publishes through ``publish``; the scheduler reads its backlog
from it. No module outside the compactor opens it by name or touches its rows. A view with
a missing ledger leaves the topic *broken*: compacted reads and new runs raise
``CompactedLedgerMissingError`` (naming the first missing ledger) while raw reads keep
working, until the ``__compaction`` subscription is deleted (``drop_view``).

The view is one immutable ``CompactedView`` value swapped whole at publish. ``publish``
and ``drop_view`` exclude each other; a run publishes only if the cursor it was handed is
still the topic's and the view it read is still the published one, so a subscription
deleted, or another run published, while it ran makes it fail (deleting its ledgers)
instead of bringing the subscription back. Whether a run is in flight is not this
module's business: ``compactor.runs.runs`` owns that.

**Replaced ledgers.** The ledgers of the view a publish replaces are recorded as garbage
in the same transaction, deletable ``grace_period_s`` later (``compactor.view.manifest``: a
Spark scan or task retry reading them keeps its input until the sweep); with a grace
period of 0 they are deleted right after the transaction, as before. ``drop_view`` (the
``__compaction`` subscription deleted) and ``delete`` (the topic) delete the view's
ledgers at once, as Pulsar. The broker drops a view in two steps (``detach_view``): out of
memory on the event loop, so no read after it uses the view's ledgers, then the
transaction and the files on a worker thread; ``cursor`` and ``delete`` wait for that.

What a read-compacted subscription gets from the view (the first-read rule, its read
position and index in the view, the surviving-slot masks, ``get_last_message_id``) is
``compactor.view.reader.CompactedReader``'s: this module only publishes views (``view``,
``horizon``), and a reader picks up a newly installed one at its next read.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from compactor.errors import CompactedLedgerMissingError, CompactorError
from compactor.record import CompactionRecord
from compactor.view.manifest import CompactedManifests
from compactor.view.view import CompactedView
from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.errors import LedgerNotFoundError
from ledger.managed_ledger import ManagedLedger
from ledger.position import Position
from ledger.storage.base import LedgerStore

__all__ = ["COMPACTED_TOPIC_LEDGER", "COMPACTION_SUBSCRIPTION", "CompactedTopic"]

COMPACTION_SUBSCRIPTION = "__compaction"
COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"

_State = tuple[ManagedCursor | None, CompactedView | None, int | None, tuple[int, ...]]  # what a drop takes

log = logging.getLogger(__name__)


class CompactedTopic:
    """Compaction state of one topic (``ledger``, whose durable cursors are in ``cursors``);
    build it with ``restore``. ``grace_period_s``: how long replaced compacted ledgers are
    kept (0: deleted at once); ``clock``: seconds since the epoch, for their delete-after."""

    def __init__(self, ledger: ManagedLedger, cursors: CursorStore, cursor: ManagedCursor | None = None, *,
                 grace_period_s: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.ledger = ledger
        self.cursors = cursors
        self.manifests = CompactedManifests(cursors.database)
        self.grace_period_s = grace_period_s
        self.record = CompactionRecord()
        self._clock = clock
        self._cursor = cursor
        self._view: CompactedView | None = None
        self._missing_ledger_id: int | None = None
        self._broken_ledger_ids: tuple[int, ...] = ()  # the ledgers of a broken view
        self._publish_lock = threading.Lock()
        self._dropping: threading.Event | None = None  # set once a detach_view's second step ended

    @classmethod
    def restore(cls, ledger: ManagedLedger, cursors: CursorStore, *, create_cursor: bool = False,
                grace_period_s: float = 0.0, clock: Callable[[], float] = time.time) -> CompactedTopic:
        """Open the ``__compaction`` cursor and the view its persisted state describes.

        Without ``create_cursor`` a topic never compacted gets no cursor until its first run
        (``cursor``), as Pulsar; with it (the broker), the cursor starts at the earliest entry.
        """
        if not create_cursor and cursors.load(ledger.name, COMPACTION_SUBSCRIPTION) is None:
            return cls(ledger, cursors, grace_period_s=grace_period_s, clock=clock)
        cursor = ManagedCursor.open_durable(ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST, store=cursors)
        topic = cls(ledger, cursors, cursor, grace_period_s=grace_period_s, clock=clock)
        ledger_id = cursor.properties.get(COMPACTED_TOPIC_LEDGER)
        if ledger_id is None:
            return topic
        ledger_ids = topic.manifests.view_ledger_ids(ledger.name, ledger_id)
        try:
            topic._view = CompactedView(ledger.store, ledger_ids, cursor.mark_delete_position,
                                        topic.manifests.marks(ledger.name))
        except LedgerNotFoundError:
            topic._missing_ledger_id = _first_missing(ledger.store, ledger_ids)
            topic._broken_ledger_ids = ledger_ids
        return topic

    @property
    def name(self) -> str:
        return self.ledger.name

    @property
    def cursor(self) -> ManagedCursor:
        """The durable ``__compaction`` cursor, opened again (at the earliest entry) after
        ``drop_view`` deleted it; waits for a drop in flight (``detach_view``)."""
        while True:
            self.wait_for_drop()
            with self._publish_lock:
                if self._dropping is not None:
                    continue  # another drop began meanwhile
                if self._cursor is None:
                    self._cursor = ManagedCursor.open_durable(
                        self.ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST, store=self.cursors)
                return self._cursor

    @property
    def backlog_from(self) -> Position:
        """Where the backlog of compaction starts: the cursor's mark-delete position, or,
        with no cursor (never compacted, or the subscription deleted), before the topic's
        first entry, where a run's ``cursor`` would open it. Opens nothing (the scheduler
        asks this on the event loop)."""
        cursor = self._cursor
        return cursor.mark_delete_position if cursor is not None else self.ledger.first_position()

    @property
    def view(self) -> CompactedView | None:
        """The published view; None before the first compaction; raises when broken."""
        if self._missing_ledger_id is not None:
            raise CompactedLedgerMissingError(self.name, self._missing_ledger_id)
        return self._view

    @property
    def broken(self) -> int | None:
        """The id of the missing compacted ledger when the topic is broken, else None."""
        return self._missing_ledger_id

    @property
    def horizon(self) -> Position | None:
        """Last raw position the compacted view covers, or None."""
        view = self.view
        return None if view is None else view.horizon

    def publish(self, cursor: ManagedCursor, view: CompactedView, previous: CompactedView | None, *,
                in_bucket: bool = False) -> None:
        """Persist ``view`` in one transaction (``cursor``'s mark-delete = the horizon with
        ``CompactedTopicLedger`` = its first ledger, the manifest = its ledgers, recorded
        ``in_bucket`` when they were written into the object store, the dead marks that
        changed since ``previous``, the previous view's ledgers it no longer holds recorded
        as garbage), then swap it in; with no grace period, delete
        the previous view's ledgers (a failure there is only logged: they are garbage).

        ``CompactorError`` and nothing persisted when ``cursor`` is no longer the topic's
        (the subscription was deleted during the run) or ``previous`` is no longer the
        published view (another run published, or the topic broke).
        """
        now_ms = self._now_ms()
        with self._publish_lock:
            if cursor is not self._cursor:
                raise CompactorError(f"{self.name}: the __compaction subscription was deleted during the run")
            if previous is not self._view or self._missing_ledger_id is not None:
                raise CompactorError(f"{self.name}: the compacted view changed during the run")
            replaced = () if previous is None else tuple(i for i in previous.ledger_ids if i not in view.ledger_ids)
            changed = {ledger_id: mark for ledger_id, mark in view.marks.items()
                       if previous is None or previous.marks.get(ledger_id) is not mark}
            also = functools.partial(self.manifests.write, topic=self.name, ledger_ids=view.ledger_ids,
                                     garbage=replaced, delete_after_ms=self._delete_after_ms(now_ms),
                                     in_bucket=in_bucket, marks=changed)
            cursor.mark_delete(view.horizon, {**cursor.properties, COMPACTED_TOPIC_LEDGER: view.ledger_id},
                               also=also)
            self._view = view
        self._delete_at_once(replaced, now_ms, self.grace_period_s)

    def detach_view(self) -> Callable[[], None]:
        """Delete the ``__compaction`` subscription in two steps. Now, on the caller's
        thread (the event loop: no I/O): the view and the cursor leave memory, so a reader's
        next read finds no view and reads the raw topic, and ``cursor`` (a run) waits for
        the second step. Returned, to run once on a worker thread: the second step, the
        cursor and the manifest deleted in one transaction (which records the view's
        ledgers as garbage due now), then the ledgers themselves, at once: dropping the view
        is an explicit delete, not a replacement, so no grace period applies (a crash before
        the ledgers are deleted leaves due garbage, deleted at the next start).

        Should the transaction fail, nothing was deleted: the view and the cursor come back
        as they were (unless another drop followed) and the error is raised. A drop still
        in flight ends before the next one's transaction. A run in flight will not publish
        afterwards (see ``publish``).
        """
        now_ms = self._now_ms()
        with self._publish_lock:
            before, done = self._dropping, threading.Event()
            state = self._cursor, self._view, self._missing_ledger_id, self._broken_ledger_ids
            self._cursor, self._view, self._missing_ledger_id, self._broken_ledger_ids = None, None, None, ()
            self._dropping = done

        def rest() -> None:
            try:
                if before is not None:
                    before.wait()
                self._drop_durably(state, now_ms, done)
            finally:
                with self._publish_lock:
                    if self._dropping is done:
                        self._dropping = None
                done.set()

        return rest

    def drop_view(self) -> None:
        """Delete the ``__compaction`` subscription, both steps of ``detach_view`` on the
        caller's thread."""
        self.detach_view()()

    def wait_for_drop(self) -> None:
        """Return once no ``detach_view`` second step is pending (at once when none is)."""
        while (pending := self._dropping) is not None:
            pending.wait()

    def _drop_durably(self, state: _State, now_ms: int, done: threading.Event) -> None:
        cursor, view, _, broken_ledger_ids = state
        ledger_ids = view.ledger_ids if view is not None else broken_ledger_ids
        try:
            if cursor is not None:
                cursor.delete_durable(also=functools.partial(
                    self.manifests.write, topic=self.name, ledger_ids=None, garbage=ledger_ids,
                    delete_after_ms=now_ms))
        except BaseException:
            with self._publish_lock:
                if self._dropping is done:  # no drop since: what the failed one took comes back
                    self._cursor, self._view, self._missing_ledger_id, self._broken_ledger_ids = state
            raise
        self._delete_at_once(ledger_ids, now_ms, 0.0)

    def delete(self) -> None:
        """Delete the topic: its compacted view and ledgers (after a drop in flight), then
        its managed ledger."""
        self.drop_view()
        self.ledger.delete()

    def _delete_after_ms(self, now_ms: int) -> int:
        return now_ms + int(self.grace_period_s * 1000)

    def _delete_at_once(self, ledger_ids: Sequence[int], now_ms: int, grace_period_s: float) -> None:
        """Sweep ``ledger_ids`` now when there is no grace period (a failure is logged:
        they stay garbage, which the next sweep or start deletes)."""
        if not ledger_ids or grace_period_s > 0:
            return
        try:
            self.manifests.sweep(self.ledger.store, now_ms, only=ledger_ids)
        except Exception as error:  # noqa: BLE001 - published; the old ledgers are only garbage now
            log.warning("%s: could not delete replaced compacted ledgers %s: %s", self.name, list(ledger_ids), error)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _first_missing(store: LedgerStore, ledger_ids: Sequence[int]) -> int:
    """The first of ``ledger_ids`` that ``store`` does not have (the first one if all are there)."""
    for ledger_id in ledger_ids:
        try:
            store.info(ledger_id)
        except LedgerNotFoundError:
            return ledger_id
    return ledger_ids[0]
