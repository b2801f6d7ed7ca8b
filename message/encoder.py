"""Writing entries: frame a message, build a batch, and rewrite a batch for compaction.

The byte layout is documented once, at the top of ``message/entry.py``; every function
here produces bytes that ``message.entry.parse_entry`` reads back unchanged. The
broker never re-encodes what a producer sent; these functions serve tests, tools that
act as producers, and phase two of compaction, which is the only place compactd writes
an entry it did not receive (``rewrite_batch``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import crc32c

from message.compression import compress
from message.entry import (
    CHECKSUM_MAGIC,
    METADATA_BYTES_MAX,
    ParsedEntry,
    batch_slots,
)
from message.proto import pulsar_api_pb2 as pb

__all__ = [
    "COMPACTED_OUT_SLOT",
    "encode_batch",
    "encode_entry",
    "encode_slot",
    "reframe_batch",
    "rewrite_batch",
    "rewrite_slots",
]

_U32 = struct.Struct(">I")


def encode_entry(metadata: pb.MessageMetadata, payload: bytes, *, with_checksum: bool) -> bytes:
    """Frame ``metadata`` and an already-compressed ``payload`` as one entry.

    ``with_checksum=True`` adds the 0x0e01 CRC32C prefix, as a producer sends it in SEND;
    compactd's ledgers store entries without it. ``metadata`` must have its required
    fields set (protobuf raises ``EncodeError`` otherwise).
    """
    metadata_bytes = metadata.SerializeToString()
    assert 0 < len(metadata_bytes) <= METADATA_BYTES_MAX, len(metadata_bytes)
    checksummed = _U32.pack(len(metadata_bytes)) + metadata_bytes + bytes(payload)
    if not with_checksum:
        return checksummed
    return CHECKSUM_MAGIC + _U32.pack(crc32c.crc32c(checksummed)) + checksummed


def encode_slot(single: pb.SingleMessageMetadata, payload: bytes) -> bytes:
    """One batch slot: u32 metadata size, SingleMessageMetadata, payload.

    ``single.payload_size`` must equal ``len(payload)``.
    """
    assert single.payload_size == len(payload), (single.payload_size, len(payload))
    single_bytes = single.SerializeToString()
    return _U32.pack(len(single_bytes)) + single_bytes + bytes(payload)


COMPACTED_OUT_SLOT = encode_slot(pb.SingleMessageMetadata(payload_size=0, compacted_out=True), b"")
"""What a dropped slot becomes: no key, no properties, no payload, ``compacted_out``."""


def encode_batch(
    metadata_template: pb.MessageMetadata,
    messages: Sequence[tuple[pb.SingleMessageMetadata, bytes]],
    compression: pb.CompressionType,
    *,
    with_checksum: bool,
) -> bytes:
    """Encode ``messages`` (slot metadata, value) as one batch entry, as a producer would.

    Each slot's ``payload_size`` is set from its value. The template is copied and given
    ``num_messages_in_batch``, ``compression`` and
    ``uncompressed_size``; it must have the required fields set. At least one message is
    required: no client writes an empty batch.
    """
    assert len(messages) > 0, "a batch holds at least one message"
    slots = []
    for single, value in messages:
        slot_metadata = pb.SingleMessageMetadata()
        slot_metadata.CopyFrom(single)
        slot_metadata.payload_size = len(value)
        slots.append(encode_slot(slot_metadata, value))
    body = b"".join(slots)
    metadata = pb.MessageMetadata()
    metadata.CopyFrom(metadata_template)
    metadata.num_messages_in_batch = len(messages)
    metadata.compression = compression
    metadata.uncompressed_size = len(body)
    return encode_entry(metadata, compress(compression, body), with_checksum=with_checksum)


def rewrite_batch(entry: ParsedEntry, keep: AbstractSet[int]) -> bytes:
    """Re-encode a batch entry keeping only the slots whose batch_index is in ``keep``.

    Kept slots are copied byte for byte; every other slot becomes ``COMPACTED_OUT_SLOT``,
    so batch indexes (and message ids) of the survivors do not change. The entry metadata
    is kept except ``uncompressed_size``; the body is recompressed with the entry's codec;
    the result carries the checksum prefix iff ``entry`` did. Deciding not to write a
    batch with nothing kept is the caller's business. Raises ``UndecodablePayloadError``
    when the body cannot be decoded; an encrypted entry cannot be rewritten (assertion).
    """
    slots = [slot.slot_bytes for slot in batch_slots(entry)]
    return rewrite_slots(entry.metadata, slots, keep, with_checksum=entry.has_checksum)


def rewrite_slots(
    metadata: pb.MessageMetadata,
    slots: Sequence[bytes],
    keep: AbstractSet[int],
    *,
    with_checksum: bool,
) -> bytes:
    """``rewrite_batch`` for a batch whose body the caller has already split into slots.

    ``metadata`` is the batch's MessageMetadata (not modified) and ``slots[i]`` the bytes of
    slot ``i`` exactly as stored (size, metadata, payload), for every slot of the batch;
    phase two passes what ``compactor.local.scan`` read, so a batch is split only once.
    """
    assert keep <= set(range(len(slots))), f"keep {sorted(keep)} outside {len(slots)} slots"
    body = b"".join(
        slot if batch_index in keep else COMPACTED_OUT_SLOT
        for batch_index, slot in enumerate(slots)
    )
    return reframe_batch(metadata, body, with_checksum=with_checksum)


def reframe_batch(metadata: pb.MessageMetadata, body: bytes, *, with_checksum: bool) -> bytes:
    """The batch entry of ``metadata`` (not modified) around a new decompressed ``body``:
    ``uncompressed_size`` set to the body's, the body compressed with the batch's codec."""
    rewritten = pb.MessageMetadata()
    rewritten.CopyFrom(metadata)
    rewritten.uncompressed_size = len(body)
    payload = compress(metadata.compression, body)
    return encode_entry(rewritten, payload, with_checksum=with_checksum)
