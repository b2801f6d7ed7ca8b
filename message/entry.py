"""Pulsar messages inside ledger entries: the entry format, parsing, and batch slots.

Nothing below ``message/`` knows what a message is; this module is where entry bytes
become keys, payloads and tombstones (``message/encoder.py`` writes the same format,
``message/compression.py`` holds the codecs). The format, integers big-endian unsigned::

    entry       = [broker-entry] [checksum] metadata-size metadata payload
    broker-entry= 0x0e02 u32:size BrokerEntryMetadata(size bytes)    optional, skipped
    checksum    = 0x0e01 u32:crc32c                                   optional, verified
    metadata-size = u32, 1..METADATA_BYTES_MAX
    metadata    = MessageMetadata (metadata-size bytes, protobuf)
    payload     = the rest of the entry, compressed with metadata.compression

    crc32c covers metadata-size · metadata · payload (CRC-32C/Castagnoli, seed 0).

    When metadata.num_messages_in_batch is present (its presence, not its value) the
    decompressed payload is a batch body of exactly that many slots:

    body        = slot{num_messages_in_batch} [ignored trailing bytes]
    slot        = u32:size SingleMessageMetadata(size bytes) payload(payload_size bytes)

* **What compactd stores.** A producer's SEND carries ``checksum metadata-size metadata
  payload``; the wire layer verifies the checksum and hands the ledger the bytes *after* it
  (ARCHITECTURE, step 1), because every ledger record has its own CRC32C. Pulsar's brokers
  store the checksum too and may prepend broker-entry metadata, so ``parse_entry`` accepts
  all three forms. Both magics are unambiguous: a metadata size starting with 0x0e01 or
  0x0e02 would be over 200 MiB, far above ``METADATA_BYTES_MAX``.
* **Message ids.** A non-batched message is ``(ledger_id, entry_id)`` with batch_index -1;
  slot i of a batch is batch_index i. Slots never move: compaction drops a slot by
  replacing it with an empty ``compacted_out`` slot (``message.encoder.rewrite_batch``).
* **Keys and tombstones.** The compaction key is ``partition_key`` (of the slot, inside a
  batch). ``null_partition_key`` or an absent key means "no key" (``retain_null_key``
  decides). A keyed message whose value is empty or explicitly null (``null_value``) is a
  tombstone. Entries with ``marker_type`` are server markers and carry no application data.
* **Encrypted entries** cannot be opened: ``iter_messages`` returns one opaque message for
  the whole entry, keyed by the entry's metadata, as Pulsar's compactor treats them.
* **Chunks.** A producer with chunking on splits a message larger than the broker's
  maximum into entries, one per chunk, whose MessageMetadata says ``num_chunks_from_msg``
  > 1 (the clients' test), the chunk's ``chunk_id`` (0 first) and the message's ``uuid``
  (what the clients reassemble by). The message is compressed (and encrypted) *before* it
  is split, so a chunk's payload is a piece of the whole that never decodes on its own:
  ``iter_messages`` returns one message per chunk, keyed by the entry's metadata, payload
  left as stored, with ``chunk`` set; a chunk is never a tombstone (the clients chunk
  only values above the maximum size). What a chunk means to compaction is in
  ``compactor/local/chunks.py``.

``iter_messages`` is the reference reader. The compaction phases use a lean second reader,
``compactor/local/scan.py``, built on the same helpers (``parse_header``, ``read_slot``,
``partition_key_of``) and tested to agree with this one.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final, TypeVar

import crc32c
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtobufMessage
from google.protobuf.unknown_fields import UnknownFieldSet

from message.compression import decompress
from message.errors import MalformedEntryError, UndecodablePayloadError
from message.proto import pulsar_api_pb2 as pb

__all__ = [
    "BROKER_ENTRY_MAGIC",
    "CHECKSUM_MAGIC",
    "MESSAGE_BYTES_MAX",
    "METADATA_BYTES_MAX",
    "BatchSlot",
    "Chunk",
    "Message",
    "ParsedEntry",
    "batch_slots",
    "check_slot_count",
    "chunk_of",
    "decoded_payload",
    "is_batch",
    "is_encrypted",
    "is_marker",
    "iter_messages",
    "parse_entry",
    "parse_header",
    "parse_proto",
    "partition_key_of",
    "read_slot",
]

CHECKSUM_MAGIC = b"\x0e\x01"
"""Opens the optional ``u32 crc32c`` that precedes metadata-size."""
BROKER_ENTRY_MAGIC = b"\x0e\x02"
"""Opens the optional broker-entry metadata block that Pulsar brokers may prepend."""
MESSAGE_BYTES_MAX: Final = 5 * 1024 * 1024
"""Largest entry (metadataSize · metadata · payload) a client may send: Pulsar's default
maxMessageSize, and the value for CONNECTED.max_message_size."""
METADATA_BYTES_MAX = MESSAGE_BYTES_MAX
"""Metadata is a small part of a message; anything larger is corruption. Keeping it below
0x0e010000 keeps the magics above unambiguous."""
BROKER_ENTRY_METADATA_BYTES_MAX = 1024
"""BrokerEntryMetadata holds two varints (at most 22 bytes); the margin is for new fields."""

_U32 = struct.Struct(">I")
_SLOT_BYTES_MIN = 6
"""The smallest slot: a 4-byte size and a SingleMessageMetadata of just payload_size=0."""
_PROTOBUF_DECODE_ERRORS = (DecodeError, UnicodeDecodeError)
"""The upb runtime (the default) accepts non-UTF-8 proto2 strings and returns them as bytes
(see ``_text``); the pure-Python runtime refuses them with UnicodeDecodeError."""
_CODEC_FIELD_NUMBER = pb.MessageMetadata.DESCRIPTOR.fields_by_name["compression"].number


@dataclass(frozen=True)
class ParsedEntry:
    """One entry's metadata and still-compressed payload. Never mutate ``metadata``."""

    metadata: pb.MessageMetadata
    """The entry's MessageMetadata (for a batch: the batch's)."""
    payload: bytes
    """Everything after the metadata, exactly as stored: still compressed."""
    header_size: int
    """Bytes in the entry before ``payload``: optional prefixes, metadata-size, metadata."""
    has_checksum: bool
    """The entry carried (and passed) the 0x0e01 CRC32C prefix."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Which piece of a chunked message an entry holds (see "Chunks" above)."""

    uuid: str
    """The chunked message's id, shared by its chunks (the clients' ``producer-sequence``)."""
    chunk_id: int
    """This chunk's number, from 0."""
    chunks: int
    """How many chunks the message has (``num_chunks_from_msg``, > 1)."""

    @property
    def is_last(self) -> bool:
        """The chunk that completes the message: a reader has the whole value after it."""
        return self.chunk_id == self.chunks - 1


