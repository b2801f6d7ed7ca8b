"""The pure compaction core (``compactor.local.algorithm``) against an obviously correct model.

The model (``reference``) reads the generator's own record of each entry (``StreamEntry``)
rather than the entry bytes, and keeps a plain dict ``key -> (message id, value)`` in
stream order. A chunked message is its key's value at its last chunk; ``chunk_ends`` says
for every chunk where its instance completes (None: pending, always kept). The output is read back with ``decode``, a parser written here from the
format in ``message/entry.py``'s docstring, so that neither side of a comparison
borrows the code under test.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.local import keymap
from compactor.local.algorithm import CompactedEntry, compact, phase_one, phase_two
from compactor.local.keymap import key_hash
from ledger.managed_ledger import Entry
from ledger.position import Position
from message.compression import compress, decompress
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.strategies import (
    CODECS,
    MessageSpec,
    StreamEntry,
    chunk_ends,
    entries_of,
    split_at,
    streams,
    streams_with_cut,
)

PROPERTY = settings(max_examples=100, deadline=None)
# Small enough that most generated streams merge the key map several times.
BUFFER_UPDATES_SMALL = 4


def compact_small_buffer(entries: list[Entry], *, retain_null_key: bool) -> list[CompactedEntry]:
    with mock.patch.object(keymap, "BUFFER_UPDATES_MIN", BUFFER_UPDATES_SMALL):
        return compact(entries, retain_null_key=retain_null_key)


# --- the model ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What the model says one entry of the output is."""

    source: StreamEntry
    keep: tuple[int, ...]
    """Batch indexes kept (``(-1,)`` for a non-batched survivor, ``()`` for opaque)."""


def latest_by_key(stream: list[StreamEntry]) -> dict[str, tuple[Position, MessageSpec]]:
    """Each live key's latest value: a message id, for a chunked value its last chunk's."""
    latest: dict[str, tuple[Position, MessageSpec]] = {}
    for item in stream:
        for batch_index, message in item.messages:
            if message.key is None or (message.chunk is not None and not message.chunk.is_last):
                continue
            if message.is_tombstone:
                latest.pop(message.key, None)
            else:
                latest[message.key] = (item.position.with_batch_index(batch_index), message)
    return latest


def chunk_kept(
    stream: list[StreamEntry], latest: dict[str, tuple[Position, MessageSpec]], retain_null_key: bool
) -> dict[Position, bool]:
    """Whether each chunk is written: pending, or its instance is its key's latest value."""
    keys = {item.position: message.key for item in stream for _, message in item.messages}
    latest_ids = {message_id for message_id, _ in latest.values()}
    kept = {}
    for position, end in chunk_ends(stream).items():
        if end is None:
            kept[position] = True
        elif keys[end] is None:
            kept[position] = retain_null_key
        else:
            kept[position] = end in latest_ids
    return kept


def pending_chunks(stream: list[StreamEntry]) -> set[Position]:
    return {position for position, end in chunk_ends(stream).items() if end is None}


def reference(stream: list[StreamEntry], *, retain_null_key: bool) -> list[Expected]:
    latest = latest_by_key(stream)
    kept_ids = {message_id for message_id, _ in latest.values()}
    chunks = chunk_kept(stream, latest, retain_null_key)
    result = []
    for item in stream:
        if item.kind == "opaque":
            result.append(Expected(item, ()))
            continue
        if item.position in chunks:
            if chunks[item.position]:
                result.append(Expected(item, (-1,)))
            continue
        keep = tuple(
            batch_index
            for batch_index, message in item.messages
            if (
                retain_null_key
                if message.key is None
                else item.position.with_batch_index(batch_index) in kept_ids
            )
        )
        if keep:
            result.append(Expected(item, keep))
    return result


# --- reading the output back, independently of message.entry --------------------------


@dataclass(frozen=True)
class Decoded:
    batch_index: int
    key: str | None
    value: bytes
    null_value: bool
    compacted_out: bool
    payload_size: int


def key_of(metadata: pb.MessageMetadata | pb.SingleMessageMetadata) -> str | None:
    if metadata.null_partition_key or not metadata.HasField("partition_key"):
        return None
    return metadata.partition_key


