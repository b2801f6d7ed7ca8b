"""Seeded mutations of valid SENDs, for the door tests (``test_door_fuzz``).

``valid_entries(rng, producer, sequence_id)`` builds the entries of one valid message as
the real clients write it, of a shape drawn from ``rng``: plain or batched (keys,
properties, event times), compressed with any codec, or chunked (one entry per chunk).
``mutate(rng, entries)`` damages them in one of the ways a hostile or broken producer
could: a metadata field set to an extreme or random value, bytes flipped, cut or added in
the metadata, the compressed payload or the batch body *before* compression (so that the
codec still accepts it), a slot's size or payload size, chunks dropped, repeated or
swapped. ``send_frame`` frames one entry as a SEND with a valid checksum, without the
shape checks of ``api.wire.frames`` (the broker is what is tested).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import crc32c
from google.protobuf.message import DecodeError

from message.compression import compress
from message.proto import pulsar_api_pb2 as pb

__all__ = ["mutate", "send_frame", "valid_entries"]

_U32 = struct.Struct(">I")
_CODECS = (pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY)
_EXTREMES = (0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, 2**64 - 1, -(2**63))
_METADATA_INTS = ("sequence_id", "publish_time", "uncompressed_size", "num_messages_in_batch", "event_time",
                  "deliver_at_time", "highest_sequence_id", "num_chunks_from_msg", "total_chunk_msg_size",
                  "chunk_id", "compression", "marker_type", "txnid_most_bits", "partition_key_b64_encoded")
_SLOT_INTS = ("payload_size", "event_time", "sequence_id", "compacted_out", "null_value", "null_partition_key")
_PUBLISH_TIME_MS = 1_700_000_000_000


def _slot(rng: random.Random, index: int, single: pb.SingleMessageMetadata | None = None) -> bytes:
    value = rng.randbytes(rng.choice((0, 1, 8, 40)))
    single = single or pb.SingleMessageMetadata()
    single.payload_size = len(value)
    single.sequence_id = index
    if rng.random() < 0.7:
        single.partition_key = f"k{rng.randrange(20)}"
    if rng.random() < 0.3:
        single.properties.add(key=f"p{index}", value="v" * rng.randrange(4))
    if rng.random() < 0.3:
        single.event_time = _PUBLISH_TIME_MS + index
    metadata = single.SerializeToString()
    return _U32.pack(len(metadata)) + metadata + value


def _entry(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    raw = metadata.SerializePartialToString()
    return _U32.pack(len(raw)) + raw + payload


def _metadata(rng: random.Random, producer: str, sequence_id: int, codec: int) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(producer_name=producer, sequence_id=sequence_id,
                                  publish_time=_PUBLISH_TIME_MS + sequence_id)
    if codec != pb.NONE or rng.random() < 0.2:
        metadata.compression = codec
    if rng.random() < 0.3:
        metadata.properties.add(key="a", value="b")
    return metadata


def valid_entries(rng: random.Random, producer: str, sequence_id: int) -> tuple[list[bytes], bytes]:
    """The entries of one valid message of a random shape, and its body before compression
    (for a batch: the batch body; for a chunked message: the whole value)."""
    codec = rng.choice(_CODECS)
    metadata = _metadata(rng, producer, sequence_id, codec)
    shape = rng.random()
    if shape < 0.45:  # a batch
        count = rng.choice((1, 2, 5, 20))
        body = b"".join(_slot(rng, index) for index in range(count))
        metadata.num_messages_in_batch = count
    elif shape < 0.8:  # one message
        body = rng.randbytes(rng.choice((0, 1, 30, 300)))
        if rng.random() < 0.7:
            metadata.partition_key = f"k{rng.randrange(20)}"
    else:  # chunked
        body = rng.randbytes(rng.randrange(200, 3000))
    metadata.uncompressed_size = len(body)
    payload = compress(codec, body)
    if shape < 0.8:
        return [_entry(metadata, payload)], body
    chunks = rng.randrange(2, 5)
    size = -(-len(payload) // chunks)
    pieces = [payload[i:i + size] for i in range(0, len(payload), size)]
    metadata.uuid = f"{producer}-{sequence_id}"
    metadata.num_chunks_from_msg = len(pieces)
    metadata.total_chunk_msg_size = len(payload)
    entries = []
    for chunk_id, piece in enumerate(pieces):
        metadata.chunk_id = chunk_id
        entries.append(_entry(metadata, piece))
    return entries, body


def _split(entry: bytes) -> tuple[pb.MessageMetadata, bytes]:
    size = _U32.unpack_from(entry)[0]
    metadata = pb.MessageMetadata()
    metadata.ParseFromString(entry[4:4 + size])
    return metadata, entry[4 + size:]


def _flip(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return rng.randbytes(rng.randrange(1, 8))
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4))):
        position = rng.randrange(len(out))
        out[position] = rng.choice((out[position] ^ (1 << rng.randrange(8)), rng.randrange(256), 0, 0xFF))
    return bytes(out)


def _cut_or_grow(rng: random.Random, data: bytes) -> bytes:
    if data and rng.random() < 0.5:
        return data[:rng.randrange(len(data))]
    return data + rng.randbytes(rng.randrange(1, 16))


def _set_int(rng: random.Random, message: pb.MessageMetadata | pb.SingleMessageMetadata, names: tuple[str, ...]) -> None:
    name = rng.choice(names)
    field = message.DESCRIPTOR.fields_by_name[name]
    candidates = [v for v in (*_EXTREMES, rng.randrange(-5, 50), rng.randrange(2**20)) if _fits(field, v)]
    setattr(message, name, rng.choice(candidates))


def _fits(field: object, value: int) -> bool:
    kind = field.type  # type: ignore[attr-defined]
    if kind == field.TYPE_BOOL:  # type: ignore[attr-defined]
        return value in (0, 1)
    if kind == field.TYPE_ENUM:  # type: ignore[attr-defined]
        return 0 <= value < 2**31
    bits = 64 if kind in (field.TYPE_UINT64, field.TYPE_INT64) else 32  # type: ignore[attr-defined]
    signed = kind in (field.TYPE_INT64, field.TYPE_INT32)  # type: ignore[attr-defined]
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return low <= value <= high


def _mutate_metadata_field(rng: random.Random, entries: list[bytes], body: bytes) -> list[bytes]:
    index = rng.randrange(len(entries))
    metadata, payload = _split(entries[index])
    _set_int(rng, metadata, _METADATA_INTS)
    return [*entries[:index], _entry(metadata, payload), *entries[index + 1:]]


def _mutate_metadata_bytes(rng: random.Random, entries: list[bytes], body: bytes) -> list[bytes]:
    index = rng.randrange(len(entries))
    size = _U32.unpack_from(entries[index])[0]
    raw = _flip(rng, entries[index][4:4 + size])
    return [*entries[:index], _U32.pack(len(raw)) + raw + entries[index][4 + size:], *entries[index + 1:]]


def _mutate_payload(rng: random.Random, entries: list[bytes], body: bytes) -> list[bytes]:
    index = rng.randrange(len(entries))
    metadata, payload = _split(entries[index])
    payload = _flip(rng, payload) if rng.random() < 0.6 else _cut_or_grow(rng, payload)
    return [*entries[:index], _entry(metadata, payload), *entries[index + 1:]]


def _mutate_body(rng: random.Random, entries: list[bytes], body: bytes) -> list[bytes]:
    """Damage the body before compression: the codec accepts what is sent."""
    metadata, _ = _split(entries[0])
    damaged = _flip(rng, body) if rng.random() < 0.5 else _cut_or_grow(rng, body)
    if metadata.HasField("num_messages_in_batch") and rng.random() < 0.5:
        damaged = _mutate_slot(rng, body, metadata.num_messages_in_batch)
    if rng.random() < 0.7:
        metadata.uncompressed_size = len(damaged)
    payload = compress(metadata.compression, damaged)
    if metadata.num_chunks_from_msg <= 1 or len(entries) < 2:
        return [_entry(metadata, payload)]
    metadata.total_chunk_msg_size = len(payload)
    metadata.num_chunks_from_msg = len(entries)
    size = -(-len(payload) // len(entries))
    out = []
    for chunk_id in range(len(entries)):
        metadata.chunk_id = chunk_id
        out.append(_entry(metadata, payload[chunk_id * size:(chunk_id + 1) * size]))
    return out


def _mutate_slot(rng: random.Random, body: bytes, count: int) -> bytes:
    """One slot's size prefix or metadata integers changed, the other slots kept."""
    slots, position = [], 0
    for _ in range(count):
        size = _U32.unpack_from(body, position)[0]
        single = pb.SingleMessageMetadata()
        single.ParseFromString(body[position + 4:position + 4 + size])
        end = position + 4 + size + single.payload_size
        slots.append((single, body[position + 4 + size:end]))
        position = end
    index = rng.randrange(count)
    single = slots[index][0]
    pieces = []
    for number, (each, each_value) in enumerate(slots):
        raw = each.SerializeToString()
        prefix = len(raw)
        if number == index:
            if rng.random() < 0.5:
                _set_int(rng, single, _SLOT_INTS)
                raw = single.SerializeToString()
                prefix = len(raw)
            else:
                prefix = rng.choice((0, prefix - 1, prefix + 1, 2**31, 2**32 - 1, rng.randrange(2**16)))
        pieces.append(_U32.pack(max(0, min(prefix, 2**32 - 1))) + raw + each_value)
    return b"".join(pieces)