@dataclass(frozen=True)
class Message:
    """One application message: a non-batched entry, or one slot of a batch.

    Compares by value; not hashable, because ``properties`` is a mapping.
    """

    batch_index: int
    """Slot number inside the batch, or -1 for a non-batched entry."""
    key: str | None
    """The compaction key (``partition_key``), or None for a message without a key."""
    partition_key_b64_encoded: bool
    """``key`` is the base64 text of binary key bytes; see ``key_bytes``."""
    ordering_key: bytes | None
    """Key_Shared dispatch key when the producer set one apart from ``key``."""
    properties: Mapping[str, str]
    """Application properties (read-only); a repeated name keeps its last value."""
    payload: bytes
    """The value, decompressed; for an encrypted entry the opaque stored payload."""
    payload_size: int
    """Size of the value: ``len(payload)``, except for encrypted entries where it is the
    metadata's ``uncompressed_size`` when present (the ciphertext is never empty)."""
    null_value: bool
    """The producer sent no value at all (``send(None)``)."""
    compacted_out: bool
    """A previous compaction dropped this slot: no key, no payload, nothing to keep."""
    event_time: int | None
    """Application event time in milliseconds, or None when not set (0 on the wire)."""
    sequence_id: int | None
    """Producer sequence id, or None for a batch slot that does not carry one."""
    chunk: Chunk | None = None
    """The piece of a chunked message this entry holds; None for every other message."""

    @property
    def has_key(self) -> bool:
        """The message has a key; key-less messages follow ``retain_null_key``."""
        return self.key is not None

    @property
    def key_bytes(self) -> bytes | None:
        """The key as bytes: base64-decoded when flagged so, else its UTF-8 encoding.

        Raises ``MalformedEntryError`` when a base64-flagged key is not valid base64.
        Compaction itself compares ``key`` strings, as Pulsar does, and never needs this.
        """
        if self.key is None:
            return None
        if not self.partition_key_b64_encoded:
            return self.key.encode("utf-8", "surrogateescape")
        try:
            return base64.b64decode(self.key, validate=True)
        except (binascii.Error, ValueError) as error:
            raise MalformedEntryError(f"key {self.key!r} is not valid base64") from error

    @property
    def is_tombstone(self) -> bool:
        """Keyed, and its value is empty or null: it deletes its key in compaction. A chunk
        never is (it is a piece of a value above the maximum message size)."""
        return self.key is not None and self.chunk is None and (self.null_value or self.payload_size == 0)


