"""Shared harness for the Pulsar scenario tests (reference ``pulsar-compaction.md`` §6.1-§6.4).

Nothing here is faked beyond what a test must play itself:

* **Producer**: entries are built the way a Pulsar producer frames them (``message`` for a
  non-batched send, ``batch`` for one batch entry). A batching producer whose batch holds
  one message sends it non-batched, as the Java client does, so "single" sends are
  ``message`` even from a batching producer.
* **Broker**: ``Harness`` owns the real stack: a ledger store, the metadata store, the
  ``ManagedLedger``, ``CompactedTopic.restore`` and ``Compactor().compact``. ``unload`` is
  what a topic unload does to storage: close the managed ledger (sealing its ledger), reopen
  it (a fresh ledger), restore the compacted view from the ``__compaction`` cursor, trim.
* **Client**: ``Client`` is a consumer or reader. It reads through the broker's own
  ``compactor.view.reader.CompactedReader`` (what ``api.broker.dispatch.Subscription`` reads
  through): the first-read-from-earliest rule, the read position in the compacted view,
  the raw tail, rewinds and seeks are production code; the client plays only what a
  consumer and the broker's subscribe do around it (a reconnect builds a new reader over
  the topic as loaded then and rewinds it, as a re-created subscription's first consumer
  does). Messages are decoded with ``parse_entry``/``iter_messages``; for a batch only the slots a
  client honouring ``ack_set`` gets (``CompactedEntry.surviving``) count.
* **Encryption**: the broker never decrypts. An "encrypted" entry here is one whose metadata
  carries ``encryption_keys`` and whose payload is sealed with a toy reversible cipher; the
  client side (``deliver``) unseals it, as a consumer holding the key would. Only the
  broker-visible behaviour (opaque payload, clear metadata) is under test.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from compactor.record import RunFigures
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.view.reader import NO_MESSAGE, CompactedReader, last_message_id
from compactor.view.topic import CompactedTopic
from compactor.view.view import CompactedEntry, decode_compacted_entry
from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import EARLIEST, Position
from ledger.storage.base import LedgerInfo, LedgerStore
from ledger.storage.powers import LedgerFiles
from message.compression import compress
from message.encoder import encode_batch, encode_entry
from message.entry import is_batch, is_encrypted, is_marker, iter_messages, parse_entry
from message.proto import pulsar_api_pb2 as pb

__all__ = [
    "TOPIC",
    "Client",
    "Harness",
    "MakeHarness",
    "Received",
    "RecordingStore",
    "batch",
    "deliver",
    "marker",
    "message",
]

TOPIC = "persistent://my-tenant/my-ns/my-topic1"
PUBLISH_TIME = 1_700_000_000_000
ENCRYPTION_KEY_NAME = "client-ecdsa.pem"
_SEAL_BYTE = 0x5A
_SEAL_TAG = b"toy-gcm-tag-16by"  # a real AES-GCM ciphertext is never empty either

# Pulsar's MarkerType values for the markers the compaction tests write.
REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST = 10
TXN_COMMIT = 20
TXN_ABORT = 21


# -- producer side ---------------------------------------------------------------------


def _seal(data: bytes) -> bytes:
    return bytes(b ^ _SEAL_BYTE for b in data) + _SEAL_TAG


def _unseal(data: bytes) -> bytes:
    assert data.endswith(_SEAL_TAG), "not sealed by this harness"
    return bytes(b ^ _SEAL_BYTE for b in data[: -len(_SEAL_TAG)])


def _encrypt_metadata(metadata: pb.MessageMetadata) -> None:
    metadata.encryption_keys.add(key=ENCRYPTION_KEY_NAME, value=b"wrapped-data-key")
    metadata.encryption_algo = "toy"
    metadata.encryption_param = b"iv-0123456789ab"


def message(
    key: str | None,
    value: bytes | None,
    *,
    compression: int = pb.NONE,
    encrypted: bool = False,
    sequence_id: int = 0,
    properties: Mapping[str, str] | None = None,
) -> bytes:
    """One non-batched entry; ``value=None`` is a null value (``send()`` without a value)."""
    metadata = pb.MessageMetadata(producer_name="producer", sequence_id=sequence_id, publish_time=PUBLISH_TIME)
    if key is not None:
        metadata.partition_key = key
    for name, text in (properties or {}).items():
        metadata.properties.add(key=name, value=text)
    payload = b"" if value is None else value
    if value is None:
        metadata.null_value = True
    metadata.uncompressed_size = len(payload)  # a Pulsar producer always sets it
    if compression != pb.NONE:
        metadata.compression = compression  # type: ignore[assignment]
    body = compress(compression, payload)
    if encrypted:
        _encrypt_metadata(metadata)
        body = _seal(body)
    return encode_entry(metadata, body, with_checksum=False)


def batch(
    pairs: Sequence[tuple[str | None, bytes | None]],
    *,
    compression: int = pb.NONE,
    encrypted: bool = False,
    sequence_id: int = 0,
) -> bytes:
    """One batch entry of ``(key, value)`` slots; ``value=None`` is a null value.

    Encrypted: the whole (compressed) batch body is sealed and the entry metadata carries
    the first message's key, as the Java producer writes it.
    """
    template = pb.MessageMetadata(producer_name="producer", sequence_id=sequence_id, publish_time=PUBLISH_TIME)
    slots = []
    for key, value in pairs:
        single = pb.SingleMessageMetadata(payload_size=0)
        if key is not None:
            single.partition_key = key
        if value is None:
            single.null_value = True
        slots.append((single, b"" if value is None else value))
    plain = encode_batch(template, slots, compression, with_checksum=False)  # type: ignore[arg-type]
    if not encrypted:
        return plain
    parsed = parse_entry(plain)
    metadata = pb.MessageMetadata()
    metadata.CopyFrom(parsed.metadata)
    if pairs[0][0] is not None:
        metadata.partition_key = pairs[0][0]
    _encrypt_metadata(metadata)
    return encode_entry(metadata, _seal(parsed.payload), with_checksum=False)


def marker(marker_type: int, payload: bytes = b"marker") -> bytes:
    """A server marker entry (transaction commit/abort, replicated-subscription snapshot)."""
    metadata = pb.MessageMetadata(producer_name="broker", sequence_id=0, publish_time=PUBLISH_TIME)
    metadata.marker_type = marker_type
    return encode_entry(metadata, payload, with_checksum=False)


# -- client side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One message as a client gets it: key, value (None for a null value), message id."""

    key: str | None
    value: bytes | None
    message_id: Position

    @property
    def text(self) -> str | None:
        return None if self.value is None else self.value.decode()


