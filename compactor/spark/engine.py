"""The Spark engine: phase one as a distributed aggregation on Apache Spark.

``SparkPhaseOne.phase_one(request)`` computes what ``compactor.algorithm.phase_one``
computes over the same stream, as one Spark job:

1. Read: ``PhaseOneDataSource`` gives one partition per piece of a ledger range (ranges
   are cut so that every core gets work: ``piece_entries``), read by the executors straight from the
   ledger files, and one row per keyed live message: the key's 128-bit hash, its position
   and whether it deletes the key (an old tombstone), one chunk end row per last chunk of
   a chunked message (its uuid's hash, position, key-less or not; ``compactor.chunks``),
   plus a figures row per partition.
2. Aggregate: group by key hash and keep the row with the greatest position
   (``max(struct(ledger_id, entry_id, batch_index, deletes))``: a message has one position,
   so the order is total within a key). The stream is in position order (the previous
   compacted ledger holds positions at or before the horizon, the raw ledgers after it), so
   the greatest position is the *last* update, exactly what the local key map keeps. A
   key whose last update deletes it is dropped; key-less messages never had a row.
   The figures rows (null hashes) are summed in the same pass, and every chunk end row is
   a group of its own (grouped by its position too): one per chunked message, not per key.
3. Collect the live keys (hash halves and position: 24 bytes a key, as Arrow) and the
   chunk ends to the driver and build the ``PhaseOneResult`` the local phase two takes: a
   ``KeyMap`` of the hashes, a ``PositionPacker`` that knows exactly the retained
   positions' ledgers, and the ``ChunkedMessages`` the local phase one would have built.

The driver holds the retained set once, as the local engine does at the end of phase one;
what Spark spreads over executors is the reading, decoding, hashing and the aggregation.

Sessions: one ``SparkSession`` per ``SparkPhaseOne``, created on first use with
``master`` (``local[*]``, ``spark://host:port``); Spark reuses a session already running in
the process whatever its master. The Python workers run this interpreter
(``PYSPARK_PYTHON``, when unset); compactd's own code is shipped to them
(``compactor.spark.register``), its third-party dependencies must be installed there.
Errors from PySpark and py4j leave as ``SparkEngineError``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any

import numpy as np

from compactor.algorithm import PhaseOneResult
from compactor.chunks import ChunkedMessages
from compactor.engine import LedgerRange, PhaseOneInput
from compactor.errors import SparkEngineError
from compactor.keymap import KeyMap, PositionPacker

__all__ = ["PARTITION_ENTRIES_MAX", "PARTITION_ENTRIES_MIN", "SparkPhaseOne", "piece_entries", "split_ranges"]

log = logging.getLogger(__name__)

# Entries per Spark partition: at most PARTITION_ENTRIES_MAX, so that a 50 000-entry ledger
# keeps several cores busy and a failed task redoes little; at least PARTITION_ENTRIES_MIN
# (enough work to amortise a task's start, tens of ms), else as many partitions as
# PARTITIONS_PER_CORE times the cluster's cores.
PARTITION_ENTRIES_MAX = 10_000
PARTITION_ENTRIES_MIN = 500
PARTITIONS_PER_CORE = 2
APP_NAME = "compactd"
_U64_MASK = (1 << 64) - 1  # a signed int64 hash half back to the unsigned one key_hash gives


def piece_entries(ranges: tuple[LedgerRange, ...], cores: int) -> int:
    """Entries per partition for ``ranges`` on ``cores`` cores (see the constants)."""
    total = sum(whole.last_entry_id - whole.first_entry_id + 1 for whole in ranges)
    wanted = -(-total // max(1, PARTITIONS_PER_CORE * cores))
    return max(PARTITION_ENTRIES_MIN, min(PARTITION_ENTRIES_MAX, wanted))


def split_ranges(ranges: tuple[LedgerRange, ...], entries_max: int = PARTITION_ENTRIES_MAX) -> list[LedgerRange]:
    """``ranges`` cut into pieces of at most ``entries_max`` entries, in order."""
    pieces = []
    for whole in ranges:
        for first in range(whole.first_entry_id, whole.last_entry_id + 1, entries_max):
            last = min(whole.last_entry_id, first + entries_max - 1)
            pieces.append(LedgerRange(whole.ledger_id, first, last, whole.compacted))
    return pieces


class SparkPhaseOne:
    """A ``compactor.engine.PhaseOneEngine`` on Spark; see the module docstring."""

    def __init__(self, master: str, *, config: dict[str, str] | None = None) -> None:
        """An engine on the Spark ``master`` URL (the ``spark_master`` setting, whose default
        is ``CompactionConfig``'s); ``config``: more Spark settings of the session."""
        self.master = master
        self.config = dict(config or {})
        self._session: Any = None
        self._lock = threading.Lock()

    def session(self) -> Any:
        """The SparkSession (created on first use), with compactd's data sources registered."""
        with self._lock:
            if self._session is None:
                self._session = _start_session(self.master, self.config)
            return self._session

    def phase_one(self, request: PhaseOneInput) -> PhaseOneResult:
        """Phase one of ``request`` on Spark (see the module docstring)."""
        if not request.ranges:
            return PhaseOneResult(last_position=None)
        try:
            cores = int(self.session().sparkContext.defaultParallelism)
            pieces = split_ranges(request.ranges, piece_entries(request.ranges, cores))
            table = self._aggregate(request, pieces)
        except SparkEngineError:
            raise
        except Exception as error:  # py4j and PySpark errors cross the boundary as ours
            raise SparkEngineError(f"spark phase one failed: {type(error).__name__}: {error}", retriable=True) from error
        return _result(table, request)

    def _aggregate(self, request: PhaseOneInput, pieces: list[LedgerRange]) -> Any:
        from pyspark.sql import functions as F

        ranges = [[p.ledger_id, p.first_entry_id, p.last_entry_id, p.compacted] for p in pieces]
        cutoff = request.keep_tombstones_since_ms
        frame = (
            self.session().read.format("compactd-phase-one")
            .option("ledgersRoot", request.ledgers_root)
            .option("ranges", json.dumps(ranges))
            .option("keepTombstonesSinceMs", "" if cutoff is None else str(cutoff))
            .load()
        )
        latest = F.max(F.struct("ledger_id", "entry_id", "batch_index", "deletes")).alias("latest")
        sums = [F.sum(name).alias(name) for name in ("entries", "messages", "entry_bytes", "markers", "opaque_entries")]
        chunk_end = F.when(F.col("uuid_high").isNotNull(), F.struct("ledger_id", "entry_id")).alias("chunk_end")
        grouped = frame.groupBy("hash_high", "hash_low", "uuid_high", "uuid_low", chunk_end).agg(
            latest, F.max("keyless").alias("keyless"), *sums)
        live = grouped.where(F.col("hash_high").isNull() | ~F.col("latest.deletes")).select(
            "hash_high", "hash_low", "latest.ledger_id", "latest.entry_id", "latest.batch_index",
            "uuid_high", "uuid_low", "keyless",
            *[F.col(name) for name in ("entries", "messages", "entry_bytes", "markers", "opaque_entries")],
        )
        return live.toArrow()

    def stop(self) -> None:
        """Stop the session this engine started (idempotent)."""
        with self._lock:
            if self._session is not None:
                self._session.stop()
                self._session = None


def _start_session(master: str, config: dict[str, str]) -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError as error:
        raise SparkEngineError("the spark engine needs PySpark: pip install 'compactd[spark]'") from error
    from compactor.spark.shipping import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(APP_NAME).config("spark.ui.enabled", "false")
    for key, value in config.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as error:  # no Java, a master that cannot be reached
        raise SparkEngineError(f"cannot start Spark on {master}: {type(error).__name__}: {error}") from error
    register(session)  # the data sources, and compactd's code for workers that lack it
    return session


def _result(table: Any, request: PhaseOneInput) -> PhaseOneResult:
    """The ``PhaseOneResult`` of the aggregated Arrow table (see the module docstring)."""
    import pyarrow.compute as pc

    unkeyed = pc.is_null(table.column("hash_high"))
    chunk_ends = pc.is_valid(table.column("uuid_high"))
    figures = table.filter(pc.and_(unkeyed, pc.invert(chunk_ends)))
    keys = table.filter(pc.invert(unkeyed))
    ends = table.filter(chunk_ends).select(["uuid_high", "uuid_low", "ledger_id", "entry_id", "keyless"]).to_pylist()

    def total(name: str) -> int:
        return int(pc.sum(figures.column(name)).as_py() or 0)

    def column(name: str) -> Any:
        return keys.column(name).to_numpy().astype(np.int64)

    packer = PositionPacker()
    packed = packer.pack_many(
        column("ledger_id").astype(np.uint64), column("entry_id").astype(np.uint64), column("batch_index"))
    key_map = KeyMap.from_latest(column("hash_high").view(np.uint64), column("hash_low").view(np.uint64), packed)
    chunks = ChunkedMessages.from_ends(
        ((row["uuid_high"] & _U64_MASK, row["uuid_low"] & _U64_MASK), (row["ledger_id"], row["entry_id"]),
         bool(row["keyless"])) for row in ends)
    result = PhaseOneResult(
        key_map=key_map,
        packer=packer,
        chunks=chunks,
        entries_read=total("entries"),
        messages_read=total("messages"),
        bytes_read=total("entry_bytes"),
        markers=total("markers"),
        opaque_entries=total("opaque_entries"),
        last_position=request.stop,
    )
    log.info("spark phase one: %d live keys over %d entries", len(packed), result.entries_read)
    return result
