"""Chunked messages through compaction runs (``compactor.local.chunks``), on a real managed ledger.

The phases' rules are checked against the model over generated streams in
``test_algorithm.py``; here, whole runs: a chunked message straddling a run's stop marker
reaches a read-compacted reader whole (compacted view, then raw tail) and is decided on
whole by the next run; one that never completes is kept by every run; the state phase one
keeps for chunks grows with chunked messages, not with keys.
"""

from __future__ import annotations

import pytest

from compactor.local.algorithm import CompactedEntry, phase_one
from compactor.local.chunks import ChunkedMessages
from compactor.runs.runner import Compactor
from compactor.view.reader import CompactedReader
from compactor.view.topic import CompactedTopic
from cursor import CursorStore, ManagedCursor
from ledger import ManagedLedger, ManagedLedgerConfig, MemoryLedgerStore, MetadataStore
from ledger.managed_ledger import Entry
from ledger.position import EARLIEST, Position
from message.compression import compress
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/chunks"


def message(key: str, value: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def chunks(key: str, uuid: str, value: bytes, count: int) -> list[bytes]:
    """The entries a chunking producer writes for ``value``: compressed whole, then split."""
    whole = compress(pb.ZSTD, value)
    size = -(-len(whole) // count)
    entries = []
    for chunk_id in range(count):
        metadata = pb.MessageMetadata(
            producer_name="p", sequence_id=1, publish_time=1, partition_key=key, compression=pb.ZSTD,
            uncompressed_size=len(value), uuid=uuid, chunk_id=chunk_id, num_chunks_from_msg=count,
            total_chunk_msg_size=len(whole))
        entries.append(encode_entry(metadata, whole[chunk_id * size : (chunk_id + 1) * size], with_checksum=True))
    return entries


@pytest.fixture
def ml() -> ManagedLedger:
    return ManagedLedger.open(TOPIC, MemoryLedgerStore(), MetadataStore(":memory:"),
                              ManagedLedgerConfig(max_entries_per_ledger=3))


def append(ml: ManagedLedger, *datas: bytes) -> list[Position]:
    return [ml.append(d).result(timeout=10) for d in datas]


def compacted(topic: CompactedTopic) -> list[Position]:
    assert topic.view is not None
    return [entry.position for entry in topic.view.iter_all()]


def test_a_chunked_message_straddling_the_stop_marker_reaches_a_reader_whole_and_is_compacted_whole(
    ml: ManagedLedger,
) -> None:
    first, second, third = chunks("k", "p-1", b"big value " * 100, 3)
    old, started = append(ml, message("k", b"old"), first)
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    Compactor().compact(topic)
    assert compacted(topic) == [old, started]  # the old value stays k's value; the chunk is pending
    rest = append(ml, second, third)
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(ml, "reader", EARLIEST), from_earliest=True)
    got = reader.read(10)
    got += reader.read(10)
    assert [entry.position for entry in got] == [old, started, *rest]  # view, then raw tail: every chunk
    Compactor().compact(topic)
    assert compacted(topic) == [started, *rest]  # complete and k's latest: kept whole, the old value gone
    newest = append(ml, message("k", b"small"))
    Compactor().compact(topic)
    assert compacted(topic) == newest  # superseded: dropped whole


def test_a_chunked_message_that_never_completes_is_kept_by_every_run(ml: ManagedLedger) -> None:
    first, _ = chunks("k", "p-1", b"big value " * 100, 2)
    started, value = append(ml, first, message("k", b"v1"))
    topic = CompactedTopic.restore(ml, CursorStore(ml.metadata.database))
    for _ in range(2):
        Compactor().compact(topic)
        assert compacted(topic) == [started, value]


def test_phase_one_keeps_chunk_state_per_chunked_message_not_per_key() -> None:
    entries = []
    for index in range(200):
        for data in chunks(f"key-{index % 4}", f"p-{index}", b"v%d" % index, 2):
            entries.append(Entry(Position(1, len(entries)), data))
    result = phase_one(entries)
    assert len(result.key_map) == 4
    assert len(result.chunks) == 200
    retained = result.chunks.retained(result.key_map.sorted_positions(), result.packer, False)
    kept = [at for (_, at, _), flag in zip(sorted_completions(result.chunks), retained, strict=True) if flag]
    assert sorted(kept) == [(1, 2 * index + 1) for index in range(196, 200)]
    assert result.chunks.nbytes == 200 * 33


def sorted_completions(chunked: ChunkedMessages) -> list[tuple[tuple[int, int], tuple[int, int], bool]]:
    """The completions in the order ``retained`` flags them: by uuid hash, then position."""
    return sorted(chunked.completions(), key=lambda completion: (completion[0], completion[1]))


def test_an_entry_is_a_chunk_only_when_it_says_it_has_more_than_one() -> None:
    """``num_chunks_from_msg`` 1 is a whole message: its payload decodes, its key counts."""
    whole = compress(pb.ZSTD, b"value")
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key="k",
                                  compression=pb.ZSTD, uncompressed_size=5, uuid="p-0", chunk_id=0,
                                  num_chunks_from_msg=1, total_chunk_msg_size=len(whole))
    data = encode_entry(metadata, whole, with_checksum=False)
    result = phase_one([Entry(Position(1, 0), data)])
    assert (len(result.key_map), len(result.chunks), result.opaque_entries) == (1, 0, 0)
    assert CompactedEntry(Position(1, 0), data).messages == 1
