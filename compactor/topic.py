"""A topic's compaction state: its compacted view, what read-compacted readers get, its record.

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

Read-compacted dispatch (``read_compacted``, Pulsar's ``asyncReadCompactedEntries``):

1. the read position is ``EARLIEST`` on a consumer's first read when it started from the
   earliest message (the first-read-from-earliest rule: the managed ledger moves a new
   cursor to the first *existing* raw entry, which may lie past compacted data), else the
   cursor's read position; a durable cursor that acknowledged nothing of the ledgers left
   then moves its mark-delete position back before the compacted entries whose raw ledgers
   were trimmed, so that its acks of them are kept (``compacted_successor`` names those
   entries to the cursor);
2. no view, or a read position after the horizon: read the raw topic;
3. else read compacted entries at or after the read position, skipping those the cursor
   holds as individually acknowledged (their positions are scattered over the raw topic, so
   such acks rarely move the mark-delete position: without the skip a re-subscribe would
   deliver them again); if there are none left, move the cursor to just after the horizon
   and read the raw topic; else move the cursor just past the last entry read.
"""

from __future__ import annotations

import threading

from compactor.algorithm import CompactedEntry
from compactor.errors import CompactedLedgerMissingError, CompactorError, MalformedEntryError
from compactor.message import is_batch, parse_entry
from compactor.record import CompactionRecord
from compactor.view import CompactedView
from cursor.cursor import InitialPosition, ManagedCursor
from ledger.errors import LedgerNotFoundError
from ledger.managed_ledger import ManagedLedger
from ledger.position import EARLIEST, Position

__all__ = ["COMPACTED_TOPIC_LEDGER", "COMPACTION_SUBSCRIPTION", "NO_MESSAGE", "CompactedTopic"]

COMPACTION_SUBSCRIPTION = "__compaction"
COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"
NO_MESSAGE = Position(-1, -1)
"""What ``last_message_id`` answers when a compacted reader has nothing to read (-1:-1)."""


class CompactedTopic:
    """Compaction state of one topic (``ledger``); build it with ``restore``."""

    def __init__(self, ledger: ManagedLedger, cursor: ManagedCursor | None = None) -> None:
        self.ledger = ledger
        self.record = CompactionRecord()
        self._cursor = cursor
        self._view: CompactedView | None = None
        self._missing_ledger_id: int | None = None
        self._publish_lock = threading.Lock()

    @classmethod
    def restore(cls, ledger: ManagedLedger, *, create_cursor: bool = False) -> CompactedTopic:
        """Open the ``__compaction`` cursor and the view its persisted state describes.

        Without ``create_cursor`` a topic never compacted gets no cursor until its first run
        (``cursor``), as Pulsar; with it (the broker), the cursor starts at the earliest entry.
        """
        if not create_cursor and COMPACTION_SUBSCRIPTION not in ledger.metadata.list_cursors(ledger.name):
            return cls(ledger)
        cursor = ManagedCursor.open_durable(ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST)
        topic = cls(ledger, cursor)
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
                    self.ledger, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST)
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

    # -- what read-compacted readers get ------------------------------------------------

    def read_compacted(
        self, cursor: ManagedCursor, max_entries: int, *, first_read_from_earliest: bool = False
    ) -> list[CompactedEntry]:
        """The next entries for a read-compacted ``cursor`` (see the module docstring)."""
        read_position = EARLIEST if first_read_from_earliest else cursor.read_position
        view = self.view
        if first_read_from_earliest and view is not None:
            self._retreat_before_trimmed(cursor, view)
        if view is not None and read_position <= view.horizon:
            while compacted := view.read_from(read_position, max_entries):
                last = compacted[-1].position
                read_position = Position(last.ledger_id, last.entry_id + 1)
                cursor.seek(read_position, force=True)
                unacknowledged = [e for e in compacted if not cursor.is_individually_acknowledged(e.position)]
                if unacknowledged:
                    return unacknowledged
            after_horizon = self.ledger.next_valid_position(view.horizon)
            cursor.seek(max(after_horizon, read_position), force=True)
        return [CompactedEntry(entry.position, entry.data) for entry in cursor.read_entries(max_entries)]

    def _retreat_before_trimmed(self, cursor: ManagedCursor, view: CompactedView) -> None:
        """A durable cursor at the first ledger's start moves back before the view's first
        entry when that entry's raw ledger was trimmed."""
        if not cursor.durable or view.entries == 0 or cursor.mark_delete_position != self.ledger.first_position():
            return
        first = view.position_at(0)
        if first < cursor.mark_delete_position:
            cursor.retreat_into_trimmed(Position(first.ledger_id, first.entry_id - 1))

    def trimmed_successor(self, position: Position) -> Position | None:
        """The first compacted entry after ``position`` when its raw ledger was trimmed
        (before the first ledger), else None: a read-compacted cursor's
        ``compacted_successor``. None too when the topic has no view or a broken one."""
        view = self._view
        if view is None or self._missing_ledger_id is not None:
            return None
        index = view.find_start(Position(position.ledger_id, position.entry_id + 1))
        if index is None:
            return None
        found = view.position_at(index)
        return found if found.ledger_id < self.ledger.first_position().ledger_id else None

    def last_message_id(self) -> Position:
        """``get_last_message_id`` for a compacted reader (Pulsar's rules, reference §2.4):
        the raw topic's last message when it is past the horizon, else the last surviving
        compacted message, else ``NO_MESSAGE`` (-1:-1)."""
        last = self.ledger.last_confirmed_position()
        view = self.view
        if view is not None and (last.entry_id < 0 or last <= view.horizon):
            return view.last_message_id() or NO_MESSAGE
        if last.entry_id < 0:
            return NO_MESSAGE
        return self._with_last_batch_index(last)

    def last_raw_message_id(self) -> Position:
        """``get_last_message_id`` for a plain reader: the topic's last entry, with the batch
        index of its last slot; ``(ledger, -1)`` on an empty topic."""
        last = self.ledger.last_confirmed_position()
        return last if last.entry_id < 0 else self._with_last_batch_index(last)

    def _with_last_batch_index(self, position: Position) -> Position:
        """``position`` with the batch index of its last slot when the entry is a batch."""
        data = self.ledger.read_entries(position, 1)[0].data
        try:
            metadata = parse_entry(data).metadata
        except MalformedEntryError:
            return position
        if is_batch(metadata):
            return position.with_batch_index(metadata.num_messages_in_batch - 1)
        return position
