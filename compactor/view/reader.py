"""The compacted reader: one subscription's read position over a topic's compacted view.

``CompactedReader`` is built per subscription over the topic's ``CompactedTopic`` (which
only publishes views: ``view``, ``horizon``) and the subscription's ``ManagedCursor``
(which only counts acknowledgements and reads the raw topic). It owns every piece of
read-compacted state, so dispatch (``api.broker.dispatch.Subscription``) and the unit
scenario suite drive the same object:

* **the first-read-from-earliest rule** (Pulsar #11287, narrowed by #21187): a consumer
  that starts from the earliest message reads the whole compacted view on its first read,
  although the managed ledger positions a new cursor at the first *existing* raw entry,
  which may lie past compacted data. A durable subscription qualifies only while its
  mark-delete position is a ledger start (it acknowledged nothing of the ledgers left);
  it then also moves its mark-delete position back before the compacted entries whose raw
  ledgers were trimmed, so that its acks of them are kept (``trimmed_successor`` names
  those entries to the cursor as its ``compacted_successor``);
* **the sought position**: a seek leaves the position the consumers' re-subscribe must
  start from (``sought``), which may lie in the compacted view before the mark-delete
  position;
* **the read position in the view and its index**: while reading compacted entries the
  reader keeps its own position and the index of the next compacted entry; each read
  advances the index, so the view is searched (``CompactedView.find_start``, a binary
  search) only after a seek, a rewind, or when a newly published view replaced the one
  the index belongs to. The cursor's read position is only moved through ``seek``, which
  never goes to or before the mark-delete position: where the reader is behind it (a
  rewind into the view), the reader's own position rules;
* **the surviving-slot masks**: the ``ack_set`` sent with each compacted batch whose slots
  were partly compacted out, which decides whether a batch-index ack acknowledges the
  whole entry (``acknowledged_entry``).

A read (``read``, Pulsar's ``asyncReadCompactedEntries``):

1. no view, or a read position after the horizon: read the raw topic through the cursor;
2. else the compacted entries from the index on, skipping those the cursor holds as
   individually acknowledged (their positions are scattered over the raw topic, so such
   acks rarely move the mark-delete position: without the skip a re-subscribe would
   deliver them again); when the view has nothing left, the cursor moves to just after
   the horizon and the raw topic is read.

A reader that is not enabled (a subscription that does not read compacted) reads the raw
topic only; rewind and seek still go through it. ``last_message_id`` and
``last_raw_message_id`` answer ``get_last_message_id`` for either kind of reader.
"""

from __future__ import annotations

from collections.abc import Sequence

from compactor.errors import CompactedLedgerMissingError, MalformedEntryError
from compactor.view.topic import CompactedTopic
from compactor.view.view import CompactedEntry, CompactedView, ack_set_words
from cursor.cursor import ManagedCursor
from ledger.position import EARLIEST, Position
from message.entry import is_batch, parse_entry

__all__ = ["NO_MESSAGE", "CompactedReader", "last_message_id", "last_raw_message_id"]

NO_MESSAGE = Position(-1, -1)
"""What ``last_message_id`` answers when a compacted reader has nothing to read (-1:-1)."""


def _after(position: Position) -> Position:
    return Position(position.ledger_id, position.entry_id + 1)


def _mask(entry: CompactedEntry) -> tuple[int, ...]:
    """The ``ack_set`` to send with a compacted batch; empty when every slot survives."""
    if not entry.batch_size or len(entry.surviving) == entry.batch_size:
        return ()
    return tuple(ack_set_words(entry.surviving, entry.batch_size))


