"""The door's value rules, each shown on the entry shape that broke a later use
(``api.wire.validate``: times, epochs, text, chunks; ``api.wire.chunk_door``: the chunks
of one message together). Pure functions: no broker."""

from __future__ import annotations

import struct

import pytest

from api.wire.chunk_door import ChunkDoor, may_be_chunk
from api.wire.frames import Frame, make_command
from api.wire.validate import CHUNKED_MESSAGE_BYTES_MAX, TIME_MS_MAX, entry_problem, frame_problem
from message.compression import compress
from message.proto import pulsar_api_pb2 as pb

_U32 = struct.Struct(">I")


def _entry(payload: bytes = b"v", **fields: object) -> bytes:
    metadata = pb.MessageMetadata(**{"producer_name": "p", "sequence_id": 0, "publish_time": 1, **fields})
    raw = metadata.SerializePartialToString()
    return _U32.pack(len(raw)) + raw + payload


def _slot(**fields: object) -> bytes:
    raw = pb.SingleMessageMetadata(payload_size=1, **fields).SerializeToString()
    return _U32.pack(len(raw)) + raw + b"v"


@pytest.mark.parametrize("name", ["publish_time", "event_time", "deliver_at_time"])
def test_a_time_past_what_a_date_can_hold_is_refused(name: str) -> None:
    assert entry_problem(_entry(**{name: TIME_MS_MAX})) is None
    assert entry_problem(_entry(**{name: TIME_MS_MAX + 1})) is not None
    if name == "deliver_at_time":
        assert entry_problem(_entry(deliver_at_time=-1)) is not None


@pytest.mark.parametrize("count", [2, 12])  # walked slot by slot / as a run of alike slots
def test_a_slot_event_time_or_sequence_id_out_of_range_is_refused(count: int) -> None:
    for bad in ({"event_time": TIME_MS_MAX + 1}, {"sequence_id": 2**63}, {"event_time": 2**64 - 1}):
        body = b"".join(_slot(**bad) for _ in range(count))
        assert entry_problem(_entry(body, num_messages_in_batch=count)) is not None, bad
        body = _slot(event_time=TIME_MS_MAX) * (count - 1) + _slot(**bad)  # only the last slot
        assert entry_problem(_entry(body, num_messages_in_batch=count)) is not None, bad
    body = b"".join(_slot(event_time=TIME_MS_MAX - i, sequence_id=2**63 - 1 - i) for i in range(count))
    assert entry_problem(_entry(body, num_messages_in_batch=count)) is None


def test_a_key_or_property_that_is_not_utf8_is_refused() -> None:
    good = _entry(partition_key="key")
    assert entry_problem(good) is None
    assert entry_problem(good.replace(b"key", b"\xffey")) is not None
    slot = _slot(partition_key="key", properties=[pb.KeyValue(key="a", value="val")])
    batch = _entry(slot * 2, num_messages_in_batch=2)
    assert entry_problem(batch) is None
    assert entry_problem(batch.replace(b"key", b"\xffey", 1)) is not None
    assert entry_problem(batch.replace(b"val", b"\xffal", 1)) is not None


def test_a_topic_epoch_that_cannot_grow_is_refused() -> None:
    def producer(epoch: int) -> Frame:
        return Frame(make_command(pb.CommandProducer(topic="persistent://public/default/t", producer_id=1,
                                                     request_id=1, topic_epoch=epoch)))
    assert frame_problem(producer(2**63 - 1)) is None
    assert frame_problem(producer(2**63)) is not None
    assert frame_problem(producer(2**64 - 1)) is not None


def test_what_the_client_does_not_take_for_a_chunk_is_decoded_whole() -> None:
    garbage = b"\xff" * 40  # not an LZ4 block: LZ4_decompress_fast reads past it
    assert entry_problem(_entry(garbage, compression=pb.LZ4, uncompressed_size=1000, num_chunks_from_msg=1,
                                uuid="u")) is not None
    chunk = {"uuid": "u", "num_chunks_from_msg": 2, "chunk_id": 0, "total_chunk_msg_size": 80}
    assert entry_problem(_entry(garbage, compression=pb.LZ4, uncompressed_size=1000, **chunk)) is None
    assert entry_problem(_entry(garbage, num_messages_in_batch=100, **chunk)) is not None  # a chunk never is a batch
    for bad in ({"chunk_id": 2}, {"chunk_id": -1}, {"total_chunk_msg_size": 39}, {"uuid": ""},
                {"total_chunk_msg_size": CHUNKED_MESSAGE_BYTES_MAX + 1}, {"num_chunks_from_msg": 2**31 - 1}):
        assert entry_problem(_entry(garbage, **{**chunk, **bad})) is not None, bad


