"""What the compaction phases read of an entry: each message's batch index, key and tombstone.

Both phases decode every entry of the stream, and all they need of a message is its batch
index, its key and whether it is a tombstone. ``scan_entry`` reads just that: it parses the
MessageMetadata (for a batch, also each slot's SingleMessageMetadata, into one reused
object) and builds no ``ParsedEntry``, ``BatchSlot`` or ``Message``: no properties mapping,
no copy of a slot's payload. It is a second reader of the format written out at the top of
``message/entry.py`` and gives exactly what the reference reader, ``iter_messages``,
gives (``tests/unit/compactor/test_fast_path.py`` checks the two agree):

* **Opaque**: ``parse_entry`` refuses the bytes, or the payload does not decode (a codec
  error, a wrong ``uncompressed_size``, a batch body without ``num_messages_in_batch``
  well-formed slots). Nothing is read from an opaque entry.
* **Marker**: ``marker_type`` is set; the payload is never looked at.
* **Chunk** (``num_chunks_from_msg`` > 1, batched, encrypted or not): a "single" message
  keyed by the entry's metadata, never a tombstone, with ``chunk`` set; the payload (a
  piece of a compressed whole) is never looked at.
* **Single**: one message, batch_index -1, keyed by the entry's metadata. For a non-batched
  entry the payload is decompressed (an undecodable one makes the entry opaque) and its
  size decides "empty"; for an encrypted entry (batched or not: it cannot be opened) the
  payload stays sealed and its size is ``uncompressed_size`` when present, else the stored
  payload's size.
* **Batch**: one message per slot not already ``compacted_out``, in batch_index order;
  ``batch_size`` counts every slot, and ``BatchBody.slots()`` gives their bytes for a
  rewrite (``message.encoder.rewrite_slots``), so that phase two splits a batch once.

A message is a tombstone when it has a key and its value is null (``null_value``) or
empty, as ``Message.is_tombstone`` says.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from message.compression import decompress
from message.entry import (
    Chunk,
    check_slot_count,
    chunk_of,
    is_batch,
    is_encrypted,
    is_marker,
    parse_header,
    partition_key_of,
    read_slot,
)
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

__all__ = ["BatchBody", "EntryKind", "EntryScan", "ScannedMessage", "scan_entry"]

EntryKind = Literal["opaque", "marker", "single", "batch"]
"""How the phases treat an entry (see the module docstring). Plain strings rather than an
``Enum``: the phases test the kind of every entry, and an enum member costs an attribute
lookup each time."""

ScannedMessage = tuple[int, str | None, bool]
"""``(batch_index, key, is_tombstone)`` of one live message; ``key`` None = no key."""


class BatchBody(NamedTuple):
    """A readable batch, split into slots, with what a rewrite of it needs."""

    metadata: pb.MessageMetadata
    """The batch's MessageMetadata. Never mutate it."""
    has_checksum: bool
    """The entry carries the 0x0e01 CRC32C prefix (a rewrite keeps it)."""
    body: bytes
    """The decompressed batch body."""
    slot_ends: list[int]
    """Where in ``body`` each slot ends; slot 0 starts at 0, slot i at ``slot_ends[i-1]``."""

    def slots(self) -> list[bytes]:
        """Every slot's bytes (size, metadata, payload) exactly as stored, in order."""
        starts = [0, *self.slot_ends[:-1]]
        return [self.body[start:end] for start, end in zip(starts, self.slot_ends, strict=True)]


class EntryScan(NamedTuple):
    """What the compaction phases need of one entry."""

    kind: EntryKind
    messages: tuple[ScannedMessage, ...] = ()
    """Every live message: one for "single"; one per slot not ``compacted_out`` for
    "batch"; none for "opaque" and "marker"."""
    batch_size: int = 0
    """Slots of a "batch", ``compacted_out`` ones included; 0 for every other kind."""
    batch: BatchBody | None = None
    """The split body of a "batch"; None for every other kind."""
    publish_time: int = 0
    """The entry's ``publish_time`` (ms), shared by every message of a batch; 0 for
    "opaque" and "marker"."""
    chunk: Chunk | None = None
    """The piece of a chunked message a "single" entry holds; None for every other entry."""


_OPAQUE = EntryScan("opaque")
_MARKER = EntryScan("marker")


def scan_entry(data: bytes) -> EntryScan:
    """Read one stored entry as the compaction phases see it (see the module docstring).

    Never raises ``MalformedEntryError``: an entry that does not decode is "opaque". The
    whole entry is read before this returns, so a caller acts on all of it or none of it.
    """
    data = bytes(data)  # a no-op for bytes, which is what ledgers hand out
    try:
        metadata, header_size, has_checksum = parse_header(data)
    except MalformedEntryError:
        return _OPAQUE
    if is_marker(metadata):
        return _MARKER
    chunk = chunk_of(metadata)
    if chunk is not None:
        key = partition_key_of(metadata)
        return EntryScan("single", ((-1, key, False),), publish_time=metadata.publish_time, chunk=chunk)
    if is_encrypted(metadata):
        return _encrypted(metadata, len(data) - header_size)
    try:
        if not is_batch(metadata):
            return _one_message(metadata, len(_decoded(metadata, data, header_size)))
        return _batch(metadata, data, header_size, has_checksum)
    except MalformedEntryError:  # the payload does not decode
        return _OPAQUE


def _encrypted(metadata: pb.MessageMetadata, payload_size: int) -> EntryScan:
    """An encrypted entry: one sealed message keyed by the entry's metadata."""
    if metadata.HasField("uncompressed_size"):
        payload_size = metadata.uncompressed_size
    return _one_message(metadata, payload_size)


def _one_message(metadata: pb.MessageMetadata, payload_size: int) -> EntryScan:
    """A "single" entry: its one message, keyed by the entry's metadata."""
    key = partition_key_of(metadata)
    tombstone = key is not None and (metadata.null_value or payload_size == 0)
    return EntryScan("single", ((-1, key, tombstone),), publish_time=metadata.publish_time)


def _batch(
    metadata: pb.MessageMetadata, data: bytes, header_size: int, has_checksum: bool
) -> EntryScan:
    """A readable batch; raises ``MalformedEntryError`` when its body does not decode."""
    body = _decoded(metadata, data, header_size)
    count = metadata.num_messages_in_batch
    check_slot_count(body, count)
    single = pb.SingleMessageMetadata()  # reused: read_slot clears it for every slot
    messages: list[ScannedMessage] = []
    slot_ends = []
    end = 0
    for batch_index in range(count):
        end = read_slot(body, end, batch_index, single)
        slot_ends.append(end)
        if single.compacted_out:
            continue
        key = partition_key_of(single)
        tombstone = key is not None and (single.null_value or single.payload_size == 0)
        messages.append((batch_index, key, tombstone))
    batch = BatchBody(metadata, has_checksum, body, slot_ends)
    return EntryScan("batch", tuple(messages), count, batch, metadata.publish_time)


def _decoded(metadata: pb.MessageMetadata, data: bytes, header_size: int) -> bytes:
    """The payload after ``header_size``, decompressed, as ``decoded_payload`` gives it.

    Raises ``MalformedEntryError`` when the codec refuses it or its size is wrong.
    """
    return decompress(metadata.compression, data[header_size:], metadata.uncompressed_size)