@dataclass(frozen=True)
class BatchSlot:
    """One slot of a batch body, as stored."""

    batch_index: int
    """Position in the batch, from 0."""
    metadata: pb.SingleMessageMetadata
    """The slot's SingleMessageMetadata. Never mutate it."""
    payload: bytes
    """The slot's value (``metadata.payload_size`` bytes)."""
    slot_bytes: bytes
    """The whole slot (size, metadata, payload) byte for byte, for verbatim copies."""


def is_batch(metadata: pb.MessageMetadata) -> bool:
    """The payload is a batch body; presence of ``num_messages_in_batch`` decides."""
    return metadata.HasField("num_messages_in_batch")


def is_encrypted(metadata: pb.MessageMetadata) -> bool:
    """The payload is encrypted; the broker cannot open it (nor a batch inside it)."""
    return len(metadata.encryption_keys) > 0


def is_marker(metadata: pb.MessageMetadata) -> bool:
    """A server-written marker (transaction, replicated subscription): no application data.

    Compaction skips markers but must still see them, since one may be the stop marker.
    """
    return metadata.HasField("marker_type")


def chunk_of(metadata: pb.MessageMetadata) -> Chunk | None:
    """The chunk an entry holds (``num_chunks_from_msg`` > 1), or None when it holds a
    whole message (see "Chunks" above)."""
    if metadata.num_chunks_from_msg <= 1:
        return None
    return Chunk(_text(metadata.uuid), metadata.chunk_id, metadata.num_chunks_from_msg)


def partition_key_of(metadata: pb.MessageMetadata | pb.SingleMessageMetadata) -> str | None:
    """The compaction key of a message (see "Keys and tombstones" above), or None."""
    if metadata.null_partition_key or not metadata.HasField("partition_key"):
        return None
    return _text(metadata.partition_key)


def parse_entry(data: bytes) -> ParsedEntry:
    """Split one stored entry into metadata and still-compressed payload.

    Accepts the entry with or without the 0x0e01 checksum prefix (verified when present)
    and with or without a 0x0e02 broker-entry block (skipped). The payload is not looked
    at: a corrupt batch body parses here and fails in ``iter_messages``. Raises
    ``MalformedEntryError`` (and nothing else) for any input that is not such an entry.
    """
    data = bytes(data)
    metadata, payload_start, has_checksum = parse_header(data)
    return ParsedEntry(
        metadata=metadata,
        payload=data[payload_start:],
        header_size=payload_start,
        has_checksum=has_checksum,
    )


def parse_header(data: bytes) -> tuple[pb.MessageMetadata, int, bool]:
    """``parse_entry`` without building a ParsedEntry or copying the payload.

    Returns ``(metadata, header_size, has_checksum)``: the payload is ``data[header_size:]``.
    Same checks and the same ``MalformedEntryError`` as ``parse_entry``; ``data`` must be
    ``bytes``. Never mutate the metadata.
    """
    position = _skip_broker_entry_metadata(data)
    has_checksum = data[position : position + 2] == CHECKSUM_MAGIC
    if has_checksum:
        position = _verify_checksum(data, position)
    metadata_size = _read_u32(data, position, "metadata size")
    if not 0 < metadata_size <= METADATA_BYTES_MAX:
        raise MalformedEntryError(
            f"metadata size {metadata_size} is outside 1..{METADATA_BYTES_MAX}"
        )
    metadata_start = position + 4
    payload_start = metadata_start + metadata_size
    if payload_start > len(data):
        raise MalformedEntryError(
            f"metadata size {metadata_size} runs past the end of a {len(data)}-byte entry"
        )
    return _parse_metadata(data[metadata_start:payload_start]), payload_start, has_checksum


def iter_messages(entry: ParsedEntry) -> Iterator[Message]:
    """The entry's messages in batch_index order: one (batch_index -1) or one per slot.

    The whole entry is decoded before this returns, so a corrupt payload raises
    ``UndecodablePayloadError`` from the call itself, never halfway through the iteration.
    Slots that a previous compaction dropped are included with ``compacted_out`` set, so
    that numbering stays visible; callers skip them. A marker parses like any entry (its
    payload is server data, not a value): check ``is_marker`` first and skip it.
    """
    metadata = entry.metadata
    chunk = chunk_of(metadata)
    if chunk is not None:  # a piece of a compressed (maybe encrypted) whole: not decoded
        return iter([replace(_entry_message(metadata, entry.payload), chunk=chunk)])
    if is_encrypted(metadata):
        return iter([_opaque_message(metadata, entry.payload)])
    if not is_batch(metadata):
        return iter([_entry_message(metadata, decoded_payload(entry))])
    return iter([_slot_message(slot) for slot in batch_slots(entry)])


