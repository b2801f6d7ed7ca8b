"""The phases' lean decoding (``compactor.local.scan``) against the reference reader, as an oracle.

``iter_messages`` builds complete ``Message`` values and stays the reference: for every
generated entry (the shared streams, encrypted entries, and any of those corrupted at
random), ``scan_entry`` must say what the reference says. The phases built on the scan are
then compared with the Message-based phases they replaced, kept below as
``reference_phase_one`` and ``reference_phase_two`` (a ``searchsorted`` per message,
``rewrite_batch`` splitting the batch again): same key map, same counts, same output bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.local import keymap
from compactor.local.algorithm import CompactedEntry, PhaseOneResult, phase_one, phase_two
from compactor.local.keymap import (
    AscendingLookup,
    KeyMap,
    KeyMapLimitError,
    PositionPacker,
    key_hash,
)
from compactor.local.scan import EntryKind, EntryScan, scan_entry
from ledger.managed_ledger import Entry
from ledger.position import Position
from message import compression
from message.compression import compress, decompress
from message.encoder import encode_entry, rewrite_batch
from message.entry import (
    Chunk,
    batch_slots,
    is_batch,
    is_encrypted,
    is_marker,
    iter_messages,
    parse_entry,
)
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb
from tests.strategies import (
    CODECS,
    KEYS,
    Draft,
    batch_entries,
    chunked_messages,
    entries_of,
    marker_entries,
    message_specs,
    opaque_entries,
    single_entries,
    stream_entries,
)

PROPERTY = settings(max_examples=300, deadline=None)

# --- more entries than the shared streams hold -------------------------------------------


@st.composite
def encrypted_entries(draw: st.DrawFn) -> Draft:
    """A sealed entry, batched or not, with or without ``uncompressed_size``."""
    message = draw(message_specs())
    fields: dict[str, Any] = {"null_value": message.null_value}
    if message.key is not None:
        fields["partition_key"] = message.key
    elif message.null_key_flag:
        fields["null_partition_key"] = True
    if draw(st.booleans()):
        fields["uncompressed_size"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        fields["num_messages_in_batch"] = draw(st.integers(1, 4))
    metadata = _metadata(
        compression=draw(st.sampled_from(CODECS)),
        encryption_keys=[pb.EncryptionKeys(key="app", value=b"secret")],
        **fields,
    )
    payload = draw(st.binary(max_size=4))  # sealed: may even be empty
    return "single", encode_entry(metadata, payload, with_checksum=draw(st.booleans())), (), 0


def _metadata(**fields: Any) -> pb.MessageMetadata:
    return pb.MessageMetadata(
        producer_name="producer-1", sequence_id=7, publish_time=1_700_000_000_000, **fields
    )


def _key_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Any mix of key, null-key flag and null-value flag, even ones no client writes."""
    fields: dict[str, Any] = {
        "null_partition_key": draw(st.booleans()),
        "null_value": draw(st.booleans()),
    }
    key = draw(st.sampled_from((*KEYS, None)))
    if key is not None:
        fields["partition_key"] = key
    return fields


@st.composite
def odd_single_entries(draw: st.DrawFn) -> Draft:
    """Non-batched entries with null values that carry bytes, and for NONE (which the
    clients do not check) an ``uncompressed_size`` that is wrong."""
    codec = draw(st.sampled_from(CODECS))
    value = draw(st.binary(max_size=3))
    size = draw(st.integers(0, 3)) if codec == pb.NONE else len(value)
    metadata = _metadata(compression=codec, uncompressed_size=size, **_key_fields(draw))
    return "single", encode_entry(metadata, compress(codec, value), with_checksum=False), (), 0


@st.composite
def odd_batch_entries(draw: st.DrawFn) -> Draft:
    """Batches with keyed dropped slots, null values that carry bytes, properties missing
    a required field, trailing bytes, or a slot count that does not match the body."""
    slots = []
    for _ in range(draw(st.integers(1, 4))):
        single = pb.SingleMessageMetadata(
            payload_size=0, compacted_out=draw(st.booleans()), **_key_fields(draw)
        )
        if draw(st.integers(0, 4)) == 0:
            single.properties.add(key="p")  # no value: not initialized
        value = draw(st.binary(max_size=3))
        single.payload_size = len(value)
        raw = single.SerializePartialToString()
        slots.append(struct.pack(">I", len(raw)) + raw + value)
    body = b"".join(slots) + draw(st.binary(max_size=3))
    count = len(slots) + draw(st.sampled_from((0, 0, 0, -1, 1)))
    codec = draw(st.sampled_from(CODECS))
    metadata = _metadata(
        compression=codec, uncompressed_size=len(body), num_messages_in_batch=count
    )
    return "batch", encode_entry(metadata, compress(codec, body), with_checksum=False), (), 0