def _mutate_chunks(rng: random.Random, entries: list[bytes], body: bytes) -> list[bytes]:
    if len(entries) < 2:
        return _mutate_payload(rng, entries, body)
    choice = rng.randrange(3)
    if choice == 0:
        del entries[rng.randrange(len(entries))]
    elif choice == 1:
        entries.insert(rng.randrange(len(entries) + 1), rng.choice(entries))
    else:
        i, j = rng.sample(range(len(entries)), 2)
        entries[i], entries[j] = entries[j], entries[i]
    return entries


_MUTATIONS: tuple[Callable[[random.Random, list[bytes], bytes], list[bytes]], ...] = (
    _mutate_metadata_field, _mutate_metadata_field, _mutate_metadata_bytes, _mutate_payload, _mutate_body,
    _mutate_body, _mutate_chunks)


def mutate(rng: random.Random, entries: list[bytes], body: bytes) -> list[bytes]:
    """``entries`` (of ``valid_entries``) damaged by one or two mutations drawn from ``rng``."""
    for _ in range(rng.choice((1, 1, 2))):
        mutation = rng.choice(_MUTATIONS)
        try:
            entries = mutation(rng, list(entries), body)
        except (DecodeError, ValueError, struct.error, IndexError):  # an earlier mutation broke what it reads
            index = rng.randrange(len(entries))
            entries[index] = entries[index][:4] + _flip(rng, entries[index][4:])  # the frame keeps its shape
    return entries


def send_frame(producer_id: int, sequence_id: int, entry: bytes) -> bytes:
    """A SEND frame carrying ``entry`` with a valid CRC32C, whatever ``entry`` holds."""
    command = pb.BaseCommand(type=pb.BaseCommand.SEND,
                             send=pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=1))
    command_bytes = command.SerializeToString()
    checksum = b"\x0e\x01" + _U32.pack(crc32c.crc32c(entry))
    total = 4 + len(command_bytes) + len(checksum) + len(entry)
    return _U32.pack(total) + _U32.pack(len(command_bytes)) + command_bytes + checksum + entry
