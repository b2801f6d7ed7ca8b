"""Tombstone retention (``deleteRetentionMs``): young tombstones stay visible, old ones delete.

The pure algorithm takes the cut-off (``keep_tombstones_since_ms``); the runner computes it
from the topic's policy and its clock. Properties over generated streams whose entries carry
different publish times, against a model written here; then the runner end to end with a
fake clock, and the broker picking the policy (topic over namespace, default 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from compactor.local.algorithm import CompactedEntry, compact
from ledger.managed_ledger import Entry
from ledger.position import Position
from message.encoder import encode_batch, encode_entry
from message.entry import iter_messages, parse_entry
from message.proto import pulsar_api_pb2 as pb

KEYS = ("a", "b", "c")


@dataclass(frozen=True)
class Spec:
    key: str | None
    value: bytes | None  # None: a tombstone (null_value)


@dataclass(frozen=True)
class Generated:
    position: Position
    publish_time: int
    batched: bool
    messages: tuple[Spec, ...]


specs = st.builds(Spec, st.sampled_from((*KEYS, None)), st.one_of(st.none(), st.binary(min_size=1, max_size=4)))


@st.composite
def streams(draw: st.DrawFn) -> list[Generated]:
    count = draw(st.integers(0, 20))
    publish_time = draw(st.integers(0, 3))
    result = []
    for entry_id in range(count):
        publish_time += draw(st.integers(0, 2))  # publish times rise, with ties
        batched = draw(st.booleans())
        messages = tuple(draw(st.lists(specs, min_size=1, max_size=4 if batched else 1)))
        result.append(Generated(Position(1, entry_id), publish_time, batched, messages))
    return result


def _fields(spec: Spec) -> dict[str, object]:
    fields: dict[str, object] = {}
    if spec.key is not None:
        fields["partition_key"] = spec.key
    if spec.value is None:
        fields["null_value"] = True
    return fields


def encode(item: Generated) -> Entry:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=item.position.entry_id,
                                  publish_time=item.publish_time)
    if not item.batched:
        spec = item.messages[0]
        for name, value in _fields(spec).items():
            setattr(metadata, name, value)
        return Entry(item.position, encode_entry(metadata, spec.value or b"", with_checksum=False))
    slots = [(pb.SingleMessageMetadata(payload_size=len(s.value or b""), **_fields(s)), s.value or b"")  # type: ignore[arg-type]
             for s in item.messages]
    return Entry(item.position, encode_batch(metadata, slots, pb.NONE, with_checksum=False))


def model(stream: list[Generated], cutoff: int | None) -> dict[str, tuple[Position, bytes | None]]:
    """key -> (message id, value or None for a visible tombstone) after compaction."""
    latest: dict[str, tuple[Position, bytes | None]] = {}
    for item in stream:
        for index, spec in enumerate(item.messages):
            if spec.key is None:
                continue
            message_id = item.position.with_batch_index(index if item.batched else -1)
            young = cutoff is not None and item.publish_time >= cutoff
            if spec.value is None and not young:
                latest.pop(spec.key, None)
            else:
                latest[spec.key] = (message_id, spec.value)
    return latest


def visible(output: list[CompactedEntry]) -> dict[str, tuple[Position, bytes | None]]:
    """What a read-compacted reader sees: every message of the output, by key."""
    seen: dict[str, tuple[Position, bytes | None]] = {}
    for compacted in output:
        for message in iter_messages(parse_entry(compacted.data)):
            if message.compacted_out:
                continue
            assert message.key is not None and message.key not in seen  # once per key
            value = None if message.null_value else message.payload
            seen[message.key] = (compacted.position.with_batch_index(message.batch_index), value)
    return seen


@given(streams(), st.one_of(st.none(), st.integers(0, 45)))
def test_young_tombstones_stay_visible_and_old_ones_delete(stream: list[Generated], cutoff: int | None) -> None:
    output = compact([encode(item) for item in stream], keep_tombstones_since_ms=cutoff)
    assert visible(output) == model(stream, cutoff)


@given(streams(), st.integers(0, 45), st.integers(0, 10))
def test_a_later_run_with_a_later_cutoff_drops_what_aged(stream: list[Generated], cutoff: int, later: int) -> None:
    """Recompacting the output with a later cut-off equals compacting the input with it:
    a tombstone kept by the first run is dropped once it is older than the retention."""
    entries = [encode(item) for item in stream]
    first = compact(entries, keep_tombstones_since_ms=cutoff)
    again = compact([Entry(c.position, c.data) for c in first], keep_tombstones_since_ms=cutoff + later)
    assert visible(again) == visible(compact(entries, keep_tombstones_since_ms=cutoff + later))
    assert visible(again) == model(stream, cutoff + later)


@given(streams())
def test_without_retention_no_tombstone_survives(stream: list[Generated]) -> None:
    """``None`` is Pulsar's behaviour; a cut-off later than every entry is the same."""
    entries = [encode(item) for item in stream]
    output = compact(entries)
    assert all(value is not None for _, value in visible(output).values())
    assert visible(output) == visible(compact(entries, keep_tombstones_since_ms=10**6))


def test_a_young_tombstone_replaces_the_value_it_deletes() -> None:
    stream = [Generated(Position(1, 0), 10, False, (Spec("k", b"v"),)),
              Generated(Position(1, 1), 20, False, (Spec("k", None),))]
    entries = [encode(item) for item in stream]
    assert visible(compact(entries, keep_tombstones_since_ms=15)) == {"k": (Position(1, 1), None)}
    assert visible(compact(entries, keep_tombstones_since_ms=21)) == {}
    assert visible(compact(entries)) == {}