def decode(data: bytes) -> tuple[pb.MessageMetadata, list[Decoded], bool]:
    """(metadata, messages, has_checksum) of an entry compactd wrote or passed through."""
    if data[:2] == b"\x0e\x02":  # broker-entry metadata: u32 size, then skipped
        (size,) = struct.unpack_from(">I", data, 2)
        data = data[6 + size :]
    has_checksum = data[:2] == b"\x0e\x01"
    if has_checksum:
        data = data[6:]
    (size,) = struct.unpack_from(">I", data)
    metadata = pb.MessageMetadata.FromString(data[4 : 4 + size])
    if metadata.num_chunks_from_msg > 1:  # a chunk: a piece of the compressed whole
        message = Decoded(-1, key_of(metadata), data[4 + size :], False, False, len(data) - 4 - size)
        return metadata, [message], has_checksum
    payload = decompress(metadata.compression, data[4 + size :], metadata.uncompressed_size)
    if not metadata.HasField("num_messages_in_batch"):
        message = Decoded(-1, key_of(metadata), payload, metadata.null_value, False, len(payload))
        return metadata, [message], has_checksum
    messages, offset = [], 0
    for batch_index in range(metadata.num_messages_in_batch):
        (size,) = struct.unpack_from(">I", payload, offset)
        single = pb.SingleMessageMetadata.FromString(payload[offset + 4 : offset + 4 + size])
        offset += 4 + size
        value = payload[offset : offset + single.payload_size]
        offset += single.payload_size
        flags = (single.null_value, single.compacted_out, single.payload_size)
        messages.append(Decoded(batch_index, key_of(single), value, *flags))
    assert offset == len(payload)
    return metadata, messages, has_checksum


def surviving_messages(
    stream: list[StreamEntry], output: list[CompactedEntry]
) -> list[tuple[Position, Decoded]]:
    """Every message a reader of the output gets, opaque entries left out, in order."""
    opaque = {item.position for item in stream if item.kind == "opaque"}
    result = []
    for compacted in output:
        if compacted.position in opaque:
            continue
        _, messages, _ = decode(compacted.data)
        for message in messages:
            if not message.compacted_out:
                result.append((compacted.position.with_batch_index(message.batch_index), message))
    return result


def input_message_ids(stream: list[StreamEntry]) -> list[Position]:
    return [item.position.with_batch_index(index) for item in stream for index, _ in item.messages]


# --- properties ---------------------------------------------------------------------------