@st.composite
def odd_chunk_entries(draw: st.DrawFn) -> Draft:
    """Chunk metadata on any entry: batched, encrypted, without a uuid, a chunk id out of
    range, or ``num_chunks_from_msg`` 0 or 1 (not a chunk), over any payload."""
    fields: dict[str, Any] = {"num_chunks_from_msg": draw(st.integers(0, 4))}
    if draw(st.booleans()):
        fields["uuid"] = draw(st.sampled_from(("p-1", "", "ключ")))
    if draw(st.booleans()):
        fields["chunk_id"] = draw(st.integers(0, 5))
    if draw(st.booleans()):
        fields["num_messages_in_batch"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        fields["encryption_keys"] = [pb.EncryptionKeys(key="app", value=b"secret")]
    codec = draw(st.sampled_from(CODECS))
    metadata = _metadata(compression=codec, uncompressed_size=draw(st.integers(0, 9)), **fields, **_key_fields(draw))
    payload = draw(st.binary(max_size=6))
    return "single", encode_entry(metadata, payload, with_checksum=draw(st.booleans())), (), 0


unchunked_entries = st.one_of(
    single_entries(),
    batch_entries(),
    marker_entries(),
    opaque_entries(),
    encrypted_entries(),
    odd_single_entries(),
    odd_batch_entries(),
)
valid_entries = st.one_of(unchunked_entries, odd_chunk_entries(), chunked_messages().flatmap(st.sampled_from))


@st.composite
def corrupted_entries(draw: st.DrawFn, valid: st.SearchStrategy[Draft] = valid_entries) -> Draft:
    """A valid entry with one byte changed, inserted or removed, or cut short."""
    _, data, _, _ = draw(valid)
    if not data:
        return "opaque", data, (), 0
    at = draw(st.integers(0, len(data) - 1))
    form = draw(st.sampled_from(("set", "insert", "delete", "truncate")))
    if form == "set":
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    elif form == "insert":
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at:]
    elif form == "delete":
        data = data[:at] + data[at + 1 :]
    else:
        data = data[:at]
    return "opaque", data, (), 0  # kind and messages unused: the reference decides


any_entries = st.one_of(valid_entries, corrupted_entries())
# The Message-based phases below predate chunks (their semantics are checked against the
# model in test_algorithm.py): the phases are compared over entries without chunks.
any_unchunked_entries = st.one_of(unchunked_entries, corrupted_entries(unchunked_entries))


# --- the reference --------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What a reader says of one entry, in a form both readers can be put into."""

    kind: EntryKind
    messages: tuple[tuple[int, str | None, bool], ...] = ()
    batch_size: int = 0
    slots: tuple[bytes, ...] = ()
    metadata: pb.MessageMetadata | None = None
    has_checksum: bool = False
    chunk: Chunk | None = None


def reference_seen(data: bytes) -> Seen:
    """The reference reading: ``parse_entry`` and ``iter_messages``."""
    try:
        parsed = parse_entry(data)
        if is_marker(parsed.metadata):
            return Seen("marker")
        messages = list(iter_messages(parsed))
    except MalformedEntryError:
        return Seen("opaque")
    live = tuple((m.batch_index, m.key, m.is_tombstone) for m in messages if not m.compacted_out)
    if messages[0].chunk is not None:
        return Seen("single", live, chunk=messages[0].chunk)
    if not is_batch(parsed.metadata) or is_encrypted(parsed.metadata):
        return Seen("single", live)
    slots = tuple(slot.slot_bytes for slot in batch_slots(parsed))
    return Seen(
        "batch", live, len(messages), slots, parsed.metadata, parsed.has_checksum
    )


def scanned_seen(scan: EntryScan) -> Seen:
    if scan.batch is None:
        return Seen(scan.kind, scan.messages, scan.batch_size, chunk=scan.chunk)
    batch = scan.batch
    return Seen(
        scan.kind, scan.messages, scan.batch_size, tuple(batch.slots()), batch.metadata,
        batch.has_checksum,
    )


