"""A topic's compaction state: its published compacted view and its record.

The only persistent state of compaction is the durable ``__compaction`` cursor: its
mark-delete position is the **horizon** and its property ``CompactedTopicLedger`` the id
of the published compacted ledger (Pulsar's constants). ``CompactedTopic`` owns that cursor:
``restore`` opens it once when a topic loads (the broker has it created at the earliest
entry, so that nothing is trimmed before a compaction covered it) and rebuilds the view
from it; a run
gets it from ``cursor`` and publishes through ``publish``; the scheduler reads its backlog
from it. No module outside the compactor opens it by name or touches its rows. A property
pointing at a missing ledger leaves the topic *broken*: compacted reads and new runs raise
``CompactedLedgerMissingError`` while raw reads keep working, until the ``__compaction``
subscription is deleted (``drop_view``).

The view is one immutable ``CompactedView`` value swapped whole at publish. ``publish``
and ``drop_view`` exclude each other; a run publishes only if the cursor it was handed is
still the topic's and the view it read is still the published one, so a subscription
deleted, or another run published, while it ran makes it fail (deleting its ledger)
instead of bringing the subscription back. Whether a run is in flight is not this
module's business: ``compactor.runs`` owns that.

What a read-compacted subscription gets from the view (the first-read rule, its read
position and index in the view, the surviving-slot masks, ``get_last_message_id``) is
``compactor.reader.CompactedReader``'s: this module only publishes views (``view``,
``horizon``), and a reader picks up a newly installed one at its next read.
"""

from __future__ import annotations

import threading

from compactor.errors import CompactedLedgerMissingError, CompactorError
from compactor.record import CompactionRecord
from compactor.view import CompactedView
from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.errors import LedgerNotFoundError
from ledger.managed_ledger import ManagedLedger
from ledger.position import Position

__all__ = ["COMPACTED_TOPIC_LEDGER", "COMPACTION_SUBSCRIPTION", "CompactedTopic"]

COMPACTION_SUBSCRIPTION = "__compaction"
COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"


class CompactedTopic:
    """Compaction state of one topic (``ledger``, whose durable cursors are in ``cursors``);
    build it with ``restore``."""

    def __init__(self, ledger: ManagedLedger, cursors: CursorStore, cursor: ManagedCursor | None = None) -> None:
        self.ledger = ledger
        self.cursors = cursors
        self.record = CompactionRecord()
        self._cursor = cursor
        self._view: CompactedView | None = None
        self._missing_ledger_id: int | None = None
        self._publish_lock = threading.Lock()

    @classmethod
    def restore(cls, ledger: ManagedLedger, cursors: CursorStore, *, create_cursor: bool = False) -> CompactedTopic:
        """Open the ``__compaction`` cursor and the view its persisted state describes.

        Without ``create_cursor`` a topic never compacted gets no cursor until its first run
        (``cursor``), as Pulsar; with it (the broker), the cursor starts at the earliest entry.
        """
        if not create_cursor and cursors.load(ledger.name, COMPACTION_SUBSCRIPTION) is None:
            return cls(ledger, cursors)
        cursor = ManagedCursor.open_durable(ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST, store=cursors)
        topic = cls(ledger, cursors, cursor)
        ledger_id = cursor.properties.get(COMPACTED_TOPIC_LEDGER)
        if ledger_id is None:
            return topic
        try:
            topic._view = CompactedView(ledger.store, ledger_id, cursor.mark_delete_position)
        except LedgerNotFoundError:
            topic._missing_ledger_id = ledger_id
        return topic

    @property
    def name(self) -> str:
        return self.ledger.name

    @property
    def cursor(self) -> ManagedCursor:
        """The durable ``__compaction`` cursor, opened again (at the earliest entry) after
        ``drop_view`` deleted it."""
        with self._publish_lock:
            if self._cursor is None:
                self._cursor = ManagedCursor.open_durable(
                    self.ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST, store=self.cursors)
            return self._cursor

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

    def publish(self, cursor: ManagedCursor, view: CompactedView, previous: CompactedView | None) -> None:
        """Persist ``view`` in one transaction (``cursor``'s mark-delete = the horizon with
        ``CompactedTopicLedger`` = its ledger), then swap it in.

        ``CompactorError`` and nothing persisted when ``cursor`` is no longer the topic's
        (the subscription was deleted during the run) or ``previous`` is no longer the
        published view (another run published, or the topic broke).
        """
        with self._publish_lock:
            if cursor is not self._cursor:
                raise CompactorError(f"{self.name}: the __compaction subscription was deleted during the run")
            if previous is not self._view or self._missing_ledger_id is not None:
                raise CompactorError(f"{self.name}: the compacted view changed during the run")
            cursor.mark_delete(view.horizon, {**cursor.properties, COMPACTED_TOPIC_LEDGER: view.ledger_id})
            self._view = view

    def drop_view(self) -> None:
        """Delete the ``__compaction`` subscription: its cursor, the view, then its ledger.

        A run in flight will not publish afterwards (see ``publish``).
        """
        with self._publish_lock:
            ledger_id = self._view.ledger_id if self._view is not None else self._missing_ledger_id
            if self._cursor is not None:
                self._cursor.delete_durable()
            self._cursor, self._view, self._missing_ledger_id = None, None, None
        if ledger_id is not None:
            self.ledger.store.delete(ledger_id)

    def delete(self) -> None:
        """Delete the topic: its compacted view and ledger, then its managed ledger."""
        self.drop_view()
        self.ledger.delete()

