"""A batch whose slots are laid out alike is checked without walking it, and the verdict
on every batch body stays exactly ``read_slot``'s.

``api.wire.validate._alike_slots_fit`` accepts a batch body by comparing its slots'
bytes column by column with the first slot; whatever it does not accept is walked slot
by slot and, when in doubt, read with ``read_slot``. So a SEND's verdict is unchanged as
long as the column check never accepts what ``read_slot`` refuses: held here for intact,
damaged, truncated and miscounted bodies, and for the layouts a producer writes.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.wire import validate
from message.encoder import encode_batch, encode_slot
from message.entry import check_slot_count, read_slot
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb


def _read_slot_verdict(body: bytes, count: int) -> bool:
    """The reference: does every one of ``count`` slots of ``body`` read, its values
    fitting (``validate._slot_values_fit``: sequence id, event time, text)?"""
    try:
        check_slot_count(body, count)
        single, position = pb.SingleMessageMetadata(), 0
        for batch_index in range(count):
            position = read_slot(body, position, batch_index, single)
            if not validate._slot_values_fit(single):
                return False
    except MalformedEntryError:
        return False
    return True


def _check_slots_verdict(body: bytes, count: int) -> bool:
    """What a SEND's check says of the body now (fast paths and all)."""
    try:
        validate._check_slots(body, count)
    except MalformedEntryError:
        return False
    return True


@st.composite
def alike_bodies(draw: st.DrawFn) -> tuple[bytes, int, int, bool]:
    """A batch body of slots laid out alike (one value size; sequence ids and event times
    counting up, possibly across a varint length), its slot count, its stride, and
    whether every sequence id is below 2**63 and every event time below 2**42 (longer
    varints are never let vary: ``validate._VARYING_FIELDS``)."""
    count = draw(st.integers(1, 40))
    value_size = draw(st.integers(0, 30))
    first_sequence_id = draw(st.one_of(st.none(), st.integers(0, 1 << 20), st.integers(0, (1 << 64) - count)))
    event_time = draw(st.one_of(st.none(), st.integers(0, 1 << 45)))
    key = draw(st.one_of(st.none(), st.text(max_size=4)))
    properties = draw(st.lists(st.tuples(st.text(max_size=3), st.text(max_size=3)), max_size=2))
    body = bytearray()
    for index in range(count):
        single = pb.SingleMessageMetadata(payload_size=value_size)
        if first_sequence_id is not None:
            single.sequence_id = first_sequence_id + index
        if event_time is not None:
            single.event_time = event_time + index * 7
        if key is not None:
            single.partition_key = key
        for name, value in properties:
            single.properties.add(key=name, value=value)
        body += encode_slot(single, bytes([index % 256]) * value_size)
    first_size = struct.unpack_from(">I", body)[0]
    below = (first_sequence_id is None or first_sequence_id + count <= 1 << 63) and (
        event_time is None or event_time + count * 7 < 1 << 42)
    return bytes(body), count, 4 + first_size + value_size, below


@settings(max_examples=400, deadline=None)
@given(batch=alike_bodies(), flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(1, 255)), max_size=3),
       in_head=st.booleans(), cut=st.integers(0, 50), extra=st.integers(-2, 2))
def test_the_column_check_never_accepts_what_read_slot_refuses(
    batch: tuple[bytes, int, int, bool], flips: list[tuple[int, int]], in_head: bool, cut: int, extra: int,
) -> None:
    """Damage anywhere (often inside the slots' size fields and metadata, where the
    column check looks), truncation and a wrong count: accepted only if ``read_slot``
    reads every slot, and the SEND's verdict is exactly ``read_slot``'s."""
    body, count, stride, _ = batch
    damaged = bytearray(body)
    for where, mask in flips:
        if in_head:  # byte j of slot k, j inside the first slot's size field and metadata
            first_head = 4 + struct.unpack_from(">I", body)[0]
            where = (where % count) * stride + where % first_head
        if damaged:
            damaged[where % len(damaged)] ^= mask
    damaged_bytes = bytes(damaged[: len(damaged) - cut % 5 * (cut % 3 == 0)])
    claimed = max(1, count + extra)
    reference = _read_slot_verdict(damaged_bytes, claimed)
    assert not validate._alike_slots_fit(damaged_bytes, claimed) or reference
    assert _check_slots_verdict(damaged_bytes, claimed) == reference


