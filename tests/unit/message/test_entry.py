from __future__ import annotations

import base64
import struct
from typing import Any

import crc32c
import pytest
from google.protobuf.internal import api_implementation
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.errors import CompactorError
from ledger.errors import CompactionServiceError
from message.compression import compress
from message.encoder import COMPACTED_OUT_SLOT, encode_batch, encode_entry, rewrite_batch
from message.entry import (
    Message,
    ParsedEntry,
    batch_slots,
    is_batch,
    is_encrypted,
    is_marker,
    iter_messages,
    parse_entry,
)
from message.errors import MalformedEntryError, MessageFormatError, UndecodablePayloadError
from message.proto import pulsar_api_pb2 as pb

CODECS = [pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY]


def metadata(**fields: Any) -> pb.MessageMetadata:
    return pb.MessageMetadata(
        producer_name="producer-1", sequence_id=7, publish_time=1_700_000_000_000, **fields
    )


def single_entry(
    value: bytes, codec: pb.CompressionType = pb.NONE, *, with_checksum: bool = False, **fields: Any
) -> bytes:
    """A non-batched entry the way a producer encodes it."""
    return encode_entry(
        metadata(compression=codec, uncompressed_size=len(value), **fields),
        compress(codec, value),
        with_checksum=with_checksum,
    )


def slot(value: bytes, **fields: Any) -> tuple[pb.SingleMessageMetadata, bytes]:
    return pb.SingleMessageMetadata(payload_size=len(value), **fields), value


def messages(data: bytes) -> list[Message]:
    return list(iter_messages(parse_entry(data)))


# --- framing -----------------------------------------------------------------------------


@pytest.mark.parametrize("with_checksum", [False, True])
def test_layout_is_size_metadata_payload_with_optional_checksum(with_checksum: bool) -> None:
    meta = metadata(partition_key="k")
    data = encode_entry(meta, b"value", with_checksum=with_checksum)
    body = struct.pack(">I", meta.ByteSize()) + meta.SerializeToString() + b"value"
    expected = (
        b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(body)) + body if with_checksum else body
    )
    assert data == expected
    entry = parse_entry(data)
    assert entry.metadata == meta
    assert entry.payload == b"value"
    assert entry.has_checksum is with_checksum
    assert entry.header_size == len(data) - len(b"value")


def test_broker_entry_metadata_prefix_is_skipped() -> None:
    inner = single_entry(b"v", with_checksum=True, partition_key="k")
    block = pb.BrokerEntryMetadata(broker_timestamp=5, index=9).SerializeToString()
    data = b"\x0e\x02" + struct.pack(">I", len(block)) + block + inner
    entry = parse_entry(data)
    assert entry.has_checksum
    assert entry.payload == b"v"
    assert entry.header_size == len(data) - 1


def test_empty_payload_parses() -> None:
    entry = parse_entry(encode_entry(metadata(), b"", with_checksum=False))
    assert entry.payload == b""


# --- non-batched messages ----------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("with_checksum", [False, True])
def test_single_message_round_trip(codec: pb.CompressionType, with_checksum: bool) -> None:
    value = b"the value " * 20
    data = single_entry(
        value,
        codec,
        with_checksum=with_checksum,
        partition_key="key-1",
        ordering_key=b"ok",
        event_time=123,
        properties=[pb.KeyValue(key="a", value="1"), pb.KeyValue(key="b", value="2")],
    )
    entry = parse_entry(data)
    assert entry.payload == compress(codec, value)  # still compressed
    assert not is_batch(entry.metadata)
    [message] = iter_messages(entry)
    assert message == Message(
        batch_index=-1,
        key="key-1",
        partition_key_b64_encoded=False,
        ordering_key=b"ok",
        properties={"a": "1", "b": "2"},
        payload=value,
        payload_size=len(value),
        null_value=False,
        compacted_out=False,
        event_time=123,
        sequence_id=7,
    )
    assert not message.is_tombstone


def test_unset_event_time_and_ordering_key_are_none() -> None:
    [message] = messages(single_entry(b"v", partition_key="k"))
    assert message.event_time is None
    assert message.ordering_key is None
    assert message.properties == {}