def batch_slots(entry: ParsedEntry) -> list[BatchSlot]:
    """Every slot of a readable (batched, not encrypted) entry, in batch_index order.

    Raises ``UndecodablePayloadError`` when the body cannot be decompressed or does not
    hold ``num_messages_in_batch`` well-formed slots; bytes after the last slot are
    ignored, as the clients ignore them.
    """
    metadata = entry.metadata
    assert is_batch(metadata) and not is_encrypted(metadata), "only readable batches"
    return _split_slots(decoded_payload(entry), metadata.num_messages_in_batch)


def decoded_payload(entry: ParsedEntry) -> bytes:
    """The entry's payload decompressed (for a batch: the whole body).

    Raises ``UndecodablePayloadError`` when the codec refuses it or the size is wrong.
    """
    metadata = entry.metadata
    try:
        return decompress(metadata.compression, entry.payload, metadata.uncompressed_size)
    except MalformedEntryError as error:
        raise UndecodablePayloadError(str(error)) from error


# --- parsing helpers ---------------------------------------------------------------------


def _read_u32(data: bytes, position: int, what: str) -> int:
    """The big-endian u32 at ``position``; MalformedEntryError when the data ends first."""
    if position + 4 > len(data):
        raise MalformedEntryError(f"entry ends before its {what} ({len(data)} bytes)")
    value: int = _U32.unpack_from(data, position)[0]
    return value


def _skip_broker_entry_metadata(data: bytes) -> int:
    """Position after an optional 0x0e02 broker-entry block (0 when there is none)."""
    if data[:2] != BROKER_ENTRY_MAGIC:
        return 0
    size = _read_u32(data, 2, "broker entry metadata size")
    end = 6 + size
    if size > BROKER_ENTRY_METADATA_BYTES_MAX or end > len(data):
        raise MalformedEntryError(f"broker entry metadata size {size} is not plausible")
    parse_proto(pb.BrokerEntryMetadata, data[6:end], MalformedEntryError, "broker entry metadata")
    return end


def _verify_checksum(data: bytes, position: int) -> int:
    """Check the CRC32C at ``position + 2``; return the position after it."""
    expected = _read_u32(data, position + 2, "checksum")
    actual = crc32c.crc32c(data[position + 6 :])
    if actual != expected:
        raise MalformedEntryError(
            f"checksum mismatch: stored {expected:#010x}, computed {actual:#010x}"
        )
    return position + 6


_Proto = TypeVar("_Proto", bound=ProtobufMessage)


def parse_proto(message_type: type[_Proto], raw: bytes, error_type: type[Exception], what: str) -> _Proto:
    """``raw`` parsed as a ``message_type``, its required fields not checked; bytes that do
    not parse raise ``error_type("<what> does not parse: <why>")``."""
    message = message_type()
    try:
        message.ParseFromString(raw)
    except _PROTOBUF_DECODE_ERRORS as error:
        raise error_type(f"{what} does not parse: {error}") from error
    return message


def _parse_metadata(raw: bytes) -> pb.MessageMetadata:
    """Parse and validate MessageMetadata: required fields, known codec, sane batch count."""
    metadata = parse_proto(pb.MessageMetadata, raw, MalformedEntryError, "MessageMetadata")
    if not metadata.IsInitialized():
        raise MalformedEntryError(
            f"MessageMetadata lacks required fields: {_missing_required_fields(metadata)}"
        )
    if not metadata.HasField("compression") and _has_unknown_codec(metadata):
        raise MalformedEntryError("MessageMetadata names a compression codec compactd lacks")
    if is_batch(metadata) and metadata.num_messages_in_batch < 1:
        raise MalformedEntryError(f"num_messages_in_batch is {metadata.num_messages_in_batch}")
    return metadata


def _has_unknown_codec(metadata: pb.MessageMetadata) -> bool:
    """proto2 files an unknown enum value as an unknown field; the codec then reads NONE."""
    unknown = UnknownFieldSet(metadata)
    return any(unknown[index].field_number == _CODEC_FIELD_NUMBER for index in range(len(unknown)))


def _missing_required_fields(metadata: pb.MessageMetadata) -> str:
    fields = metadata.DESCRIPTOR.fields
    return ", ".join(f.name for f in fields if f.is_required and not metadata.HasField(f.name))


