"""A topic's compaction state: its published compacted view and its record.

The only persistent state of compaction is the durable ``__compaction`` cursor: its
mark-delete position is the **horizon** and its property ``CompactedTopicLedger`` the id
of the published compacted ledger (Pulsar's constants). ``CompactedTopic.restore`` rebuilds
the view from them when a topic loads; a property pointing at a missing ledger leaves the
topic *broken*: compacted reads and new runs raise ``CompactedLedgerMissingError`` while raw
reads keep working, until the ``__compaction`` subscription is deleted (``drop_view``).

What a read-compacted subscription gets from the view (the first-read rule, its read
position and index in the view, the surviving-slot masks, ``get_last_message_id``) is
``compactor.reader.CompactedReader``'s: this module only publishes views (``view``,
``horizon``), and a reader picks up a newly installed one at its next read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from compactor.errors import CompactedLedgerMissingError, CompactionInProgressError
from compactor.record import CompactionRecord
from compactor.view import CompactedView
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

    def __init__(self, ledger: ManagedLedger, cursors: CursorStore) -> None:
        self.ledger = ledger
        self.cursors = cursors
        self.record = CompactionRecord()
        self._view: CompactedView | None = None
        self._missing_ledger_id: int | None = None
        self._run_lock = threading.Lock()

    @classmethod
    def restore(cls, ledger: ManagedLedger, cursors: CursorStore) -> CompactedTopic:
        """The topic's view as the ``__compaction`` cursor's persisted state describes it."""
        topic = cls(ledger, cursors)
        record = cursors.load(ledger.name, COMPACTION_SUBSCRIPTION)
        if record is None or COMPACTED_TOPIC_LEDGER not in record.properties:
            return topic
        ledger_id = record.properties[COMPACTED_TOPIC_LEDGER]
        try:
            topic._view = CompactedView(ledger.store, ledger_id, record.mark_delete_position)
        except LedgerNotFoundError:
            topic._missing_ledger_id = ledger_id
        return topic

    @property
    def name(self) -> str:
        return self.ledger.name

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

    def install(self, view: CompactedView) -> CompactedView | None:
        """Swap in a newly published view; returns the previous one."""
        previous, self._view = self._view, view
        self._missing_ledger_id = None
        return previous

    def drop_view(self) -> None:
        """Delete the ``__compaction`` subscription: forget the view, then delete its ledger.

        Waits for a running compaction, which must not publish after the subscription is gone.
        """
        with self._run_lock:
            ledger_id = self._view.ledger_id if self._view is not None else self._missing_ledger_id
            self.cursors.delete(self.name, COMPACTION_SUBSCRIPTION)
            self._view, self._missing_ledger_id = None, None
            if ledger_id is not None:
                self.ledger.store.delete(ledger_id)

    def delete(self) -> None:
        """Delete the topic: its compacted view and ledger, then its managed ledger."""
        self.drop_view()
        self.ledger.delete()

    @contextmanager
    def exclusive_run(self) -> Iterator[None]:
        """Held for the length of a run; ``CompactionInProgressError`` if one is running."""
        if not self._run_lock.acquire(blocking=False):
            raise CompactionInProgressError(self.name)
        try:
            yield
        finally:
            self._run_lock.release()

    @property
    def running(self) -> bool:
        """A run is in progress."""
        return self._run_lock.locked()