class CompactedReader:
    """One subscription's reader over ``topic``'s compacted view and ``cursor``."""

    def __init__(
        self, topic: CompactedTopic, cursor: ManagedCursor, *, enabled: bool = True, from_earliest: bool = False,
    ) -> None:
        self.topic = topic
        self.cursor = cursor
        self._enabled = False
        self.enabled = enabled
        self._first_read = False  # the next read starts at the view's first entry
        self._sought: Position | None = None  # where a seek left the re-subscribing consumers
        self._position: Position | None = None  # in the view; None: the cursor's read position rules
        self._index: int | None = None  # of the next compacted entry in _indexed; None: search
        self._indexed: CompactedView | None = None
        self._masks: dict[Position, tuple[int, ...]] = {}  # ack_set of compacted batches sent
        self.subscribing(from_earliest)

    # -- state --------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """The subscription reads compacted (the latest SUBSCRIBE says so)."""
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        """Reading compacted, the cursor also counts compacted entries whose raw ledgers
        were trimmed as entries (its acks of them are kept; MD stops before them)."""
        self._enabled = value
        self.cursor.compacted_successor = self.trimmed_successor if value else None
        if not value:
            self._position, self._index = None, None

    @property
    def first_read_from_earliest(self) -> bool:
        """The next read starts at the compacted view's first entry."""
        return self._first_read

    @property
    def sought(self) -> bool:
        """A seek positioned the reader; the consumers' re-subscribe must keep that position."""
        return self._sought is not None

    @property
    def read_position(self) -> Position:
        """Where the next read starts: in the view, or the cursor's read position."""
        return self._position if self._position is not None else self.cursor.read_position

    def subscribing(self, from_earliest: bool) -> None:
        """A consumer subscribes asking for the earliest message: the first-read rule."""
        if from_earliest and self._sought is None and (
                not self.cursor.durable or self.cursor.mark_delete_position.entry_id == -1):
            self._first_read = True

    # -- moving -------------------------------------------------------------------------

    def rewind(self) -> None:
        """Read everything unacknowledged again: from the sought position after a seek,
        else (read compacted) from the entry after the mark-delete position, which may be
        in the compacted view, else from the cursor's first entry after it."""
        sought, self._sought = self._sought, None
        self.cursor.rewind()
        if not self._enabled:
            return
        md = self.cursor.mark_delete_position
        self._reposition(sought if sought is not None else _after(md))

    def seek(self, position: Position) -> None:
        """Reset the subscription so the next read starts at ``position`` (in the view when
        reading compacted and ``position`` is at or before the horizon; the whole view when
        it is the earliest message). A first read from earliest not done yet is dropped: the
        seek says where to read."""
        self.cursor.reset(position, keep_properties=False)
        self._masks.clear()
        self._position, self._index, self._first_read = None, None, False
        horizon = self.topic.horizon if self._enabled else None
        target = position.entry_position()
        if horizon is not None and target <= horizon:
            if position.ledger_id < 0:  # earliest: the whole compacted view again
                self._first_read = True
            else:
                self._reposition(target)
                self._retreat_before(target)
        self._sought = None if self._first_read else self.read_position

    def _reposition(self, position: Position) -> None:
        """Read from ``position`` next; the cursor follows as far as it may."""
        self._position, self._index = position, None
        self.cursor.seek(position)

    def _retreat_before(self, target: Position) -> None:
        """A durable cursor at the first ledger's start (nothing of the ledgers left
        acknowledged) moves its MD back to just before ``target`` when ``target`` is a
        compacted entry whose raw ledger was trimmed, so acks from there on are kept."""
        cursor, first = self.cursor, self.cursor.ledger.first_position()
        if cursor.durable and target.ledger_id < first.ledger_id and cursor.mark_delete_position == first:
            cursor.retreat_into_trimmed(Position(target.ledger_id, target.entry_id - 1))

    # -- reading ------------------------------------------------------------------------

    def read(self, max_entries: int) -> list[CompactedEntry]:
        """The next entries (see the module docstring); raises ``LedgerError`` (for
        instance ``CompactedLedgerMissingError`` on a broken topic) when a read fails."""
        if not self._enabled:
            return self._read_raw(max_entries)
        view = self.topic.view
        if self._first_read:
            self._first_read = False
            if view is not None:
                self._position, self._index, self._indexed = EARLIEST, 0, view  # no search needed
                if view.entries and self.cursor.durable:
                    self._retreat_before(view.position_at(0))
        if view is None or self.read_position > view.horizon:
            self._position = None
            return self._read_raw(max_entries)
        if self._position is None:  # reading raw until a new view covered the read position
            self._position, self._index = self.cursor.read_position, None
        return self._read_view(view, max_entries)

    def _read_view(self, view: CompactedView, max_entries: int) -> list[CompactedEntry]:
        """Compacted entries from the index on, then (view done) the raw tail."""
        assert self._position is not None
        if self._index is None or self._indexed is not view:  # after a seek, a rewind, a new view
            found = view.find_start(self._position)
            self._index, self._indexed = (view.entries if found is None else found), view
        while self._index < view.entries:
            last = min(view.entries, self._index + max_entries) - 1
            compacted = view.read(self._index, last)
            self._index = last + 1
            self._position = _after(compacted[-1].position)
            self.cursor.seek(self._position)
            unacknowledged = [e for e in compacted if not self.cursor.is_individually_acknowledged(e.position)]
            if unacknowledged:
                for entry in unacknowledged:
                    if mask := _mask(entry):
                        self._masks[entry.position] = mask
                return unacknowledged
        after_horizon = self.topic.ledger.next_valid_position(view.horizon)
        self.cursor.seek(max(after_horizon, self._position))
        self._position = None
        return self._read_raw(max_entries)

    def _read_raw(self, max_entries: int) -> list[CompactedEntry]:
        return [CompactedEntry(entry.position, entry.data) for entry in self.cursor.read_entries(max_entries)]

    def trimmed_successor(self, position: Position) -> Position | None:
        """The first compacted entry after ``position`` when its raw ledger was trimmed
        (before the first ledger), else None: a read-compacted cursor's
        ``compacted_successor``. None too when the topic has no view or a broken one."""
        try:
            view = self.topic.view
        except CompactedLedgerMissingError:
            return None
        index = None if view is None else view.find_start(_after(position))
        if view is None or index is None:
            return None
        found = view.position_at(index)
        return found if found.ledger_id < self.topic.ledger.first_position().ledger_id else None

    # -- surviving-slot masks and acknowledgements -------------------------------------

    def ack_set(self, position: Position) -> tuple[int, ...]:
        """The mask sent with the compacted batch at ``position``; empty: every slot."""
        return self._masks.get(position.entry_position(), ())

    def acknowledged_entry(
        self, position: Position, unacknowledged: Sequence[int], *, cumulative: bool,
    ) -> Position | None:
        """The entry an ack of ``position`` leaving ``unacknowledged`` slot words (its
        ack_set; empty: the whole entry) acknowledges: the entry itself when no slot the
        consumer was sent is left (slots hidden by the mask do not count); a cumulative
        ack inside a batch acknowledges everything before the entry; an individual partial
        one acknowledges nothing (None: Pulsar ignores partial batch acks)."""
        entry = position.entry_position()
        if not any(unacknowledged) or self._fully_acknowledged(entry, unacknowledged):
            return entry
        return self.cursor.previous_position(entry) if cumulative else None

    def _fully_acknowledged(self, entry: Position, unacknowledged: Sequence[int]) -> bool:
        mask = self._masks.get(entry)
        if mask is None:
            return False
        return all(word & (mask[i] if i < len(mask) else 0) == 0 for i, word in enumerate(unacknowledged))

    def acknowledged(self, entries: Sequence[Position], *, cumulative: bool) -> None:
        """Forget the masks of acknowledged entries (all up to the last one if cumulative)."""
        for entry in entries:
            self._masks.pop(entry, None)
        if cumulative and entries:
            for position in [p for p in self._masks if p <= max(entries)]:
                del self._masks[position]

    def forget_sent(self) -> None:
        """The consumers are gone (seek): no mask of what they were sent is kept."""
        self._masks.clear()

    # -- get_last_message_id ------------------------------------------------------------

    def last_message_id(self) -> Position:
        """``get_last_message_id`` for this reader's consumers."""
        return last_message_id(self.topic) if self._enabled else last_raw_message_id(self.topic)