def test_properties_are_read_only() -> None:
    [message] = messages(single_entry(b"v", properties=[pb.KeyValue(key="a", value="1")]))
    with pytest.raises(TypeError):
        message.properties["a"] = "2"  # type: ignore[index]


# --- keys --------------------------------------------------------------------------------


def test_absent_key_is_none() -> None:
    [message] = messages(single_entry(b"v"))
    assert message.key is None
    assert not message.has_key
    assert message.key_bytes is None


def test_null_partition_key_wins_over_a_key() -> None:
    [message] = messages(single_entry(b"v", partition_key="k", null_partition_key=True))
    assert message.key is None


def test_empty_string_is_a_key() -> None:
    [message] = messages(single_entry(b"v", partition_key=""))
    assert message.key == ""
    assert message.has_key


def test_base64_key_is_kept_as_text_and_decoded_on_request() -> None:
    raw = b"\x00\xffbinary"
    encoded = base64.b64encode(raw).decode()
    [message] = messages(single_entry(b"v", partition_key=encoded, partition_key_b64_encoded=True))
    assert message.key == encoded  # compaction compares the text, as Pulsar does
    assert message.partition_key_b64_encoded
    assert message.key_bytes == raw


def test_plain_key_bytes_are_utf8() -> None:
    [message] = messages(single_entry(b"v", partition_key="clé"))
    assert message.key_bytes == "clé".encode()


def test_invalid_base64_key_fails_only_when_decoded() -> None:
    [message] = messages(
        single_entry(b"v", partition_key="not base64!", partition_key_b64_encoded=True)
    )
    assert message.key == "not base64!"
    with pytest.raises(MalformedEntryError, match="base64"):
        _ = message.key_bytes


def test_non_utf8_key_bytes_stay_distinct_and_round_trip() -> None:
    meta = metadata(partition_key="\u00e9")
    raw_meta = meta.SerializeToString().replace("\u00e9".encode(), b"\xff\xfe")
    data = struct.pack(">I", len(raw_meta)) + raw_meta + b"v"
    if api_implementation.Type() == "python":  # this runtime refuses non-UTF-8 strings
        with pytest.raises(MalformedEntryError):
            parse_entry(data)
        return
    [message] = messages(data)
    assert isinstance(message.key, str)
    assert message.key_bytes == b"\xff\xfe"


# --- tombstones --------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_keyed_empty_value_is_a_tombstone(codec: pb.CompressionType) -> None:
    [message] = messages(single_entry(b"", codec, partition_key="k"))
    assert message.is_tombstone


def test_keyed_null_value_is_a_tombstone() -> None:
    [message] = messages(single_entry(b"", partition_key="k", null_value=True))
    assert message.null_value and message.is_tombstone


def test_keyless_empty_value_is_not_a_tombstone() -> None:
    [message] = messages(single_entry(b""))
    assert not message.is_tombstone


def test_keyed_value_is_not_a_tombstone() -> None:
    [message] = messages(single_entry(b"x", partition_key="k"))
    assert not message.is_tombstone


# --- batches -----------------------------------------------------------------------------


def batch(codec: pb.CompressionType = pb.NONE, *, with_checksum: bool = False) -> bytes:
    return encode_batch(
        metadata(),
        [
            slot(b"one", partition_key="a", sequence_id=7, event_time=11),
            slot(
                b"two",
                partition_key="b",
                sequence_id=8,
                properties=[pb.KeyValue(key="p", value="q")],
            ),
            slot(b"", partition_key="a", sequence_id=9, null_value=True),
            slot(b"four", sequence_id=10),
            slot(b"", partition_key="c", sequence_id=11),
        ],
        codec,
        with_checksum=with_checksum,
    )


@pytest.mark.parametrize("codec", CODECS)
def test_batch_slots_in_order(codec: pb.CompressionType) -> None:
    entry = parse_entry(batch(codec))
    assert is_batch(entry.metadata)
    assert entry.metadata.num_messages_in_batch == 5
    assert entry.metadata.compression == codec
    found = list(iter_messages(entry))
    assert [m.batch_index for m in found] == [0, 1, 2, 3, 4]
    assert [m.key for m in found] == ["a", "b", "a", None, "c"]
    assert [m.payload for m in found] == [b"one", b"two", b"", b"four", b""]
    assert [m.sequence_id for m in found] == [7, 8, 9, 10, 11]
    assert [m.is_tombstone for m in found] == [False, False, True, False, True]
    assert found[0].event_time == 11
    assert found[1].properties == {"p": "q"}


