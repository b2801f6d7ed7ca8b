"""The frame codec: round trips, incremental decoding, every malformed case, and a fuzz."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import crc32c
import pytest
from google.protobuf.message import EncodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.wire.frames import (
    FRAME_BYTES_MAX,
    FRAME_PADDING_BYTES,
    MESSAGE_BYTES_MAX,
    Frame,
    FrameDecoder,
    FrameError,
    encode_command,
    encode_payload_command,
    make_command,
)
from ledger.errors import CompactionServiceError
from message.encoder import encode_entry
from message.entry import parse_entry
from message.proto import pulsar_api_pb2 as pb

T = pb.BaseCommand


def entry(value: bytes = b"hello", key: str = "k") -> bytes:
    """A stored entry: metadataSize, MessageMetadata, payload (no checksum)."""
    metadata = pb.MessageMetadata(
        producer_name="p", sequence_id=3, publish_time=1_700_000_000_000, partition_key=key
    )
    return encode_entry(metadata, value, with_checksum=False)


def send(sequence_id: int = 3) -> pb.BaseCommand:
    return make_command(pb.CommandSend(producer_id=1, sequence_id=sequence_id))


def message() -> pb.BaseCommand:
    return make_command(
        pb.CommandMessage(consumer_id=2, message_id=pb.MessageIdData(ledgerId=7, entryId=9))
    )


def frame_bytes(total_size: int, command_size: int, rest: bytes) -> bytes:
    return struct.pack(">II", total_size, command_size) + rest


def raw_frame(command_bytes: bytes, tail: bytes = b"") -> bytes:
    """A frame around arbitrary BaseCommand bytes, lengths consistent."""
    return frame_bytes(4 + len(command_bytes) + len(tail), len(command_bytes), command_bytes + tail)


def decode_all(data: bytes, max_frame_bytes: int = FRAME_BYTES_MAX) -> list[Frame]:
    decoder = FrameDecoder(max_frame_bytes)
    frames = decoder.feed(data)
    assert decoder.buffered == 0
    return frames


SIMPLE_COMMANDS = [
    make_command(pb.CommandPing()),
    make_command(pb.CommandSuccess(request_id=1)),
    make_command(pb.CommandConnected(server_version="compactd", protocol_version=20)),
    make_command(
        pb.CommandSubscribe(
            topic="persistent://public/default/t",
            subscription="s",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=0,
            request_id=4,
            read_compacted=True,
            start_message_id=pb.MessageIdData(ledgerId=2**64 - 1, entryId=2**64 - 1),
        )
    ),
    make_command(
        pb.CommandError(request_id=5, error=pb.NotAllowedError, message="no " + "x" * 300)
    ),
]


# --- constants -----------------------------------------------------------------------------


def test_size_rule() -> None:
    assert MESSAGE_BYTES_MAX == 5 * 1024 * 1024
    assert FRAME_BYTES_MAX == MESSAGE_BYTES_MAX + FRAME_PADDING_BYTES
    assert issubclass(FrameError, CompactionServiceError)


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", SIMPLE_COMMANDS, ids=lambda c: T.Type.Name(c.type))
def test_simple_command_round_trip(command: pb.BaseCommand) -> None:
    data = encode_command(command)
    (total_size, command_size) = struct.unpack_from(">II", data)
    assert total_size == len(data) - 4 == 4 + command_size
    [frame] = decode_all(data)
    assert frame == Frame(command, None, True)
    assert frame.type == command.type


@pytest.mark.parametrize("with_checksum", [True, False])
@pytest.mark.parametrize("make", [send, message])
def test_payload_command_round_trip(
    make: Callable[[], pb.BaseCommand], with_checksum: bool
) -> None:
    command, stored = make(), entry()
    data = encode_payload_command(command, stored, with_checksum=with_checksum)
    [frame] = decode_all(data)
    assert frame == Frame(command, stored, True)
    assert frame.entry is not None
    assert parse_entry(frame.entry).metadata.partition_key == "k"
    assert data.endswith(stored)
    assert (b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(stored)) in data) == with_checksum


@pytest.mark.parametrize("with_checksum", [True, False])
def test_split_at_every_byte_boundary(with_checksum: bool) -> None:
    stream = (
        encode_payload_command(send(), entry(b"v" * 40), with_checksum=with_checksum)
        + encode_command(SIMPLE_COMMANDS[1])
        + encode_payload_command(message(), entry(b""), with_checksum=with_checksum)
    )
    expected = decode_all(stream)
    assert [f.type for f in expected] == [T.SEND, T.SUCCESS, T.MESSAGE]
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        frames = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert frames == expected, cut
        assert decoder.buffered == 0
    decoder = FrameDecoder()
    one_by_one = [frame for i in range(len(stream)) for frame in decoder.feed(stream[i : i + 1])]
    assert one_by_one == expected


def test_many_frames_in_one_feed() -> None:
    commands = [make_command(pb.CommandFlow(consumer_id=1, messagePermits=i)) for i in range(500)]
    stream = b"".join(encode_command(c) for c in commands)
    decoder = FrameDecoder()
    frames = decoder.feed(stream + encode_command(SIMPLE_COMMANDS[0])[:5])
    assert [f.command for f in frames] == commands
    assert decoder.buffered == 5


def test_many_small_feeds_stay_linear() -> None:
    """A long stream in small pieces: the buffer never grows beyond what is pending."""
    one = encode_payload_command(send(), entry(b"x" * 100))
    decoder = FrameDecoder()
    count = 0
    piece = 37
    stream = one * 3000
    for start in range(0, len(stream), piece):
        count += len(decoder.feed(memoryview(stream)[start : start + piece]))
        assert decoder.buffered < len(one)
        assert len(decoder._buffer) < 64 * 1024 + len(one) + piece
    assert count == 3000


def test_truncated_frame_is_buffered_not_an_error() -> None:
    data = encode_payload_command(send(), entry())
    decoder = FrameDecoder()
    assert decoder.feed(data[:-1]) == []
    assert decoder.buffered == len(data) - 1
    [frame] = decoder.feed(data[-1:])
    assert frame.entry == entry()
    assert decoder.buffered == 0
    assert decoder.feed(b"") == []


def test_broker_entry_metadata_block_is_skipped() -> None:
    stored = entry()
    command_bytes = message().SerializeToString()
    block = pb.BrokerEntryMetadata(broker_timestamp=5, index=6).SerializeToString()
    tail = (
        b"\x0e\x02"
        + struct.pack(">I", len(block))
        + block
        + b"\x0e\x01"
        + struct.pack(">I", crc32c.crc32c(stored))
        + stored
    )
    [frame] = decode_all(raw_frame(command_bytes, tail))
    assert frame == Frame(message(), stored, True)
    [frame] = decode_all(raw_frame(command_bytes, tail[: 6 + len(block)] + stored))
    assert frame == Frame(message(), stored, True)


def test_frame_exactly_at_the_limit() -> None:
    stored = entry(b"z" * 100)
    data = encode_payload_command(send(), stored)
    assert decode_all(data, max_frame_bytes=len(data))[0].entry == stored
    with pytest.raises(FrameError, match="exceeds the limit"):
        FrameDecoder(len(data) - 1).feed(data[:4])


def test_largest_message_fits_the_default_frame() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    stored = encode_entry(metadata, b"", with_checksum=False)
    stored += b"\x00" * (MESSAGE_BYTES_MAX - len(stored))
    command = make_command(
        pb.CommandSend(producer_id=2**64 - 1, sequence_id=2**64 - 1, num_messages=1000)
    )
    data = encode_payload_command(command, stored)
    assert len(data) <= FRAME_BYTES_MAX
    [frame] = decode_all(data)
    assert frame.entry is not None
    assert len(frame.entry) == MESSAGE_BYTES_MAX


# --- checksum ------------------------------------------------------------------------------


def test_checksum_mismatch_is_reported_not_raised() -> None:
    stored = entry(b"payload")
    data = bytearray(encode_payload_command(send(), stored))
    data[-1] ^= 0x01
    decoder = FrameDecoder()
    [frame] = decoder.feed(bytes(data) + encode_command(SIMPLE_COMMANDS[0]))[:1]
    assert frame.checksum_ok is False
    assert frame.type == T.SEND
    assert frame.entry == stored[:-1] + bytes([stored[-1] ^ 0x01])
    # the connection carries on
    assert decoder.feed(encode_command(SIMPLE_COMMANDS[1]))[0].command == SIMPLE_COMMANDS[1]


def test_checksum_mismatch_skips_the_entry_shape_check() -> None:
    """A damaged metadataSize is a checksum error (SEND_ERROR), not a closed connection."""
    stored = bytearray(entry())
    data = bytearray(encode_payload_command(send(), bytes(stored)))
    data[-len(stored)] = 0xFF  # metadataSize now overruns the payload
    [frame] = decode_all(bytes(data))
    assert frame.checksum_ok is False


def test_wrong_stored_checksum_value() -> None:
    stored = entry()
    tail = b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(stored) ^ 1) + stored
    [frame] = decode_all(raw_frame(send().SerializeToString(), tail))
    assert (frame.checksum_ok, frame.entry) == (False, stored)


# --- malformed input -----------------------------------------------------------------------


def ping_bytes() -> bytes:
    return make_command(pb.CommandPing()).SerializeToString()


MALFORMED = {
    "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "oversized length prefix": struct.pack(">I", FRAME_BYTES_MAX - 3),
    "huge length prefix": b"\xff\xff\xff\xff",
    "totalSize below 4": frame_bytes(3, 0, b""),
    "cmdSize above totalSize": frame_bytes(8, 5, b"\x08\x12\x92\x01\x00"),
    "cmdSize above totalSize, early": frame_bytes(100, 97, b""),
    "empty BaseCommand": raw_frame(b""),
    "unparseable BaseCommand": raw_frame(b"\x0a\xff\xff\xff\xff\x0f"),
    "truncated sub-message": raw_frame(b"\x08\x12\x92\x01\x05\x00"),
    "unknown type number": raw_frame(b"\x08\x45"),
    "type field with the wrong wire type": raw_frame(b"\x0a\x02\x08\x01"),
    "type field as a fixed32": raw_frame(b"\x0d\x01\x00\x00\x00"),
    "type missing": raw_frame(b"\x92\x01\x00"),
    "sub-message missing": raw_frame(b"\x08\x12"),
    "sub-message mismatch": raw_frame(b"\x08\x13\x92\x01\x00"),
    "two sub-messages": raw_frame(b"\x08\x12\x92\x01\x00\x9a\x01\x00"),
    "SEND without producer_id": raw_frame(
        T(type=T.SEND, send=pb.CommandSend(sequence_id=1)).SerializePartialToString(),
        b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(entry())) + entry(),
    ),
    "nested required field missing": raw_frame(
        T(
            type=T.MESSAGE, message=pb.CommandMessage(consumer_id=1, message_id={"ledgerId": 1})
        ).SerializePartialToString(),
        entry(),
    ),
    "stray bytes after a simple command": raw_frame(ping_bytes(), b"\x00"),
    "SEND without payload": raw_frame(send().SerializeToString()),
    "payload shorter than metadataSize field": raw_frame(send().SerializeToString(), b"\0\0\1"),
    "metadataSize zero": raw_frame(send().SerializeToString(), b"\0\0\0\0abc"),
    "metadataSize overruns payload": raw_frame(send().SerializeToString(), b"\0\0\0\x09abc"),
    "checksum truncated": raw_frame(send().SerializeToString(), b"\x0e\x01\0\0\0"),
    "checksummed payload too short": raw_frame(
        send().SerializeToString(), b"\x0e\x01" + struct.pack(">I", crc32c.crc32c(b"ab")) + b"ab"
    ),
    "broker entry header truncated": raw_frame(message().SerializeToString(), b"\x0e\x02\0\0"),
    "broker entry overruns": raw_frame(
        message().SerializeToString(), b"\x0e\x02\0\0\1\0" + entry()
    ),
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_raises_frame_error(data: bytes) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(data)
    with pytest.raises(FrameError, match="already failed"):
        decoder.feed(encode_command(SIMPLE_COMMANDS[0]))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (MALFORMED["unknown type number"], "unknown command type 69"),
        (MALFORMED["SEND without producer_id"], "send.producer_id"),
        (MALFORMED["nested required field missing"], "message.message_id.entryId"),
        (MALFORMED["sub-message mismatch"], "PONG command must carry exactly its pong"),
        (MALFORMED["sub-message missing"], "PING command lacks its ping"),
        (MALFORMED["cmdSize above totalSize"], "cmdSize 5 overruns"),
        (MALFORMED["metadataSize overruns payload"], "SEND: metadataSize 9 overruns"),
        (MALFORMED["oversized length prefix"], f"exceeds the limit of {FRAME_BYTES_MAX}"),
    ],
)
def test_frame_error_messages_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        FrameDecoder().feed(data)


def test_oversized_prefix_fails_before_the_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameError):
        decoder.feed(struct.pack(">I", 1021))
    assert FrameDecoder(1024).feed(struct.pack(">I", 1020)) == []


def test_error_after_good_frames_in_the_same_feed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError):
        decoder.feed(encode_command(SIMPLE_COMMANDS[1]) + MALFORMED["garbage"])


def test_max_frame_bytes_must_be_sane() -> None:
    for bad in (0, 8, 0x0E010000):
        with pytest.raises(ValueError):
            FrameDecoder(bad)


# --- encoder refusals ----------------------------------------------------------------------


def test_encoder_refuses_bugs() -> None:
    with pytest.raises(EncodeError):
        encode_command(T(type=T.SUCCESS, success=pb.CommandSuccess()))
    with pytest.raises(ValueError, match="exactly its pong"):
        encode_command(T(type=T.PONG, ping=pb.CommandPing()))
    with pytest.raises(ValueError, match="no type"):
        encode_command(T())
    with pytest.raises(ValueError, match="encode_payload_command"):
        encode_command(send())
    with pytest.raises(ValueError, match="encode_command"):
        encode_payload_command(SIMPLE_COMMANDS[0], entry())
    with pytest.raises(ValueError, match="overruns"):
        encode_payload_command(send(), entry()[:-6])
    with pytest.raises(TypeError):
        make_command(pb.MessageMetadata())


def test_make_command_copies_the_body() -> None:
    body = pb.CommandSuccess(request_id=1)
    command = make_command(body)
    body.request_id = 2
    assert (command.type, command.success.request_id) == (T.SUCCESS, 1)


# --- fuzz ----------------------------------------------------------------------------------

VALID_FRAMES = [encode_command(c) for c in SIMPLE_COMMANDS[:3]] + [
    encode_payload_command(send(), entry(b"abc")),
    encode_payload_command(message(), entry(b""), with_checksum=False),
]


@st.composite
def mutated_stream(draw: st.DrawFn) -> bytes:
    data = bytearray(b"".join(draw(st.lists(st.sampled_from(VALID_FRAMES), max_size=4))))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not data:
            data += draw(st.binary(max_size=8))
            continue
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data)


def feed_in_chunks(
    decoder: FrameDecoder, data: bytes, cuts: list[int]
) -> tuple[list[Frame], FrameError | None]:
    frames: list[Frame] = []
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    try:
        for start, end in itertools.pairwise(bounds):
            frames += decoder.feed(data[start:end])
    except FrameError as error:
        return frames, error
    return frames, None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.one_of(st.binary(max_size=300), mutated_stream()),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
    max_frame_bytes=st.sampled_from([16, 64, 200, FRAME_BYTES_MAX]),
)
def test_fuzz_frames_or_frame_error_only(
    data: bytes, cuts: list[int], max_frame_bytes: int
) -> None:
    frames, error = feed_in_chunks(FrameDecoder(max_frame_bytes), data, cuts)
    for frame in frames:
        assert frame.command.IsInitialized()
        assert (frame.entry is not None) == (frame.type in (T.SEND, T.MESSAGE))
        size = 8 + len(frame.command.SerializeToString()) + len(frame.entry or b"")
        assert size <= max_frame_bytes
    # chunking never changes the outcome
    whole = FrameDecoder(max_frame_bytes)
    try:
        assert whole.feed(data) == frames
        assert error is None
    except FrameError:
        assert error is not None


def test_a_released_decoder_holds_nothing_and_refuses_input() -> None:
    decoder = FrameDecoder()
    frame = encode_command(make_command(pb.CommandPing()))
    decoder.feed(frame + frame[:5])
    assert decoder.buffered > 0
    decoder.release()
    assert decoder.buffered == 0
    with pytest.raises(FrameError):
        decoder.feed(frame)
