"""The deterministic compaction workload shared by the compaction benchmarks.

``Workload(messages, keys, ...)`` draws, from one seed, which key each message carries,
which messages are tombstones (empty value) and the value bytes of the others. The same
arguments always give the same entries, so separate processes (one per configuration)
rebuild exactly the same stream without passing it around.

Layouts: ``batch_size == 1`` gives one non-batched entry per message; ``batch_size > 1``
gives batch entries of that many slots (the last one may be shorter), the key in each
slot's ``partition_key``, as a producer with batching on writes them. Entries are stored
without the checksum prefix, as compactd's ledgers hold them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ledger.managed_ledger import Entry
from ledger.position import Position
from message.compression import compress
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb

__all__ = ["CODECS", "Workload"]

CODECS = {"none": pb.NONE, "lz4": pb.LZ4, "zlib": pb.ZLIB, "zstd": pb.ZSTD, "snappy": pb.SNAPPY}
_PUBLISH_TIME_MS = 1_700_000_000_000


@dataclass
class Workload:
    """``messages`` messages over ``keys`` keys; see the module docstring."""

    messages: int
    keys: int
    value_bytes: int = 100
    tombstone_fraction: float = 0.01
    batch_size: int = 1
    compression: str = "none"
    seed: int = 1

    def __post_init__(self) -> None:
        rng = np.random.Generator(np.random.PCG64(self.seed))
        self.key_index = rng.integers(0, self.keys, self.messages, dtype=np.int64)
        self.tombstone = rng.random(self.messages) < self.tombstone_fraction
        self._values = rng.bytes(self.messages * self.value_bytes)
        self.key_names = [f"key-{index:08d}" for index in range(self.keys)]

    @property
    def entries(self) -> int:
        """Number of entries the workload encodes to."""
        return -(-self.messages // self.batch_size)

    def value(self, message: int) -> bytes:
        """Message ``message``'s value (b"" for a tombstone)."""
        if self.tombstone[message]:
            return b""
        start = message * self.value_bytes
        return self._values[start : start + self.value_bytes]

    def encoded(self) -> Iterator[bytes]:
        """The entries' bytes, in order, built lazily."""
        codec = CODECS[self.compression]
        names, key_index = self.key_names, self.key_index.tolist()
        if self.batch_size == 1:
            metadata = pb.MessageMetadata(
                producer_name="bench-producer", sequence_id=0, publish_time=_PUBLISH_TIME_MS, compression=codec
            )
            for message in range(self.messages):
                value = self.value(message)
                metadata.sequence_id = message
                metadata.partition_key = names[key_index[message]]
                metadata.uncompressed_size = len(value)
                yield encode_entry(metadata, compress(codec, value), with_checksum=False)
            return
        template = pb.MessageMetadata(producer_name="bench-producer", sequence_id=0, publish_time=_PUBLISH_TIME_MS)
        for first in range(0, self.messages, self.batch_size):
            template.sequence_id = first
            slots = [
                (pb.SingleMessageMetadata(partition_key=names[key_index[message]], payload_size=0), self.value(message))
                for message in range(first, min(first + self.batch_size, self.messages))
            ]
            yield encode_batch(template, slots, codec, with_checksum=False)

    def in_memory(self, entries_per_ledger: int, first_ledger_id: int = 1) -> list[Entry]:
        """The entries with the positions a managed ledger rolling over every
        ``entries_per_ledger`` entries would give them (ledger ids from ``first_ledger_id``)."""
        return [
            Entry(Position(first_ledger_id + index // entries_per_ledger, index % entries_per_ledger), data)
            for index, data in enumerate(self.encoded())
        ]