@settings(max_examples=200, deadline=None)
@given(batch=alike_bodies())
def test_an_intact_alike_batch_takes_the_column_check(batch: tuple[bytes, int, int, bool]) -> None:
    """Slots of one value size whose sequence ids keep one varint length are accepted
    without the walk (the short path is the one producers of fixed-size values hit)."""
    body, count, stride, varying_fits = batch
    slots = [pb.SingleMessageMetadata() for _ in range(count)]
    position = 0
    for single in slots:
        position = read_slot(body, position, 0, single)
    in_range = all(single.sequence_id <= validate.SIGNED_64_MAX for single in slots)  # the door's value rule
    assert _read_slot_verdict(body, count) == in_range  # a sequence id from 2**63 on is refused
    if not in_range:
        return
    head = 4 + struct.unpack_from(">I", body)[0]
    if len(body) == count * stride and head <= validate._ALIKE_HEAD_BYTES_MAX and varying_fits:  # no varint grew
        assert validate._alike_slots_fit(body, count)


@given(sizes=st.lists(st.integers(0, 20), min_size=2, max_size=30).filter(lambda sizes: len(set(sizes)) > 1))
def test_values_of_different_sizes_are_walked_and_accepted(sizes: list[int]) -> None:
    entry_slots = [(pb.SingleMessageMetadata(sequence_id=index), b"v" * size) for index, size in enumerate(sizes)]
    body = b"".join(encode_slot(pb.SingleMessageMetadata(payload_size=len(value), sequence_id=single.sequence_id),
                                value) for single, value in entry_slots)
    assert not validate._alike_slots_fit(body, len(sizes))
    assert validate._slots_fit(body, len(sizes))
    entry = encode_batch(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), entry_slots, pb.NONE,
                         with_checksum=False)
    assert validate.entry_problem(entry) is None


def _slot(single: pb.SingleMessageMetadata, value: bytes) -> bytes:
    return encode_slot(single, value)


def test_a_slot_whose_sequence_id_varint_changes_shape_is_not_taken_as_alike() -> None:
    """The column check lets only the value bytes of a sequence id vary, never the
    continuation bits that give its length: here slot 1's varint ends one byte early and
    its metadata swallows a byte of its payload, which ``read_slot`` refuses."""
    value = b"x" * 4
    slots = [_slot(pb.SingleMessageMetadata(payload_size=4, sequence_id=300 + index), value) for index in range(10)]
    body = bytearray(b"".join(slots))
    stride = len(slots[0])
    sequence_id_at = stride + 4 + 2 + 1  # slot 1: size field, payload_size (2 bytes), tag 0x40
    assert body[sequence_id_at] & 0x80
    body[sequence_id_at] &= 0x7F  # the varint now ends here
    assert not _read_slot_verdict(bytes(body), 10)
    assert not validate._alike_slots_fit(bytes(body), 10)
    assert not _check_slots_verdict(bytes(body), 10)


def test_a_slot_with_another_payload_size_is_not_taken_as_alike() -> None:
    value = b"y" * 5
    slots = [_slot(pb.SingleMessageMetadata(payload_size=5, sequence_id=index), value) for index in range(10)]
    slots[6] = _slot(pb.SingleMessageMetadata(payload_size=6, sequence_id=6), b"y" * 6)[:-1]  # claims one byte more
    body = b"".join(slots)
    assert not validate._alike_slots_fit(body, 10)
    assert not _check_slots_verdict(body, 10) and not _read_slot_verdict(body, 10)


@settings(max_examples=100, deadline=None)
@given(first=st.sampled_from([100, 16_300, 2_097_100, (1 << 35) - 50]), count=st.integers(8, 300),
       value_size=st.integers(0, 12))
def test_a_batch_whose_sequence_ids_grow_a_varint_byte_is_checked_in_runs_without_the_walk(
    first: int, count: int, value_size: int,
) -> None:
    """Sequence ids crossing 128, 16,384, ... change the slots' length mid-batch: the
    check starts a new run there instead of walking the batch."""
    body = b"".join(encode_slot(pb.SingleMessageMetadata(payload_size=value_size, sequence_id=first + index),
                                b"v" * value_size) for index in range(count))
    walked: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validate, "_walked_slots_fit", lambda body, count, position=0: walked.append(count))
        assert validate._slots_fit(body, count)
    assert walked == []
    assert _read_slot_verdict(body, count) and _check_slots_verdict(body, count)
