"""Producer de-duplication of one topic (Pulsar's message de-duplication), when enabled.

A send is named by its *identity* ``(producer name, sequence id, chunk id)`` (chunk id -1
for a message that is not a chunk) and fingerprinted by a *content digest*: its metadata
without the fields a re-send may change (publish time, sequence ids, producer name, chunk
uuid) plus its payload. Each PRODUCER the broker accepts starts a ``ProducerSession``.

* A send whose identity and content match an entry in flight or among the topic's last
  ``WINDOW_ENTRIES`` durable entries (at most ``WINDOW_BYTES`` of them) is a duplicate:
  the answer waits for the in-flight one, or is the stored entry's position.
* A session may send the same identity and content more than once: the client restarts its
  numbering after a reconnect when it never got a receipt, so a new message can reuse the
  sequence id (and content) of one it re-sends in the same session. So the n-th send of a
  digest within a session matches only the n-th stored or in-flight entry of that digest
  (in log order): a re-send stream matches each original once, and a send beyond the
  originals is a new message, stored even when its content matches.
* Anything else is stored: a duplicate answer is only ever the position of the stored
  original, never Pulsar's ``-1:-1`` for a sequence id merely at or below the highest
  durable one (that answer would lose a message whose append failed while later ones of
  its producer succeeded). A re-send of a message older than the window is stored again.
* A chunk advances its producer's highest sequence id only as the last chunk.

The durable part (producer name → highest durable sequence id, what PRODUCER_SUCCESS
answers) is snapshotted into the properties of a durable cursor named ``pulsar.dedup``
every ``SNAPSHOT_INTERVAL_ENTRIES`` durable entries or ``SNAPSHOT_INTERVAL_BYTES``, and
when the topic closes; its mark-delete position says which entry the snapshot covers. The
cursor is deferred (``cursor.cursor``): a snapshot is queued and written by the cursor
store's thread on the persist schedule, never on the event loop; a crash may lose the
snapshots not yet written, which only makes the next load replay from an older one.
Loading replays the entries after the snapshot and the window (a few at a time, so a topic
of large entries loads in bounded memory), so that re-sends after a crash find what was
durable; an entry that cannot be read (corrupt) is skipped there. Enabling
starts fresh at the end of the log (as Pulsar, which opens the cursor at the latest
entry); disabling deletes the cursor, so that it holds nothing against trimming.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.errors import LedgerError
from ledger.managed_ledger import Entry, ManagedLedger
from ledger.position import Position
from message.entry import chunk_of, parse_entry
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

__all__ = ["DEDUP_CURSOR", "SNAPSHOT_INTERVAL_ENTRIES", "WINDOW_ENTRIES", "Deduplication", "ProducerSession",
           "Send", "describe_send"]

log = logging.getLogger(__name__)

DEDUP_CURSOR = "pulsar.dedup"
# Pulsar's brokerDeduplicationEntriesInterval: entries between two snapshots; and bytes.
SNAPSHOT_INTERVAL_ENTRIES = 1000
SNAPSHOT_INTERVAL_BYTES = 64 << 20
# Durable entries whose identity and content digest are remembered for re-sends: well
# above what the client keeps pending per producer (maxPendingMessages, 1000 by default).
WINDOW_ENTRIES = 10_000
WINDOW_BYTES = 64 << 20  # ... and no more than this much of them is read back at load
_REPLAY_BATCH_ENTRIES = 16
SEQUENCE_ID_MAX = (1 << 63) - 1  # sequence ids are int64 where they are persisted
_VOLATILE_FIELDS = ("highest_sequence_id", "uuid")  # besides the required ones, zeroed


@dataclass(frozen=True, slots=True)
class Send:
    """What de-duplication needs of one send."""

    producer_name: str
    sequence_id: int
    highest_sequence_id: int
    chunk_id: int  # -1 when the message is not a chunk
    last_chunk: bool  # True when not a chunk
    digest: bytes  # of the identity and the content: what a re-send must match
    size: int  # of the entry


@dataclass(slots=True)
class ProducerSession:
    """One PRODUCER accepted by the broker: how many times it sent each digest (the last
    ``WINDOW_ENTRIES`` digests), and whether one of its sends failed (its later sends are
    refused, so that the client re-sends them in order after it reconnects)."""

    sent: OrderedDict[bytes, int] = field(default_factory=OrderedDict)
    failed: bool = False

    def count(self, digest: bytes) -> int:
        """How many times this session sent ``digest`` before; counts this send."""
        seen = self.sent.pop(digest, 0)
        self.sent[digest] = seen + 1
        if len(self.sent) > WINDOW_ENTRIES:
            self.sent.popitem(last=False)
        return seen


def describe_send(producer_name: str, sequence_id: int, highest_sequence_id: int, entry: bytes) -> Send:
    """The ``Send`` of one entry; an entry whose metadata does not parse is its own content."""
    try:
        parsed = parse_entry(entry)
    except MalformedEntryError:
        identity = f"{producer_name}\0{sequence_id}\0-1\0".encode()
        return Send(producer_name, sequence_id, highest_sequence_id, -1, True, _digest(identity + entry), len(entry))
    metadata = parsed.metadata
    chunk = chunk_of(metadata)  # as compaction and the client tell a chunk
    chunk_id = chunk.chunk_id if chunk is not None else -1
    last_chunk = chunk is None or chunk.chunk_id >= chunk.chunks - 1
    content = pb.MessageMetadata()
    content.CopyFrom(metadata)
    content.producer_name, content.sequence_id, content.publish_time = "", 0, 0
    for name in _VOLATILE_FIELDS:
        content.ClearField(name)
    identity = f"{producer_name}\0{sequence_id}\0{chunk_id}\0".encode()
    digest = _digest(identity + content.SerializeToString(deterministic=True) + parsed.payload)
    return Send(producer_name, sequence_id, highest_sequence_id, chunk_id, last_chunk, digest, len(entry))


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class Deduplication:
    """The de-duplication state of one topic, whose durable cursors are in ``cursors``;
    runs on the broker's event loop."""

    def __init__(self, ledger: ManagedLedger, cursors: CursorStore) -> None:
        self.ledger = ledger
        existed = cursors.load(ledger.name, DEDUP_CURSOR) is not None
        # deferred: snapshots are queued for the cursor store's thread; the creation is
        # persisted at once (a cursor lost in a crash would skip the replay at the next load)
        self.cursor = ManagedCursor.open_durable(ledger, DEDUP_CURSOR, InitialPosition.LATEST, store=cursors,
                                                 deferred=True, create_at_once=True)
        self.persisted: dict[str, int] = dict(self.cursor.properties)
        self.pushed: dict[str, int] = dict(self.persisted)
        # a send's digest -> where its entries are stored / their appends in flight, in log order
        self._window: OrderedDict[bytes, tuple[Position, ...]] = OrderedDict()
        self._window_entries = 0
        self._in_flight: dict[bytes, list[Future[Position]]] = {}
        self._last_durable = self.cursor.mark_delete_position
        self._unsnapshotted = 0
        self._unsnapshotted_bytes = 0
        if existed:
            self._replay()

    # -- loading ------------------------------------------------------------------------

    def _replay(self) -> None:
        """Rebuild the durable part: the snapshot plus the entries after it, and the window."""
        position = min(self.ledger.next_valid_position(self.cursor.mark_delete_position), self._window_start())
        end = self.ledger.last_confirmed_position()
        while position <= end:
            entries = self._read_skipping_corrupt(position, end)
            if not entries:
                break
            for entry in entries:
                try:
                    metadata = parse_entry(entry.data).metadata
                except MalformedEntryError:
                    continue
                highest = max(metadata.sequence_id, metadata.highest_sequence_id)
                self._remember(describe_send(metadata.producer_name, metadata.sequence_id, highest, entry.data),
                               entry.position)
            position = self.ledger.next_valid_position(entries[-1].position)
        self.pushed = dict(self.persisted)

    def _read_skipping_corrupt(self, position: Position, end: Position) -> list[Entry]:
        """A few entries from ``position``; one that cannot be read is logged and skipped
        (its sequence id is then unknown: a re-send of it is stored)."""
        try:
            return self.ledger.read_entries(position, _REPLAY_BATCH_ENTRIES, end=end)
        except LedgerError:
            try:
                return self.ledger.read_entries(position, 1, end=end)
            except LedgerError as error:
                log.warning("topic %s: de-duplication skips entry %s: %s", self.ledger.name, position, error)
                return [Entry(position, b"")]

    def _window_start(self) -> Position:
        """Where the window begins: ``WINDOW_ENTRIES`` entries or ``WINDOW_BYTES`` before
        the end of the log (or its start)."""
        entries_left, bytes_left = WINDOW_ENTRIES, WINDOW_BYTES
        first = self.ledger.first_position()
        for record in reversed(self.ledger.ledger_list()):
            average = max(1, record.size_bytes // max(1, record.entries))
            fits = min(entries_left, bytes_left // average)
            if record.entries > fits:
                return Position(record.ledger_id, record.entries - max(1, fits))
            entries_left -= record.entries
            bytes_left -= record.size_bytes
            first = Position(record.ledger_id, 0)
        return first

    # -- publishing ---------------------------------------------------------------------

    def last_sequence_id(self, producer_name: str) -> int:
        """The highest sequence id pushed by ``producer_name``; -1 if none."""
        return self.pushed.get(producer_name, -1)

    def find_duplicate(self, session: ProducerSession, send: Send) -> Future[Position] | None:
        """A future of where the original is stored when ``send`` re-sends a stored or
        in-flight message; None when it is to be stored (see the module docstring)."""
        seen = session.count(send.digest)
        stored = self._window.get(send.digest, ())
        if seen < len(stored):
            return _resolved(stored[seen])
        in_flight = self._in_flight.get(send.digest, [])
        if seen - len(stored) < len(in_flight):
            return in_flight[seen - len(stored)]
        return None

    def pushed_send(self, send: Send, future: Future[Position]) -> None:
        """A send was appended (not yet durable)."""
        if send.last_chunk and send.highest_sequence_id > self.pushed.get(send.producer_name, -1):
            self.pushed[send.producer_name] = send.highest_sequence_id
        self._in_flight.setdefault(send.digest, []).append(future)

    def failed(self, send: Send, future: Future[Position]) -> None:
        """The append of a send failed: forget it and roll the producer back to what is
        durable, so that its re-send is stored."""
        self._forget_in_flight(send, future)
        self.pushed[send.producer_name] = self.persisted.get(send.producer_name, -1)

    def durable(self, send: Send, position: Position, future: Future[Position] | None = None) -> None:
        """The entry of a send is durable at ``position``."""
        if future is not None:
            self._forget_in_flight(send, future)
        self._remember(send, position)
        if send.last_chunk and self.pushed.get(send.producer_name, -1) < send.highest_sequence_id:
            self.pushed[send.producer_name] = send.highest_sequence_id
        self._unsnapshotted += 1
        self._unsnapshotted_bytes += send.size
        if self._unsnapshotted >= SNAPSHOT_INTERVAL_ENTRIES or self._unsnapshotted_bytes >= SNAPSHOT_INTERVAL_BYTES:
            self.snapshot()

    def _remember(self, send: Send, position: Position) -> None:
        highest = send.highest_sequence_id
        if send.last_chunk and SEQUENCE_ID_MAX >= highest > self.persisted.get(send.producer_name, -1):
            self.persisted[send.producer_name] = highest
        self._window[send.digest] = self._window.pop(send.digest, ()) + (position,)
        self._window_entries += 1
        while self._window_entries > WINDOW_ENTRIES:
            oldest, positions = next(iter(self._window.items()))
            if len(positions) > 1:
                self._window[oldest] = positions[1:]
            else:
                del self._window[oldest]
            self._window_entries -= 1
        self._last_durable = max(self._last_durable, position)

    def _forget_in_flight(self, send: Send, future: Future[Position]) -> None:
        futures = self._in_flight.get(send.digest, [])
        if future in futures:
            futures.remove(future)
        if not futures:
            self._in_flight.pop(send.digest, None)

    # -- persistence --------------------------------------------------------------------

    def snapshot(self) -> None:
        """Persist the durable part with the position it covers."""
        if self._unsnapshotted == 0 or self._last_durable <= self.cursor.mark_delete_position:
            return
        self.cursor.mark_delete(self._last_durable, self.persisted)
        self._unsnapshotted = self._unsnapshotted_bytes = 0

    def delete(self) -> None:
        """De-duplication was turned off: drop the cursor (it holds nothing back)."""
        self.cursor.delete_durable()


def _resolved(position: Position) -> Future[Position]:
    done: Future[Position] = Future()
    done.set_result(position)
    return done