def _decrypted(data: bytes) -> bytes:
    """What a consumer holding the key makes of an encrypted entry: the plain entry."""
    parsed = parse_entry(data)
    metadata = pb.MessageMetadata()
    metadata.CopyFrom(parsed.metadata)
    del metadata.encryption_keys[:]
    metadata.ClearField("encryption_algo")
    metadata.ClearField("encryption_param")
    return encode_entry(metadata, _unseal(parsed.payload), with_checksum=False)


def deliver(entries: Iterable[CompactedEntry]) -> list[Received]:
    """The messages a client honouring ``ack_set`` receives from ``entries``, in order."""
    received = []
    for entry in entries:
        parsed = parse_entry(entry.data)
        if is_marker(parsed.metadata):
            continue  # the dispatcher never hands markers to clients
        if is_encrypted(parsed.metadata):
            parsed = parse_entry(_decrypted(entry.data))
        for m in iter_messages(parsed):
            if m.compacted_out or (entry.batch_size and m.batch_index not in entry.surviving):
                continue
            value = None if m.null_value else m.payload
            received.append(Received(m.key, value, entry.position.with_batch_index(m.batch_index)))
    return received


class Client:
    """A consumer (durable cursor) or reader (non-durable cursor) on one ``Harness`` topic.

    ``receiver_queue`` is the number of entries asked for per dispatch (the permits).
    """

    def __init__(
        self, harness: Harness, cursor: ManagedCursor, *, read_compacted: bool, from_earliest: bool,
        receiver_queue: int = 1000,
    ) -> None:
        self.harness = harness
        self.read_compacted = read_compacted
        self.from_earliest = from_earliest
        self.receiver_queue = receiver_queue
        self._connect(cursor)
        self._buffer: deque[Received] = deque()
        self.last_received: Position | None = None
        self.dispatches: list[list[CompactedEntry]] = []

    def _connect(self, cursor: ManagedCursor) -> None:
        """Subscribe with ``cursor``: the broker's reader over the topic as loaded now (the
        first-read rule applies to a client that asked for the earliest message)."""
        self.cursor = cursor
        self.reader = CompactedReader(self.harness.topic, cursor, enabled=self.read_compacted,
                                      from_earliest=self.from_earliest)

    # -- dispatch ------------------------------------------------------------------------

    def dispatch(self) -> list[CompactedEntry]:
        """One dispatcher read of up to ``receiver_queue`` entries; buffers what it delivers."""
        entries = self.reader.read(self.receiver_queue)
        self.dispatches.append(entries)
        self._buffer.extend(deliver(entries))
        return entries

    def receive(self) -> Received | None:
        """The next message, or None when nothing is available now (a receive timeout)."""
        while not self._buffer:
            if not self.dispatch():
                return None
        message = self._buffer.popleft()
        self.last_received = message.message_id
        return message

    def receive_all(self) -> list[Received]:
        """Every message available now, in order."""
        messages = []
        while (m := self.receive()) is not None:
            messages.append(m)
        return messages

    def acknowledge(self, message: Received) -> None:
        """Individual acknowledgement of the message's entry (a batch's last slot acks it)."""
        self.cursor.delete([message.message_id.entry_position()])

    def buffered(self) -> int:
        return len(self._buffer)

    # -- broker queries ------------------------------------------------------------------

    def last_message_id(self) -> Position:
        """``getLastMessageId`` as the broker answers this client.

        ``compactor.view.reader.last_message_id`` is the answer for read-compacted clients, and for
        every client of a topic never compacted (the rules coincide there). A plain client of
        a compacted topic gets the raw topic's answer (Pulsar's ``readCompacted=false``
        branch of ``ServerCnx.getLargestBatchIndexWhenPossible``), which compactd has no
        function for yet: the harness plays it.
        """
        topic = self.harness.topic
        if self.read_compacted or topic.view is None:
            return last_message_id(topic)
        last = self.harness.ml.last_confirmed_position()
        if last.entry_id < 0:
            return NO_MESSAGE
        metadata = parse_entry(self.harness.ml.read_entries(last, 1)[0].data).metadata
        return last.with_batch_index(metadata.num_messages_in_batch - 1) if is_batch(metadata) else last

    def has_message_available(self) -> bool:
        """``hasMessageAvailable``: something buffered, or the broker's last message id is
        a real message after the last one received."""
        if self._buffer:
            return True
        last = self.last_message_id()
        if last == NO_MESSAGE or last.entry_id < 0:
            return False
        return self.last_received is None or last > self.last_received

    def seek(self, position: Position) -> None:
        """``consumer.seek``: reset the subscription, then reconnect from ``position`` (the
        broker drops the consumer; its re-subscribe rewinds to where the seek left it)."""
        self.reader.seek(position)
        self.reader.rewind()
        self._buffer.clear()
        self.from_earliest = position == EARLIEST
        self.last_received = None

    def reconnect(self) -> None:
        """The consumer reconnects (after an unload): its durable cursor is recovered from the
        metadata store, unacknowledged messages are redelivered (read compacted: from the
        entry after the mark-delete position, which may be in the compacted view), the
        buffer is cleared."""
        assert self.cursor.durable, "a reader reconnect is not modelled"
        self._connect(ManagedCursor.open_durable(self.harness.ml, self.cursor.name, store=self.harness.cursors))
        self.reader.rewind()  # as the broker rewinds for a subscription's new active consumer
        self._buffer.clear()


