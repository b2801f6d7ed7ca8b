"""Shared Hypothesis strategies: streams of entries for the compaction properties (P11).

A generated stream is a list of ``StreamEntry``: the entry bytes a producer (or the broker)
would have written, *and* what the generator put in them, so that a test can state the
expected result with a plain dict instead of parsing the bytes again. Streams are built
to make compaction's edge cases common rather than rare:

* keys come from a small alphabet (``KEYS``), so the same key is written again and
  again; ``""`` is a key like any other, and one key is not ASCII;
* values are often empty, and sometimes explicitly null (``null_value``): with a key,
  both are tombstones; about one message in six has no key at all, either with the field
  absent or with ``null_partition_key`` set;
* batches hold 1-5 slots with mixed keys, tombstones and key-less slots, under a random
  codec; now and then a slot is already ``compacted_out`` (a previous run dropped it)
  and the batch's own metadata carries a stray ``partition_key`` that must be ignored;
* server markers (``marker_type`` set) carry a key and a value that must be ignored;
* a quarter of the valid entries sit behind a broker-entry metadata block (0x0e02), which
  only a verbatim copy keeps;
* opaque entries cannot be decoded: random garbage, a batch whose body is too short, a
  keyed message whose compressed value is corrupt;
* chunked messages (``chunked_messages``): a value compressed whole, then split into 2-4
  chunks, each a non-batched entry with the message's key, uuid and chunk id. Their
  chunks are interleaved with the other entries and with each other (two producers), a
  uuid often comes again (a resend after a reconnect: a second instance), and some never
  complete (a producer died, or the cut of ``streams_with_cut`` falls inside one);
* positions strictly increase, entry ids leave gaps (as in a compacted ledger), and
  ledger ids jump by anything from 1 to 2**40.

``split_at`` and ``streams_with_cut`` cut a stream in two, for "compact A, append B".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from ledger.managed_ledger import Entry
from ledger.position import Position
from message.compression import compress
from message.encoder import encode_batch, encode_entry
from message.entry import BROKER_ENTRY_MAGIC, Chunk, iter_messages, parse_entry
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

__all__ = [
    "CODECS",
    "KEYS",
    "EntryKind",
    "MessageSpec",
    "StreamEntry",
    "batch_entries",
    "chunk_ends",
    "chunked_messages",
    "entries_of",
    "garbage",
    "marker_entries",
    "message_specs",
    "opaque_entries",
    "positions",
    "single_entries",
    "split_at",
    "stream_entries",
    "streams",
    "streams_with_cut",
]

KEYS = ("a", "b", "c", "", "ключ")
"""Few keys, so that they collide often. ``""`` is a key (``partition_key`` present)."""
CODECS = (pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY)

EntryKind = Literal["single", "batch", "marker", "opaque"]
Slots = tuple[tuple[int, "MessageSpec"], ...]
Draft = tuple[EntryKind, bytes, Slots, int]
"""An entry before it has a position: kind, bytes, live messages, batch size."""


@dataclass(frozen=True)
class MessageSpec:
    """One application message as the generator wrote it."""

    key: str | None
    """The compaction key; None for a key-less message."""
    value: bytes
    """The value (uncompressed)."""
    null_value: bool = False
    """Written as ``null_value`` (``send(None)``); the value is then empty."""
    null_key_flag: bool = False
    """Key-less written as ``null_partition_key=True`` rather than with the key absent."""
    chunk: Chunk | None = None  # which chunk, as message.entry reads it back
    """The chunk this message is; ``value`` is then its piece of the compressed whole."""

    @property
    def is_tombstone(self) -> bool:
        """Keyed, and empty or null: deletes its key. A chunk never is."""
        return self.key is not None and self.chunk is None and (self.null_value or self.value == b"")


@dataclass(frozen=True)
class StreamEntry:
    """One generated entry: its position, its bytes, and what they hold."""

    position: Position
    kind: EntryKind
    data: bytes
    messages: Slots = ()
    """(batch_index, message) of every live message: ``((-1, m),)`` for a single
    message, one per slot not already ``compacted_out`` for a batch, none for a marker
    or an opaque entry."""
    batch_size: int = 0
    """Slots in a batch, ``compacted_out`` ones included; 0 for any other kind."""

    def entry(self) -> Entry:
        return Entry(self.position, self.data)


def entries_of(stream: list[StreamEntry]) -> list[Entry]:
    """The ``Entry`` values the compactor reads."""
    return [item.entry() for item in stream]


def chunk_ends(stream: list[StreamEntry]) -> dict[Position, Position | None]:
    """For every chunk of ``stream``: the position of the last chunk that completes its
    instance (the first last chunk of its uuid at or after it), or None while pending."""
    ends: dict[Position, Position | None] = {}
    next_end: dict[str, Position] = {}
    for item in reversed(stream):
        for _, message in item.messages:
            if message.chunk is None:
                continue
            if message.chunk.is_last:
                next_end[message.chunk.uuid] = item.position
            ends[item.position] = next_end.get(message.chunk.uuid)
    return ends


def split_at(stream: list[StreamEntry], cut: int) -> tuple[list[StreamEntry], list[StreamEntry]]:
    """``stream[:cut], stream[cut:]``: a prefix compacted first, then the appended rest."""
    assert 0 <= cut <= len(stream)
    return stream[:cut], stream[cut:]


# --- messages -----------------------------------------------------------------------------

keys = st.sampled_from((*KEYS, None))
"""A key, or None about one time in six."""
values = st.one_of(st.just(b""), st.binary(min_size=1, max_size=8))


@st.composite
def message_specs(draw: st.DrawFn) -> MessageSpec:
    key = draw(keys)
    null_value = draw(st.integers(0, 7)) == 0
    value = b"" if null_value else draw(values)
    null_key_flag = key is None and draw(st.booleans())
    return MessageSpec(key, value, null_value, null_key_flag)


_messages = message_specs()


def _entry_metadata(**fields: Any) -> pb.MessageMetadata:
    return pb.MessageMetadata(
        producer_name="producer-1", sequence_id=7, publish_time=1_700_000_000_000, **fields
    )


def _key_fields(message: MessageSpec) -> dict[str, Any]:
    """Key and value flags shared by MessageMetadata and SingleMessageMetadata."""
    fields: dict[str, Any] = {}
    if message.key is not None:
        fields["partition_key"] = message.key
    elif message.null_key_flag:
        fields["null_partition_key"] = True
    if message.null_value:
        fields["null_value"] = True
    return fields


def broker_prefixed(draw: st.DrawFn, data: bytes) -> bytes:
    """``data``, or one time in four behind the 0x0e02 block a Pulsar broker may prepend.

    Only a verbatim copy keeps the block, so it tells "written verbatim" from "rewritten".
    """
    if draw(st.integers(0, 3)) != 0:
        return data
    block = pb.BrokerEntryMetadata(
        broker_timestamp=draw(st.integers(0, 2**41)), index=draw(st.integers(0, 99))
    ).SerializeToString()
    return BROKER_ENTRY_MAGIC + struct.pack(">I", len(block)) + block + data


# --- entries, without their position ------------------------------------------------------
# Each strategy below draws a ``Draft``; ``stream_entries`` hands out the positions after.


@st.composite
def single_entries(draw: st.DrawFn) -> Draft:
    """A non-batched message under a random codec, with or without the checksum prefix."""
    message = draw(_messages)
    codec = draw(st.sampled_from(CODECS))
    metadata = _entry_metadata(
        compression=codec, uncompressed_size=len(message.value), **_key_fields(message)
    )
    data = encode_entry(metadata, compress(codec, message.value), with_checksum=draw(st.booleans()))
    return "single", broker_prefixed(draw, data), ((-1, message),), 0


DROPPED = None
"""A batch slot that a previous compaction already emptied (``compacted_out``)."""
_batch_slots = st.lists(
    st.one_of(_messages, _messages, _messages, st.just(DROPPED)), min_size=1, max_size=5
)


@st.composite
def batch_entries(draw: st.DrawFn) -> Draft:
    """A batch of 1-5 slots; now and then a slot is already ``compacted_out``."""
    slots = draw(_batch_slots)
    encoded = []
    for slot in slots:
        if slot is DROPPED:
            encoded.append((pb.SingleMessageMetadata(payload_size=0, compacted_out=True), b""))
        else:
            single = pb.SingleMessageMetadata(payload_size=len(slot.value), **_key_fields(slot))
            encoded.append((single, slot.value))
    template = _entry_metadata()
    stray_key = draw(st.sampled_from((*KEYS, None)))
    if stray_key is not None:  # producers copy a key into the batch metadata: ignored
        template.partition_key = stray_key
    codec = draw(st.sampled_from(CODECS))
    data = encode_batch(template, encoded, codec, with_checksum=draw(st.booleans()))
    data = broker_prefixed(draw, data)
    live = tuple((index, slot) for index, slot in enumerate(slots) if slot is not DROPPED)
    return "batch", data, live, len(slots)


@st.composite
def marker_entries(draw: st.DrawFn) -> Draft:
    """A server marker that looks keyed and valued: it must still change nothing."""
    metadata = _entry_metadata(marker_type=draw(st.integers(0, 30)))
    key = draw(st.sampled_from((*KEYS, None)))
    if key is not None:
        metadata.partition_key = key
    payload = draw(st.binary(max_size=8))
    data = encode_entry(metadata, payload, with_checksum=False)
    return "marker", broker_prefixed(draw, data), (), 0


def _is_malformed(data: bytes) -> bool:
    try:
        list(iter_messages(parse_entry(data)))
    except MalformedEntryError:
        return True
    return False


garbage = st.binary(max_size=24).filter(_is_malformed)
"""Random bytes that are not an entry (almost all of them are not)."""


@st.composite
def opaque_entries(draw: st.DrawFn) -> Draft:
    """An entry that cannot be decoded: garbage, a short batch body, a corrupt value."""
    form = draw(st.sampled_from(("garbage", "short batch", "corrupt value")))
    if form == "garbage":
        data = draw(garbage)
    elif form == "short batch":  # fewer bytes than the smallest slots could take
        count = draw(st.integers(1, 5))
        metadata = _entry_metadata(
            partition_key=draw(st.sampled_from(KEYS)), num_messages_in_batch=count
        )
        data = encode_entry(metadata, draw(st.binary(max_size=6 * count - 1)), with_checksum=False)
    else:  # keyed, valued, and the value does not decompress
        codec = draw(st.sampled_from(CODECS[1:]))
        metadata = _entry_metadata(
            partition_key=draw(st.sampled_from(KEYS)), compression=codec, uncompressed_size=64
        )
        data = encode_entry(metadata, b"\xff" * draw(st.integers(0, 8)), with_checksum=False)
    assert _is_malformed(data), data
    return "opaque", data, (), 0


CHUNKED = {
    "producer-1-7": ("a", 2, pb.NONE),
    "producer-2-7": (None, 3, pb.LZ4),
    "producer-2-8": ("b", 4, pb.ZSTD),
    "producer-3-1": ("a", 3, pb.ZLIB),
}
"""uuid → key, chunks, codec of the chunked messages: few, so that a uuid often comes again
(a resend: a second instance), and two of them share a key."""


@st.composite
def chunked_messages(draw: st.DrawFn) -> list[Draft]:
    """The chunks of one chunked message, in order, as a client writes them: the value is
    compressed whole, then split; every chunk carries the message's key and uuid. Now and
    then only some chunks: a resend from a later chunk, or a message that never completes.
    """
    uuid = draw(st.sampled_from(sorted(CHUNKED)))
    key, chunks, codec = CHUNKED[uuid]
    value = uuid.encode() * 2
    whole = compress(codec, value)
    cuts = [len(whole) * index // chunks for index in range(chunks + 1)]
    pieces = [whole[cuts[index] : cuts[index + 1]] for index in range(chunks)]
    first = draw(st.sampled_from((0, 0, 0, 1)))
    last = draw(st.sampled_from((chunks, chunks, chunks, chunks - 1)))
    drafts: list[Draft] = []
    for chunk_id in range(min(first, chunks - 1), max(last, first + 1)):
        spec = MessageSpec(key, pieces[chunk_id], chunk=Chunk(uuid, chunk_id, chunks))
        metadata = _entry_metadata(
            compression=codec, uncompressed_size=len(value), uuid=uuid, chunk_id=chunk_id,
            num_chunks_from_msg=chunks, total_chunk_msg_size=len(whole), **_key_fields(spec),
        )
        data = encode_entry(metadata, pieces[chunk_id], with_checksum=draw(st.booleans()))
        drafts.append(("single", broker_prefixed(draw, data), ((-1, spec),), 0))
    return drafts


any_entry = st.one_of(
    single_entries(),
    single_entries(),
    single_entries(),
    batch_entries(),
    batch_entries(),
    marker_entries(),
    opaque_entries(),
)


# --- positions and streams ----------------------------------------------------------------


@st.composite
def positions(draw: st.DrawFn, count: int) -> list[Position]:
    """``count`` strictly increasing entry positions; ledger ids jump, entry ids leave gaps."""
    ledger_id = draw(st.integers(0, 10))
    entry_id = draw(st.integers(0, 3))
    result = [Position(ledger_id, entry_id)]
    for _ in range(count - 1):
        if draw(st.integers(0, 5)) == 0:  # next ledger: any larger id, entries from 0-2
            ledger_id += draw(st.one_of(st.integers(1, 3), st.integers(1, 2**40)))
            entry_id = draw(st.integers(0, 2))
        else:
            entry_id += draw(st.integers(1, 2))
        result.append(Position(ledger_id, entry_id))
    return result


def stream_entries(
    kinds: st.SearchStrategy[Draft] = any_entry, *, max_size: int = 30, chunked: bool = True
) -> st.SearchStrategy[list[StreamEntry]]:
    """Streams of entries of ``kinds`` (default: every kind), positions handed out in order;
    with ``chunked``, up to three chunked messages interleaved among them."""

    @st.composite
    def build(draw: st.DrawFn) -> list[StreamEntry]:
        drawn = draw(st.lists(kinds, max_size=max_size))
        if chunked:
            drawn = interleaved(draw, [drawn, *draw(st.lists(chunked_messages(), max_size=3))])
        if not drawn:
            return []
        places = draw(positions(len(drawn)))
        return [
            StreamEntry(position, kind, data, messages, batch_size)
            for position, (kind, data, messages, batch_size) in zip(places, drawn, strict=True)
        ]

    return build()


def interleaved(draw: st.DrawFn, sequences: list[list[Draft]]) -> list[Draft]:
    """The drafts of ``sequences`` merged in a drawn order, each sequence's order kept."""
    labels = [index for index, sequence in enumerate(sequences) for _ in sequence]
    taken = [iter(sequence) for sequence in sequences]
    return [next(taken[label]) for label in draw(st.permutations(labels))]


def streams(*, max_size: int = 30) -> st.SearchStrategy[list[StreamEntry]]:
    """Streams of every kind of entry."""
    return stream_entries(any_entry, max_size=max_size)


@st.composite
def streams_with_cut(draw: st.DrawFn, *, max_size: int = 30) -> tuple[list[StreamEntry], int]:
    """A stream and a point to cut it at (0..len), for ``split_at``."""
    stream = draw(streams(max_size=max_size))
    return stream, draw(st.integers(0, len(stream)))