def _split_slots(body: bytes, count: int) -> list[BatchSlot]:
    """``count`` slots read from the start of a batch body."""
    check_slot_count(body, count)
    slots = []
    position = 0
    for batch_index in range(count):
        single = pb.SingleMessageMetadata()
        end = read_slot(body, position, batch_index, single)
        payload = body[end - single.payload_size : end]
        slots.append(BatchSlot(batch_index, single, payload, body[position:end]))
        position = end
    return slots


def check_slot_count(body: bytes, count: int) -> None:
    """Raise ``UndecodablePayloadError`` when ``body`` is too short for ``count`` slots.

    Checked before reading any slot, so a corrupt count never drives a long loop.
    """
    if count * _SLOT_BYTES_MIN > len(body):
        raise UndecodablePayloadError(f"{len(body)}-byte batch body cannot hold {count} slots")


def read_slot(
    body: bytes, position: int, batch_index: int, single: pb.SingleMessageMetadata
) -> int:
    """Parse slot ``batch_index``, at ``position`` of ``body``, into ``single``.

    Returns the position after the slot; its payload is the ``single.payload_size`` bytes
    just before it. ``single`` is cleared first, so one object can be reused slot after
    slot. Raises ``UndecodablePayloadError`` when the slot is not well-formed.
    """
    if position + 4 > len(body):
        raise UndecodablePayloadError(f"batch body ends before slot {batch_index}")
    size: int = _U32.unpack_from(body, position)[0]
    metadata_end = position + 4 + size
    if metadata_end > len(body):
        raise UndecodablePayloadError(f"slot {batch_index} metadata runs past the batch body")
    try:
        single.ParseFromString(body[position + 4 : metadata_end])
    except _PROTOBUF_DECODE_ERRORS as error:
        raise UndecodablePayloadError(f"slot {batch_index} metadata: {error}") from error
    if not single.IsInitialized():
        raise UndecodablePayloadError(f"slot {batch_index} metadata lacks payload_size")
    payload_size: int = single.payload_size
    payload_end = metadata_end + payload_size
    if payload_size < 0 or payload_end > len(body):
        raise UndecodablePayloadError(
            f"slot {batch_index} payload_size {payload_size} runs past the batch body"
        )
    return payload_end


# --- message construction ----------------------------------------------------------------


def _text(value: str | bytes) -> str:
    """A proto2 string field as text; upb hands back bytes when they are not UTF-8.

    Undecodable bytes are kept as surrogate escapes, so distinct keys stay distinct and
    ``key_bytes`` gives the original bytes back.
    """
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def _properties(pairs: Sequence[pb.KeyValue]) -> Mapping[str, str]:
    return MappingProxyType({_text(pair.key): _text(pair.value) for pair in pairs})


def _ordering_key(metadata: pb.MessageMetadata | pb.SingleMessageMetadata) -> bytes | None:
    return metadata.ordering_key if metadata.HasField("ordering_key") else None


def _entry_message(metadata: pb.MessageMetadata, payload: bytes) -> Message:
    """The one message of a non-batched entry (``payload`` already decompressed)."""
    return _message(metadata, payload, batch_index=-1, compacted_out=False, sequence_id=metadata.sequence_id)


def _opaque_message(metadata: pb.MessageMetadata, payload: bytes) -> Message:
    """An encrypted entry as one message: keyed by its metadata, payload left sealed."""
    message = _entry_message(metadata, payload)
    if not metadata.HasField("uncompressed_size"):
        return message
    return replace(message, payload_size=metadata.uncompressed_size)


def _slot_message(slot: BatchSlot) -> Message:
    """One slot of a batch as a message."""
    single = slot.metadata
    return _message(single, slot.payload, batch_index=slot.batch_index, compacted_out=single.compacted_out,
                    sequence_id=single.sequence_id if single.HasField("sequence_id") else None)


def _message(metadata: pb.MessageMetadata | pb.SingleMessageMetadata, payload: bytes, *, batch_index: int,
             compacted_out: bool, sequence_id: int | None) -> Message:
    """A message with the key, properties and flags ``metadata`` carries (an entry's
    ``MessageMetadata`` and a batch slot's ``SingleMessageMetadata`` name them alike)."""
    return Message(
        batch_index=batch_index,
        key=partition_key_of(metadata),
        partition_key_b64_encoded=metadata.partition_key_b64_encoded,
        ordering_key=_ordering_key(metadata),
        properties=_properties(metadata.properties),
        payload=payload,
        payload_size=len(payload),
        null_value=metadata.null_value,
        compacted_out=compacted_out,
        event_time=metadata.event_time or None,
        sequence_id=sequence_id,
    )