def test_batch_of_one_is_still_a_batch() -> None:
    """Java producers mark even single messages as a batch: presence decides, not N."""
    data = encode_batch(metadata(), [slot(b"v", partition_key="k")], pb.NONE, with_checksum=False)
    [message] = messages(data)
    assert message.batch_index == 0
    assert message.payload == b"v"


def test_slot_without_sequence_id() -> None:
    data = encode_batch(metadata(), [slot(b"v")], pb.NONE, with_checksum=False)
    [message] = messages(data)
    assert message.sequence_id is None


def test_slot_key_base64_and_null_key() -> None:
    encoded = base64.b64encode(b"\x01\x02").decode()
    data = encode_batch(
        metadata(),
        [
            slot(b"v", partition_key=encoded, partition_key_b64_encoded=True),
            slot(b"w", partition_key="x", null_partition_key=True),
        ],
        pb.NONE,
        with_checksum=False,
    )
    first, second = messages(data)
    assert first.key_bytes == b"\x01\x02"
    assert second.key is None


def test_batch_slots_expose_the_slot_bytes() -> None:
    entry = parse_entry(batch())
    slots = batch_slots(entry)
    assert b"".join(s.slot_bytes for s in slots) == entry.payload
    assert [s.batch_index for s in slots] == list(range(5))


def test_trailing_bytes_after_the_last_slot_are_ignored() -> None:
    entry = parse_entry(batch())
    padded = ParsedEntry(
        metadata=entry.metadata,
        payload=entry.payload + b"\x00\x00",
        header_size=0,
        has_checksum=False,
    )
    assert [m.payload for m in iter_messages(padded)] == [m.payload for m in iter_messages(entry)]


# --- rewrite_batch -----------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("with_checksum", [False, True])
def test_rewrite_keeps_numbering_and_empties_dropped_slots(
    codec: pb.CompressionType, with_checksum: bool
) -> None:
    original = parse_entry(batch(codec, with_checksum=with_checksum))
    rewritten = parse_entry(rewrite_batch(original, {1, 3}))
    assert rewritten.has_checksum is with_checksum
    assert rewritten.metadata.num_messages_in_batch == 5
    assert rewritten.metadata.compression == codec
    before, after = list(iter_messages(original)), list(iter_messages(rewritten))
    assert [m.batch_index for m in after] == [0, 1, 2, 3, 4]
    assert after[1] == before[1] and after[3] == before[3]
    for dropped in (after[0], after[2], after[4]):
        assert dropped.compacted_out
        assert dropped.payload == b"" and dropped.key is None and dropped.properties == {}
        assert not dropped.is_tombstone


def test_rewrite_copies_kept_slots_byte_for_byte() -> None:
    original = parse_entry(batch())
    rewritten = parse_entry(rewrite_batch(original, {0, 4}))
    before, after = batch_slots(original), batch_slots(rewritten)
    assert after[0].slot_bytes == before[0].slot_bytes
    assert after[4].slot_bytes == before[4].slot_bytes
    assert after[1].slot_bytes == after[2].slot_bytes == after[3].slot_bytes == COMPACTED_OUT_SLOT
    assert rewritten.metadata.uncompressed_size == sum(len(s.slot_bytes) for s in after)
    unchanged = pb.MessageMetadata()
    unchanged.CopyFrom(rewritten.metadata)
    unchanged.uncompressed_size = original.metadata.uncompressed_size
    assert unchanged == original.metadata


def test_rewrite_is_idempotent() -> None:
    once = rewrite_batch(parse_entry(batch(pb.ZSTD)), {1, 3})
    assert rewrite_batch(parse_entry(once), {1, 3}) == once


def test_rewrite_keeping_everything_keeps_the_body() -> None:
    original = parse_entry(batch(pb.NONE))
    assert rewrite_batch(original, set(range(5))) == batch(pb.NONE)