def reference_phase_one(entries: list[Entry]) -> PhaseOneResult:
    """Phase one as it was, over complete ``Message`` values."""
    result = PhaseOneResult()
    for entry in entries:
        result.last_position = entry.position
        result.entries_read += 1
        result.bytes_read += len(entry.data)
        seen = reference_seen(entry.data)
        result.opaque_entries += seen.kind == "opaque"
        result.markers += seen.kind == "marker"
        result.messages_read += len(seen.messages)
        for batch_index, key, tombstone in seen.messages:
            if key is None:
                continue
            if tombstone:
                result.key_map.delete(key_hash(key))
            else:
                position = entry.position.with_batch_index(batch_index)
                result.key_map.put(key_hash(key), result.packer.pack(position))
    return result


def reference_phase_two(
    entries: list[Entry], result: PhaseOneResult, retain_null_key: bool
) -> list[CompactedEntry]:
    """Phase two as it was: a binary search per message, batches split twice."""
    retained = result.key_map.sorted_positions()

    def survives(position: Position, key: str | None, tombstone: bool) -> bool:
        if tombstone:
            return False
        if key is None:
            return retain_null_key
        packed = result.packer.pack_known(position)
        if packed is None:
            return False
        index = int(np.searchsorted(retained, np.uint64(packed)))
        return index < len(retained) and int(retained[index]) == packed

    output = []
    for entry in entries:
        seen = reference_seen(entry.data)
        if seen.kind == "opaque":
            output.append(CompactedEntry(entry.position, entry.data))
            continue
        keep = [
            index
            for index, key, tombstone in seen.messages
            if survives(entry.position.with_batch_index(index), key, tombstone)
        ]
        if not keep:
            continue
        if seen.kind == "single":
            output.append(CompactedEntry(entry.position, entry.data))
            continue
        data = entry.data
        if len(keep) < len(seen.messages):
            data = rewrite_batch(parse_entry(entry.data), set(keep))
        output.append(CompactedEntry(entry.position, data, seen.batch_size, tuple(keep)))
    return output


def key_map_view(result: PhaseOneResult) -> tuple[Any, ...]:
    """The key map as positions: independent of how each side packed them."""
    key_map, packer = result.key_map, result.packer
    latest = {key: key_map.get(key_hash(key)) for key in (*KEYS, "never written")}
    return (
        [packer.unpack(packed) for packed in key_map.sorted_positions().tolist()],
        {key: None if packed is None else packer.unpack(packed) for key, packed in latest.items()},
        key_map.merges,
        key_map.nbytes,
    )


def counts(result: PhaseOneResult) -> tuple[Any, ...]:
    return (
        result.entries_read, result.messages_read, result.bytes_read, result.markers,
        result.opaque_entries, result.last_position,
    )


# --- agreement ------------------------------------------------------------------------------


@PROPERTY
@given(any_entries)
def test_scan_agrees_with_the_reference_reader(draft: Draft) -> None:
    _, data, _, _ = draft
    assert scanned_seen(scan_entry(data)) == reference_seen(data)


@PROPERTY
@given(stream_entries(any_unchunked_entries, chunked=False), st.booleans(), st.sampled_from((1, 4, 1 << 16)))
def test_phases_agree_with_the_message_based_phases(
    stream: list[Any], retain_null_key: bool, buffer_updates: int
) -> None:
    entries = entries_of(stream)
    with mock.patch.object(keymap, "BUFFER_UPDATES_MIN", buffer_updates):
        expected = reference_phase_one(entries)
        result = phase_one(entries)
    assert counts(result) == counts(expected)
    assert key_map_view(result) == key_map_view(expected)
    with mock.patch.object(keymap, "_MEMBERSHIP_CHUNK_POSITIONS", 2):
        survivors = list(phase_two(entries, result, retain_null_key=retain_null_key))
    assert survivors == reference_phase_two(entries, expected, retain_null_key)


@given(
    st.lists(st.integers(0, 2**64 - 2), unique=True).map(sorted),
    st.lists(st.integers(0, 2**64 - 2)).map(sorted),
    st.integers(1, 5),
)
def test_ascending_lookup_agrees_with_a_set(
    positions: list[int], questions: list[int], chunk_positions: int
) -> None:
    with mock.patch.object(keymap, "_MEMBERSHIP_CHUNK_POSITIONS", chunk_positions):
        lookup = AscendingLookup(np.array(positions, dtype=np.uint64))
        answers = [lookup.contains(question) for question in questions]
    assert answers == [question in set(positions) for question in questions]