def _chunks(whole: bytes, pieces: int, codec: int = pb.LZ4, uncompressed_size: int = 0, uuid: str = "u",
            total: int | None = None) -> list[bytes]:
    size = -(-len(whole) // pieces)
    return [_entry(whole[i * size:(i + 1) * size], compression=codec, uncompressed_size=uncompressed_size,
                   uuid=uuid, num_chunks_from_msg=pieces, chunk_id=i,
                   total_chunk_msg_size=len(whole) if total is None else total) for i in range(pieces)]


def _door(entries: list[bytes], topic: str = "t", door: ChunkDoor | None = None) -> list[bool]:
    """Which of ``entries`` the door takes, in order."""
    door = door or ChunkDoor()
    assert all(may_be_chunk(entry) for entry in entries)
    return [door.problem(topic, entry) is None for entry in entries]


def test_the_chunks_of_one_message_are_taken_only_together() -> None:
    value = bytes(range(256)) * 20
    whole = compress(pb.LZ4, value)
    chunks = _chunks(whole, 3, uncompressed_size=len(value))
    assert _door(chunks) == [True, True, True]
    assert _door([chunks[0], chunks[1], chunks[1], chunks[2]]) == [True, True, True, True]  # a resend
    assert _door([chunks[1]]) == [False]  # without its chunk 0
    assert _door([chunks[0], chunks[2]]) == [True, False]  # out of order
    assert _door([chunks[0], chunks[1], chunks[2], chunks[2]]) == [True, True, True, True]
    door = ChunkDoor()
    assert _door(chunks[:2], "a", door) == [True, True]
    assert _door(chunks[:1], "b", door) == [True]  # another topic: another message
    # a chunk resent with other bytes, more bytes than the total, a total of its own
    other = _chunks(whole[:-1] + b"\0", 3, uncompressed_size=len(value))
    assert _door([*chunks, other[2]]) == [True, True, True, False]
    longer = _chunks(whole + b"x" * 900, 3, uncompressed_size=len(value), total=len(whole))
    assert _door([chunks[0], longer[1]]) == [True, False]
    own_total = _chunks(whole, 3, uncompressed_size=len(value), total=len(whole) + 1)
    assert _door([chunks[0], own_total[1]]) == [True, False]


def test_a_chunked_message_whose_whole_does_not_decode_loses_its_last_chunk() -> None:
    garbage = b"\xff" * 300  # LZ4_decompress_fast would read and write past its buffers
    assert _door(_chunks(garbage, 3, uncompressed_size=10_000)) == [True, True, False]
    snappy = compress(pb.SNAPPY, b"x" * 1000)  # declares 1000 bytes: the sink holds 10
    assert _door(_chunks(snappy, 2, pb.SNAPPY, uncompressed_size=10)) == [True, False]
    encrypted = _chunks(garbage, 2, uncompressed_size=10_000)
    sealed = [_entry(e[4 + _U32.unpack_from(e)[0]:], **_sealed_fields(e)) for e in encrypted]
    assert _door(sealed) == [True, True]  # sealed: the broker cannot open it


def _sealed_fields(entry: bytes) -> dict[str, object]:
    metadata = pb.MessageMetadata.FromString(entry[4:4 + _U32.unpack_from(entry)[0]])
    return {"compression": metadata.compression, "uncompressed_size": metadata.uncompressed_size,
            "uuid": metadata.uuid, "num_chunks_from_msg": metadata.num_chunks_from_msg,
            "chunk_id": metadata.chunk_id, "total_chunk_msg_size": metadata.total_chunk_msg_size,
            "encryption_keys": [pb.EncryptionKeys(key="k", value=b"sealed")]}


def test_an_entry_without_a_chunk_count_is_never_looked_up() -> None:
    assert not may_be_chunk(_entry(b"\xd8\x01"))  # the tag bytes in the payload do not count