def test_rewrite_keeping_nothing_is_all_compacted_out() -> None:
    rewritten = messages(rewrite_batch(parse_entry(batch()), set()))
    assert all(m.compacted_out for m in rewritten)


# --- markers and encryption --------------------------------------------------------------


def test_marker_is_recognised() -> None:
    entry = parse_entry(single_entry(b"", marker_type=20))
    assert is_marker(entry.metadata)
    assert not is_marker(parse_entry(single_entry(b"v", partition_key="k")).metadata)


def test_encrypted_batch_is_one_opaque_message() -> None:
    keys = [pb.EncryptionKeys(key="rsa", value=b"secret")]
    data = encode_entry(
        metadata(
            num_messages_in_batch=3, partition_key="k", encryption_keys=keys, uncompressed_size=40
        ),
        b"ciphertext that is not a batch body",
        with_checksum=False,
    )
    entry = parse_entry(data)
    assert is_encrypted(entry.metadata) and is_batch(entry.metadata)
    [message] = iter_messages(entry)
    assert message.batch_index == -1
    assert message.key == "k"
    assert message.payload == b"ciphertext that is not a batch body"
    assert message.payload_size == 40 and not message.is_tombstone


def test_encrypted_empty_value_is_a_tombstone() -> None:
    keys = [pb.EncryptionKeys(key="rsa", value=b"secret")]
    data = encode_entry(
        metadata(partition_key="k", encryption_keys=keys, uncompressed_size=0),
        b"authentication tag",
        with_checksum=False,
    )
    [message] = messages(data)
    assert message.is_tombstone


# --- malformed input ---------------------------------------------------------------------


def test_errors_belong_to_the_tree() -> None:
    assert issubclass(MalformedEntryError, MessageFormatError)
    assert not issubclass(MalformedEntryError, CompactorError)  # the format sits below the compactor
    assert issubclass(MalformedEntryError, CompactionServiceError)
    assert issubclass(MalformedEntryError, ValueError)
    assert issubclass(UndecodablePayloadError, MalformedEntryError)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "metadata size"),
        (b"\x00\x00", "metadata size"),
        (b"\x00\x00\x00\x00", "outside"),
        (b"\x00\x00\x00\x10abc", "runs past"),
        (b"\x7f\xff\xff\xff" + b"x" * 10, "outside"),
        (b"\x0e\x01\x00\x00", "checksum"),
        (b"\x0e\x02\x00\x00", "broker entry"),
        (b"\x0e\x02\x00\x00\x00\x10", "broker entry"),
        (b"\x00\x00\x00\x03\xff\xff\xff", "does not parse"),
        (b"\x00\x00\x00\x03\x0a\x01p", "lacks required fields: sequence_id, publish_time"),
    ],
)
def test_malformed_framing(data: bytes, match: str) -> None:
    with pytest.raises(MalformedEntryError, match=match):
        parse_entry(data)


@pytest.mark.parametrize("cut", [1, 5, 6, 10, 20])
def test_truncated_entry_is_malformed_or_shorter(cut: int) -> None:
    data = single_entry(b"payload", with_checksum=True, partition_key="k")
    with pytest.raises(MalformedEntryError):
        parse_entry(data[:cut])


def test_bad_checksum() -> None:
    data = bytearray(single_entry(b"payload", with_checksum=True, partition_key="k"))
    data[-1] ^= 0x01
    with pytest.raises(MalformedEntryError, match="checksum mismatch"):
        parse_entry(bytes(data))


def test_unknown_codec_is_refused_at_parse() -> None:
    raw = metadata().SerializeToString() + b"\x40\x09"  # field 8 (compression) = 9
    with pytest.raises(MalformedEntryError, match="codec"):
        parse_entry(struct.pack(">I", len(raw)) + raw + b"payload")


@pytest.mark.parametrize("count", [0, -1])
def test_non_positive_batch_count(count: int) -> None:
    with pytest.raises(MalformedEntryError, match="num_messages_in_batch"):
        parse_entry(encode_entry(metadata(num_messages_in_batch=count), b"", with_checksum=False))