@PROPERTY
@given(streams(), st.booleans())
def test_the_latest_value_of_every_key_survives_once_and_whole(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    """A plain value once; a chunked value as all the chunks of its instance, in order.
    Pending chunks (their message not complete in the stream) are apart: always kept."""
    output = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    latest = latest_by_key(stream)
    ends = chunk_ends(stream)
    survivors: dict[str, list[tuple[Position, bytes]]] = {}
    for message_id, message in surviving_messages(stream, output):
        if message.key is not None and ends.get(message_id.entry_position(), message_id) is not None:
            survivors.setdefault(message.key, []).append((message_id, message.value))
    expected: dict[str, list[tuple[Position, bytes]]] = {}
    for key, (message_id, spec) in latest.items():
        if spec.chunk is None:
            expected[key] = [(message_id, spec.value)]
            continue
        expected[key] = [
            (item.position, item.messages[0][1].value)
            for item in stream
            if ends.get(item.position) == message_id
        ]
        assert [piece for _, piece in expected[key]][-1] == spec.value
    assert survivors == expected


@PROPERTY
@given(streams(), st.booleans())
def test_a_chunked_message_survives_with_all_its_chunks_or_none_and_pending_chunks_survive(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    output = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    written = {compacted.position for compacted in output}
    instances: dict[Position | None, set[bool]] = {}
    for position, end in chunk_ends(stream).items():
        instances.setdefault(end, set()).add(position in written)
        if end is None:
            assert position in written
        elif end not in written:
            assert position not in written  # dropped whole
    assert all(len(outcomes) == 1 for end, outcomes in instances.items() if end is not None)


@PROPERTY
@given(streams(), st.booleans())
def test_tombstoned_keys_are_gone_and_tombstones_never_survive(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    output = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    written = {m.key for item in stream for _, m in item.messages if m.key is not None}
    deleted = written - latest_by_key(stream).keys()
    pending = pending_chunks(stream)
    for message_id, message in surviving_messages(stream, output):
        assert message.key not in deleted or message_id in pending
        assert message.key is None or (message.value and not message.null_value), message


@PROPERTY
@given(streams(), st.booleans())
def test_keyless_messages_follow_retain_null_key(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    output = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    pending = pending_chunks(stream)
    keyless = [
        item.position.with_batch_index(index)
        for item in stream
        for index, message in item.messages
        if message.key is None and (retain_null_key or item.position in pending)
    ]
    kept = [
        message_id
        for message_id, message in surviving_messages(stream, output)
        if message.key is None
    ]
    assert kept == keyless


@PROPERTY
@given(streams(), st.booleans())
def test_order_and_message_ids_never_change(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    output = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    input_positions = [item.position for item in stream]
    output_positions = [compacted.position for compacted in output]
    assert output_positions == sorted(set(output_positions))
    assert set(output_positions) <= set(input_positions)
    ids = [message_id for message_id, _ in surviving_messages(stream, output)]
    assert ids == sorted(set(ids))
    assert set(ids) <= set(input_message_ids(stream))


@PROPERTY
@given(streams(), st.booleans())
def test_output_agrees_with_the_model_entry_by_entry(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    """Positions, verbatim bytes, batch sizes, surviving slots and message counts."""
    output = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    expected = reference(stream, retain_null_key=retain_null_key)
    assert [c.position for c in output] == [e.source.position for e in expected]
    for compacted, want in zip(output, expected, strict=True):
        source = want.source
        if source.kind != "batch":  # single or opaque: verbatim, one message
            assert (compacted.data, compacted.batch_size, compacted.surviving) == (
                source.data,
                0,
                (),
            )
            assert compacted.messages == 1
            continue
        assert compacted.batch_size == source.batch_size
        assert compacted.surviving == want.keep
        assert compacted.messages == len(want.keep)
        if want.keep == tuple(index for index, _ in source.messages):
            assert compacted.data == source.data  # nothing more to drop: verbatim
        else:
            check_rewritten_batch(source, compacted)


def check_rewritten_batch(source: StreamEntry, compacted: CompactedEntry) -> None:
    """Same metadata bar ``uncompressed_size``, same slots kept byte for byte, the rest empty."""
    before, old_slots, old_checksum = decode(source.data)
    after, new_slots, new_checksum = decode(compacted.data)
    assert new_checksum == old_checksum
    before.ClearField("uncompressed_size")
    after.ClearField("uncompressed_size")
    assert after == before
    assert [slot.batch_index for slot in new_slots] == list(range(source.batch_size))
    for old, new in zip(old_slots, new_slots, strict=True):
        if new.batch_index in compacted.surviving:
            assert new == old
        else:
            assert new.compacted_out
            assert (new.payload_size, new.value, new.key, new.null_value) == (0, b"", None, False)


@PROPERTY
@given(streams(), st.booleans())
def test_markers_never_survive_and_opaque_entries_survive_whole(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    output = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    by_position = {compacted.position: compacted for compacted in output}
    for item in stream:
        if item.kind == "marker":
            assert item.position not in by_position
        if item.kind == "opaque":
            assert by_position[item.position] == CompactedEntry(item.position, item.data)


@PROPERTY
@given(streams(), st.booleans())
def test_compacting_twice_equals_compacting_once(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    once = compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)
    twice = compact_small_buffer(
        [Entry(c.position, c.data) for c in once], retain_null_key=retain_null_key
    )
    assert twice == once


@PROPERTY
@given(streams_with_cut(), st.booleans())
def test_compacting_a_then_appending_b_equals_compacting_a_plus_b(
    stream_and_cut: tuple[list[StreamEntry], int], retain_null_key: bool
) -> None:
    stream, cut = stream_and_cut
    head, tail = split_at(stream, cut)
    compacted_head = compact_small_buffer(entries_of(head), retain_null_key=retain_null_key)
    incremental = compact_small_buffer(
        [Entry(c.position, c.data) for c in compacted_head] + entries_of(tail),
        retain_null_key=retain_null_key,
    )
    assert incremental == compact_small_buffer(entries_of(stream), retain_null_key=retain_null_key)


@PROPERTY
@given(streams())
def test_phase_one_counts_and_maps_what_it_read(stream: list[StreamEntry]) -> None:
    with mock.patch.object(keymap, "BUFFER_UPDATES_MIN", BUFFER_UPDATES_SMALL):
        result = phase_one(entries_of(stream))
    assert result.entries_read == len(stream)
    assert result.bytes_read == sum(len(item.data) for item in stream)
    assert result.markers == sum(item.kind == "marker" for item in stream)
    assert result.opaque_entries == sum(item.kind == "opaque" for item in stream)
    assert result.messages_read == sum(len(item.messages) for item in stream)
    assert result.last_position == (stream[-1].position if stream else None)
    latest = latest_by_key(stream)
    assert len(result.key_map) == len(latest)
    for key in {*latest, "a", "b", "c", "", "ключ", "never written"}:
        packed = result.key_map.get(key_hash(key))
        want = latest.get(key)
        assert (packed is None) == (want is None)
        if want is not None:
            assert packed is not None
            assert result.packer.unpack(packed) == want[0]


@PROPERTY
@given(streams(), st.booleans())
def test_each_phase_reads_its_stream_once_as_an_iterator(
    stream: list[StreamEntry], retain_null_key: bool
) -> None:
    """The runner reads the stream once per phase, from storage, as an iterator."""
    result = phase_one(iter(entries_of(stream)), retain_null_key=retain_null_key)
    output = phase_two(iter(entries_of(stream)), result, retain_null_key=retain_null_key)
    assert list(output) == compact(entries_of(stream), retain_null_key=retain_null_key)


# --- examples -----------------------------------------------------------------------------


def metadata(**fields: Any) -> pb.MessageMetadata:
    return pb.MessageMetadata(
        producer_name="producer-1", sequence_id=7, publish_time=1_700_000_000_000, **fields
    )


def single(
    key: str | None, value: bytes, codec: pb.CompressionType = pb.NONE, **fields: Any
) -> bytes:
    if key is not None:
        fields["partition_key"] = key
    meta = metadata(compression=codec, uncompressed_size=len(value), **fields)
    return encode_entry(meta, compress(codec, value), with_checksum=False)


def batch(
    *slots: tuple[str | None, bytes],
    codec: pb.CompressionType = pb.NONE,
    with_checksum: bool = False,
) -> bytes:
    encoded = []
    for key, value in slots:
        single_metadata = pb.SingleMessageMetadata(payload_size=len(value))
        if key is not None:
            single_metadata.partition_key = key
        encoded.append((single_metadata, value))
    return encode_batch(metadata(), encoded, codec, with_checksum=with_checksum)


def at(entry_id: int, data: bytes, ledger_id: int = 3) -> Entry:
    return Entry(Position(ledger_id, entry_id), data)


def test_survivors_keep_their_original_order_not_key_order() -> None:
    """Pulsar's example: c1, a1, b1, a2 compacts to c1, b1, a2."""
    entries = [
        at(0, single("c", b"1")),
        at(1, single("a", b"1")),
        at(2, single("b", b"1")),
        at(3, single("a", b"2")),
    ]
    assert compact(entries) == [
        CompactedEntry(e.position, e.data) for e in (entries[0], entries[2], entries[3])
    ]


def test_nothing_in_nothing_out() -> None:
    result = phase_one([])
    assert (result.entries_read, result.last_position, len(result.key_map)) == (0, None, 0)
    assert compact([]) == []


def test_a_tombstone_deletes_earlier_values_and_a_later_value_revives_the_key() -> None:
    entries = [
        at(0, single("k", b"1")),
        at(1, single("k", b"")),
        at(2, single("j", b"1")),
        at(3, single("j", b"", null_value=True)),
        at(4, single("k", b"2")),
    ]
    assert compact(entries) == [CompactedEntry(entries[4].position, entries[4].data)]


def test_an_explicit_null_key_is_keyless_even_with_a_stale_key_field() -> None:
    data = single("k", b"v", null_partition_key=True)
    entries = [at(0, single("k", b"1")), at(1, data)]
    assert compact(entries) == [CompactedEntry(entries[0].position, entries[0].data)]
    assert compact(entries, retain_null_key=True) == [
        CompactedEntry(e.position, e.data) for e in entries
    ]


def test_a_keyed_marker_changes_nothing() -> None:
    marker = encode_entry(
        metadata(marker_type=1, partition_key="k"), b"\x00" * 4, with_checksum=False
    )
    entries = [at(0, single("k", b"1")), at(1, marker)]
    assert compact(entries) == [CompactedEntry(entries[0].position, entries[0].data)]
    assert phase_one(entries).markers == 1


def test_a_marker_never_survives_even_if_its_payload_does_not_decode() -> None:
    """message.py: "check ``is_marker`` first and skip it"; markers carry server data."""
    marker = encode_entry(
        metadata(marker_type=1, compression=pb.LZ4, uncompressed_size=10),
        b"\xff\xff",
        with_checksum=False,
    )
    entries = [at(0, single("k", b"1")), at(1, marker)]
    assert phase_one(entries).markers == 1
    assert compact(entries) == [CompactedEntry(entries[0].position, entries[0].data)]


def test_garbage_survives_whole_and_does_not_stop_the_run() -> None:
    entries = [
        at(0, single("k", b"1")),
        at(1, b"\x00\x01garbage"),
        at(2, b""),
        at(3, single("k", b"2")),
    ]
    result = phase_one(entries)
    assert (result.opaque_entries, result.messages_read, len(result.key_map)) == (2, 2, 1)
    assert compact(entries) == [CompactedEntry(e.position, e.data) for e in entries[1:]]


def test_an_undecodable_keyed_value_survives_whole_and_does_not_touch_its_key() -> None:
    corrupt = encode_entry(
        metadata(partition_key="k", compression=pb.ZLIB, uncompressed_size=3),
        b"no",
        with_checksum=False,
    )
    entries = [at(0, single("k", b"1")), at(1, corrupt)]
    assert compact(entries) == [CompactedEntry(e.position, e.data) for e in entries]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("with_checksum", [False, True])
def test_a_rewritten_batch_keeps_codec_checksum_and_slot_numbers(
    codec: pb.CompressionType, with_checksum: bool
) -> None:
    data = batch(
        ("a", b"old"),
        (None, b"x"),
        ("b", b"1"),
        ("a", b"new"),
        codec=codec,
        with_checksum=with_checksum,
    )
    [compacted] = compact([at(0, data)])
    assert (compacted.batch_size, compacted.surviving, compacted.messages) == (4, (2, 3), 2)
    meta, slots, has_checksum = decode(compacted.data)
    assert (meta.compression, meta.num_messages_in_batch, has_checksum) == (codec, 4, with_checksum)
    assert [(s.key, s.value, s.compacted_out) for s in slots] == [
        (None, b"", True),
        (None, b"", True),
        ("b", b"1", False),
        ("a", b"new", False),
    ]
    [again] = compact([at(0, data)], retain_null_key=True)
    assert again.surviving == (1, 2, 3)


def test_a_batch_with_no_survivor_is_not_written_and_a_full_one_is_verbatim() -> None:
    dead = batch(("a", b"1"), ("b", b"1"), (None, b"x"))
    full = batch(("c", b"1"), ("a", b"2"))
    entries = [at(0, dead), at(1, single("b", b"")), at(2, full)]
    assert compact(entries) == [CompactedEntry(entries[2].position, full, 2, (0, 1))]


def test_verbatim_means_byte_for_byte_even_behind_a_broker_entry_block() -> None:
    """A batch with nothing more to drop is copied, not re-encoded (which would drop 0x0e02)."""
    block = pb.BrokerEntryMetadata(broker_timestamp=5, index=9).SerializeToString()
    prefix = b"\x0e\x02" + struct.pack(">I", len(block)) + block
    earlier = batch(("a", b"1"), ("b", b"1"), codec=pb.ZSTD, with_checksum=True)
    [dropped_once] = compact([at(0, earlier), at(1, single("a", b"2"))])[:1]
    full = prefix + dropped_once.data  # slot 0 already compacted_out, slot 1 still latest
    entries = [at(0, full), at(1, prefix + single("a", b"2"))]
    assert compact(entries) == [
        CompactedEntry(Position(3, 0), full, 2, (1,)),
        CompactedEntry(Position(3, 1), entries[1].data),
    ]


def test_messages_counts_what_a_reader_gets() -> None:
    assert CompactedEntry(Position(1, 0), b"x").messages == 1
    assert CompactedEntry(Position(1, 0), b"x", 5, (0, 4)).messages == 2


def test_an_encrypted_batch_survives_or_dies_whole_by_its_entry_key() -> None:
    sealed = encode_entry(
        metadata(
            partition_key="k",
            num_messages_in_batch=3,
            uncompressed_size=40,
            encryption_keys=[pb.EncryptionKeys(key="app", value=b"secret")],
        ),
        b"ciphertext",
        with_checksum=False,
    )
    assert compact([at(0, sealed)]) == [CompactedEntry(Position(3, 0), sealed)]
    assert compact([at(0, sealed), at(1, single("k", b"2"))]) == [
        CompactedEntry(Position(3, 1), single("k", b"2"))
    ]


def test_ledger_boundaries_do_not_confuse_positions() -> None:
    """Same entry ids in different ledgers are different messages."""
    entries = [
        at(0, single("k", b"1"), ledger_id=5),
        at(0, single("j", b"1"), ledger_id=2**40),
        at(1, single("k", b"2"), ledger_id=2**40),
    ]
    assert [c.position for c in compact(entries)] == [Position(2**40, 0), Position(2**40, 1)]


def test_phase_one_refuses_entries_out_of_order() -> None:
    with pytest.raises(AssertionError, match="out of order"):
        phase_one([at(1, single("k", b"1")), at(1, single("k", b"2"))])