@given(
    st.lists(st.integers(0, 64), unique=True).map(sorted),
    st.lists(st.tuples(st.integers(0, 64), st.integers(0, 3), st.booleans())).map(sorted),
    st.integers(1, 5),
)
def test_ascending_lookup_answers_ranges_and_members_mixed_as_a_set_would(
    positions: list[int], questions: list[tuple[int, int, bool]], chunk_positions: int
) -> None:
    """``any_in(start, stop)`` and ``contains`` share one walk, as phase two mixes them."""
    with mock.patch.object(keymap, "_MEMBERSHIP_CHUNK_POSITIONS", chunk_positions):
        lookup = AscendingLookup(np.array(positions, dtype=np.uint64))
        answers = [
            lookup.any_in(start, start + width) if is_range else lookup.contains(start)
            for start, width, is_range in questions
        ]
    members = set(positions)
    assert answers == [
        any(start <= position < start + width for position in members) if is_range else start in members
        for start, width, is_range in questions
    ]


def test_ascending_lookup_refuses_a_question_below_the_last() -> None:
    lookup = AscendingLookup(np.array([1, 5], dtype=np.uint64))
    assert lookup.contains(5)
    with pytest.raises(AssertionError):
        lookup.contains(4)


@given(
    st.integers(0, 2**40),
    st.integers(-1, 2**30 + 1),
    st.integers(-2, 2**14),
)
def test_packing_an_entry_then_a_slot_equals_packing_the_position(
    ledger_id: int, entry_id: int, batch_index: int
) -> None:
    position = Position(ledger_id, entry_id, batch_index)

    def outcome(pack: Any) -> int | str:
        try:
            return int(pack(PositionPacker()))
        except KeyMapLimitError as error:
            return str(error)

    whole = outcome(lambda packer: packer.pack(position))
    split = outcome(lambda packer: packer.pack_slot(packer.pack_entry(position), batch_index))
    assert split == whole


@pytest.mark.parametrize("entry_id", [2**30 - 1, 2**30])
@pytest.mark.parametrize("key", ["k", None])
def test_a_position_that_does_not_fit_fails_only_where_a_value_is_put(
    entry_id: int, key: str | None
) -> None:
    fields = {} if key is None else {"partition_key": key}
    data = encode_entry(
        pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0, **fields),
        b"value",
        with_checksum=False,
    )
    entries = [Entry(Position(3, entry_id), data)]
    if key is not None and entry_id >= 2**30:
        for phase in (phase_one, reference_phase_one):
            with pytest.raises(KeyMapLimitError, match="entry id"):
                phase(entries)
        return
    assert counts(phase_one(entries)) == counts(reference_phase_one(entries))


def test_the_key_map_merges_exactly_when_its_threshold_says() -> None:
    """The cached threshold changes nothing: merge points follow ``max(MIN, map / 4)``."""
    updates_min = 4
    live: set[str] = set()
    merged_keys = waiting = merges = 0
    with mock.patch.object(keymap, "BUFFER_UPDATES_MIN", updates_min):
        key_map = KeyMap()
        for step in range(3_000):
            if step % 5 == 4:
                key_map.delete(key_hash(str(step - 1)))
                live.discard(str(step - 1))
            else:
                key_map.put(key_hash(str(step)), step)
                live.add(str(step))
            waiting += 1
            if waiting >= max(updates_min, merged_keys // 4):
                merged_keys, waiting, merges = len(live), 0, merges + 1
            assert key_map.merges == merges, step


@PROPERTY
@given(
    st.lists(
        st.tuples(st.binary(max_size=40), st.integers(0, 3), st.integers(0, 255), st.booleans()),
        max_size=6,
    )
)
def test_a_reused_zstd_decompressor_decodes_as_a_fresh_one(
    cases: list[tuple[bytes, int, int, bool]],
) -> None:
    """Each thread keeps one decompressor; a failed call must not change the next one.

    Only the outcome is compared: on some corrupt frames the library names a different
    first error (data corruption rather than a full buffer) once a context has been used.
    """
    frames = []
    for value, cut, byte, corrupt in cases:
        frame = compress(pb.ZSTD, value)
        if corrupt:
            at = byte % len(frame)
            frame = frame[:at] + bytes([byte]) + frame[at + 1 :]
        frames.append((frame[: len(frame) - cut], len(value)))

    def outcomes() -> list[bytes | None]:
        results: list[bytes | None] = []
        for frame, size in frames:
            try:
                results.append(decompress(pb.ZSTD, frame, size))
            except MalformedEntryError:
                results.append(None)
        return results

    reused = outcomes()
    with mock.patch.object(compression, "_zstd_decompressor", zstandard.ZstdDecompressor):
        assert reused == outcomes()