# -- broker side -----------------------------------------------------------------------


class Harness:
    """One topic on the real stack; see the module docstring."""

    def __init__(
        self,
        store: LedgerStore,
        metadata: MetadataStore,
        *,
        name: str = TOPIC,
        ledger_config: ManagedLedgerConfig | None = None,
        compaction_config: CompactionConfig | None = None,
    ) -> None:
        self.store = store
        self.metadata = metadata
        self.cursors = CursorStore(metadata.database)
        self.name = name
        self.ledger_config = ledger_config or ManagedLedgerConfig()
        self.compactor = Compactor(compaction_config)
        self.ml = ManagedLedger.open(name, store, metadata, self.ledger_config)
        self.topic = CompactedTopic.restore(self.ml, self.cursors)

    # producing

    def publish(self, *entries: bytes) -> list[Position]:
        """Append ``entries`` (all sent, then all waited for) and return their positions."""
        futures: list[Future[Position]] = [self.ml.append(data) for data in entries]
        return [future.result(timeout=30) for future in futures]

    def publish_one(self, data: bytes) -> Position:
        return self.publish(data)[0]

    # compaction

    def compact(self, *, rewrite: bool = False) -> RunFigures:
        """One run: incremental by default (the compactor's), a full rewrite with ``rewrite``
        (Pulsar's only kind of run)."""
        return self.compactor.compact(self.topic, rewrite=rewrite)

    def compacted_entries(self) -> list[CompactedEntry]:
        """The published compacted view's entries: read directly from the ledger store when
        it is one ledger with nothing dead (Pulsar's compacted ledger), else through the
        view (which skips dead entries and slots)."""
        view = self.topic.view
        assert view is not None, "no compacted ledger published"
        if len(view.ledger_ids) > 1 or view.dead_messages:
            return view.read(0, view.entries - 1, emptied=True) if view.entries else []
        lac = self.store.last_add_confirmed(view.ledger_id)
        if lac < 0:
            return []
        return [decode_compacted_entry(d) for d in self.store.read(view.ledger_id, 0, lac)]

    def holds(self, ledger_id: int) -> bool:
        """The published view holds ``ledger_id`` (an incremental run's ledger is appended
        to the view; a full rewrite's is the whole view)."""
        view = self.topic.view
        return view is not None and ledger_id in view.ledger_ids

    @property
    def compacted_ledger_id(self) -> int:
        """Pulsar's ``compactedLedger.ledgerId`` in the internal stats (-1 when none)."""
        view = self.topic.view
        return -1 if view is None else view.ledger_id

    # lifecycle

    def unload(self, *, trim: bool = True) -> None:
        """Unload and reload the topic: seal the current ledger, open a new one, restore the
        compacted view from the ``__compaction`` cursor, trim consumed ledgers."""
        self.ml.close()
        self.ml = ManagedLedger.open(self.name, self.store, self.metadata, self.ledger_config)
        self.topic = CompactedTopic.restore(self.ml, self.cursors)
        if trim:
            self.ml.trim()

    def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self.store.list()

    # clients

    def subscribe(
        self, name: str, *, initial: InitialPosition = InitialPosition.LATEST, read_compacted: bool = True,
        receiver_queue: int = 1000,
    ) -> Client:
        """A consumer on durable subscription ``name`` (created at ``initial`` if new)."""
        cursor = ManagedCursor.open_durable(self.ml, name, initial, store=self.cursors)
        return Client(self, cursor, read_compacted=read_compacted,
                      from_earliest=initial is InitialPosition.EARLIEST, receiver_queue=receiver_queue)

    def reader(
        self, start: Position = EARLIEST, *, read_compacted: bool = True, receiver_queue: int = 1000,
        name: str = "reader",
    ) -> Client:
        """A reader: a non-durable cursor from ``start`` (inclusive)."""
        cursor = ManagedCursor.open_non_durable(self.ml, name, start)
        return Client(self, cursor, read_compacted=read_compacted, from_earliest=start == EARLIEST,
                      receiver_queue=receiver_queue)