def last_message_id(topic: CompactedTopic) -> Position:
    """``get_last_message_id`` for a compacted reader (Pulsar's rules, reference §2.4): the
    raw topic's last message when it is past the horizon, else the last surviving
    compacted message, else ``NO_MESSAGE`` (-1:-1)."""
    last = topic.ledger.last_confirmed_position()
    view = topic.view
    if view is not None and (last.entry_id < 0 or last <= view.horizon):
        return view.last_message_id() or NO_MESSAGE
    if last.entry_id < 0:
        return NO_MESSAGE
    return _with_last_batch_index(topic, last)


def last_raw_message_id(topic: CompactedTopic) -> Position:
    """``get_last_message_id`` for a plain reader: the topic's last entry, with the batch
    index of its last slot; ``(ledger, -1)`` on an empty topic."""
    last = topic.ledger.last_confirmed_position()
    return last if last.entry_id < 0 else _with_last_batch_index(topic, last)


def _with_last_batch_index(topic: CompactedTopic, position: Position) -> Position:
    """``position`` with the batch index of its last slot when the entry is a batch."""
    data = topic.ledger.read_entries(position, 1)[0].data
    try:
        metadata = parse_entry(data).metadata
    except MalformedEntryError:
        return position
    if is_batch(metadata):
        return position.with_batch_index(metadata.num_messages_in_batch - 1)
    return position