def test_batch_count_beyond_body() -> None:
    entry = parse_entry(batch())
    too_many = pb.MessageMetadata()
    too_many.CopyFrom(entry.metadata)
    too_many.num_messages_in_batch = 6
    bad = parse_entry(encode_entry(too_many, entry.payload, with_checksum=False))
    with pytest.raises(UndecodablePayloadError, match="ends before slot 5"):
        iter_messages(bad)
    too_many.num_messages_in_batch = 1000
    bad = parse_entry(encode_entry(too_many, entry.payload, with_checksum=False))
    with pytest.raises(UndecodablePayloadError, match="cannot hold"):
        iter_messages(bad)


@pytest.mark.parametrize(
    "body",
    [
        struct.pack(">I", 100) + b"\x18\x01",  # slot metadata size past the body
        struct.pack(">I", 2) + b"\x18\x05" + b"abc",  # payload_size past the body
        struct.pack(">I", 2) + b"\x18\x7f" + b"\x00" * 4,  # ditto, other shape
        struct.pack(">I", 2) + b"\x10\x01" + b"\x00" * 4,  # no payload_size (required)
        struct.pack(">I", 2) + b"\xff\xff" + b"\x00" * 4,  # slot metadata does not parse
        struct.pack(">I", 11) + b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # negative size
    ],
)
def test_malformed_slots(body: bytes) -> None:
    data = encode_entry(
        metadata(num_messages_in_batch=1, uncompressed_size=len(body)), body, with_checksum=False
    )
    entry = parse_entry(data)  # parse never looks at the payload
    with pytest.raises(UndecodablePayloadError):
        iter_messages(entry)


@pytest.mark.parametrize("codec", [pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY])
def test_undecodable_compressed_payload(codec: pb.CompressionType) -> None:
    data = encode_entry(
        metadata(compression=codec, uncompressed_size=50, partition_key="k"),
        b"\xff" * 20,
        with_checksum=False,
    )
    with pytest.raises(UndecodablePayloadError):
        iter_messages(parse_entry(data))


def test_wrong_uncompressed_size() -> None:
    data = encode_entry(
        metadata(compression=pb.ZLIB, uncompressed_size=4, partition_key="k"),
        compress(pb.ZLIB, b"hello"),
        with_checksum=False,
    )
    with pytest.raises(UndecodablePayloadError, match="uncompressed_size"):
        iter_messages(parse_entry(data))


# --- fuzzing -----------------------------------------------------------------------------


def _parse_everything(data: bytes) -> None:
    """parse_entry, then every message: only MalformedEntryError may escape."""
    try:
        entry = parse_entry(data)
        for message in iter_messages(entry):
            _ = message.is_tombstone
    except MalformedEntryError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _parse_everything(data)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes_behind_a_valid_checksum(data: bytes) -> None:
    _parse_everything(b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(data)) + data)


@st.composite
def mutated_entries(draw: st.DrawFn) -> bytes:
    """Valid single and batch entries with bytes flipped, dropped or inserted."""
    codec = draw(st.sampled_from(CODECS))
    checksum = draw(st.booleans())
    data = bytearray(
        batch(codec, with_checksum=checksum)
        if draw(st.booleans())
        else single_entry(b"value" * 5, codec, with_checksum=checksum, partition_key="k")
    )
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(data) - 1))
        operation = draw(st.sampled_from(["flip", "drop", "insert", "cut"]))
        if operation == "flip":
            data[position] ^= draw(st.integers(1, 255))
        elif operation == "drop":
            del data[position]
        elif operation == "insert":
            data.insert(position, draw(st.integers(0, 255)))
        else:
            del data[position:]
        if not data:
            break
    return bytes(data)


@settings(max_examples=500)
@given(mutated_entries())
def test_fuzz_mutated_entries(data: bytes) -> None:
    _parse_everything(data)


@settings(max_examples=300)
@given(
    body=st.binary(max_size=120),
    count=st.integers(1, 30),
    codec=st.sampled_from(CODECS),
    size=st.integers(0, 1000),
)
def test_fuzz_batch_bodies(body: bytes, count: int, codec: pb.CompressionType, size: int) -> None:
    data = encode_entry(
        metadata(num_messages_in_batch=count, compression=codec, uncompressed_size=size),
        body,
        with_checksum=False,
    )
    _parse_everything(data)