MakeHarness = Callable[..., Harness]
"""The ``make`` fixture's type: ``make(store=..., ledger_config=..., compaction_config=...)``."""


# -- store wrappers --------------------------------------------------------------------


class RecordingStore:
    """Wraps a ledger store; records which ledgers are read and can hold reads at a gate.

    ``gate``: when set to an unset ``threading.Event``, reads from threads other than the
    one that armed it wait for the event (Pulsar's tests inject read delays the same way).
    ``after_read``: called after every read (for tests that act mid-run).
    """

    def __init__(self, inner: LedgerStore) -> None:
        self.inner = inner
        self.reads: list[int] = []
        self.gate: threading.Event | None = None
        self._gate_owner: int | None = None
        self.after_read: Callable[[int], None] | None = None

    def hold_reads(self) -> threading.Event:
        """Make reads from other threads wait until the returned event is set."""
        self.gate = threading.Event()
        self._gate_owner = threading.get_ident()
        return self.gate

    def create(self, metadata: Mapping[str, str] | None = None, *, durable_at_seal: bool = False) -> int:
        return self.inner.create(metadata, durable_at_seal=durable_at_seal)

    def append(self, ledger_id: int, data: bytes) -> Future[int]:
        return self.inner.append(ledger_id, data)

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self.inner.last_add_confirmed(ledger_id)

    def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> Sequence[bytes]:
        gate = self.gate
        if gate is not None and threading.get_ident() != self._gate_owner:
            gate.wait(timeout=30)
        self.reads.append(ledger_id)
        result = self.inner.read(ledger_id, first_entry_id, last_entry_id)
        if self.after_read is not None:
            self.after_read(ledger_id)
        return result

    def close(self, ledger_id: int) -> None:
        self.inner.close(ledger_id)

    def delete(self, ledger_id: int) -> None:
        self.inner.delete(ledger_id)

    def list(self) -> list[int]:
        return self.inner.list()

    def info(self, ledger_id: int) -> LedgerInfo:
        return self.inner.info(ledger_id)

    def file_powers(self) -> LedgerFiles | None:
        """None: every read must pass here to be recorded (or held at the gate)."""
        return None

    def shutdown(self) -> None:
        self.inner.shutdown()
