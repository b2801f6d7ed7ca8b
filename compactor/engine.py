"""Which engine runs a compaction, and what a run elsewhere is given to read and write.

Two engines exist:

* ``local``: ``compactor.local.algorithm``'s two phases in this process, in rounds within the
  memory budget (``compactor.local.rounds``), writing one compacted ledger per round;
* ``spark``: ``compactor.spark.engine.SparkEngine``, the whole pipeline on Apache Spark
  (``RewriteEngine``): given the input stream as ranges of ledgers (``RewriteInput``),
  phase one's aggregation and phase two's rewrite both run on the executors, read straight
  from the ledger files, and the result (``RewriteResult``) is the list of sealed
  compacted ledgers the executors wrote, in stream order, at ids the engine reserved in
  the broker's store (``OutputLedgers``); the runner publishes that list. No per-key
  structure ever reaches the driver, which is the broker: it holds O(pieces + output
  ledgers).

``choose_engine`` is the pure selection rule: ``local`` and ``spark`` are what they say.
The local engine never needs more than the memory budget (``compactor.local.rounds``: when the
key set would pass it, the run goes in rounds), so Spark can only help where it saves the
local engine's extra rounds *without* costing the broker more memory than the budget.
``auto`` therefore picks ``spark`` only when all of these hold:

* PySpark is installed;
* the local key map would pass the budget (``estimated_keys`` × ``KEY_MAP_BYTES_PER_KEY``
  > ``memory_budget_bytes``): one local round would not do;
* what the Spark engine brings back to the driver, which is the broker, fits the budget
  (``estimated_keys`` × ``driver_bytes_per_key`` ≤ ``memory_budget_bytes``). The Spark
  engine keeps every key on the executors (``SPARK_DRIVER_BYTES_PER_KEY`` = 0: its
  ``driver_bytes_per_key`` attribute), so this always holds for it and ``auto`` moves every
  run that needs more than one local round to Spark; an engine that collected keys to the
  driver would say so with a positive ``driver_bytes_per_key`` (the former collecting
  engine measured 77 bytes a key), and ``auto`` would keep such a run local. Nothing per key is
  collected, so ``spark.driver.maxResultSize`` is never reached.

The estimate is what the runner has for free: the previous compacted view's entries plus
the raw entries after the horizon (a key written twice is counted twice, a batch once).

With the Spark master known (``spark_master``, the runner passes its setting), ``auto``
also moves a run to Spark where the cluster is *faster*, by the measured speeds
(``bench.spark``, docs/benchmarks.md): the local engine reads ``LOCAL_ENTRIES_PER_S``, a
Spark core ``SPARK_ENTRIES_PER_S_PER_CORE``, and a Spark run costs ``SPARK_RUN_OVERHEAD_S``
more (its jobs' scheduling, whatever the input). With ``cores`` cores (``spark_cores``:
``local[N]`` is N, ``local[*]`` this machine's CPUs, a cluster ``SPARK_CLUSTER_CORES``),
Spark wins when ``cores * SPARK_ENTRIES_PER_S_PER_CORE > LOCAL_ENTRIES_PER_S`` and the
input reaches ``spark_break_even_entries(cores)``, where the two predicted times cross.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from ledger.metadata import LedgerRecord
from ledger.position import Position

if TYPE_CHECKING:
    from ledger.storage.object_fs import BucketConfig

__all__ = [
    "KEY_MAP_BYTES_PER_KEY",
    "LOCAL_ENTRIES_PER_S",
    "SPARK_CLUSTER_CORES",
    "SPARK_DRIVER_BYTES_PER_KEY",
    "SPARK_ENTRIES_PER_S_PER_CORE",
    "SPARK_RUN_OVERHEAD_S",
    "EngineName",
    "LedgerRange",
    "OutputLedgers",
    "RewriteEngine",
    "RewriteInput",
    "RewriteResult",
    "choose_engine",
    "raw_ranges",
    "spark_break_even_entries",
    "spark_cores",
]

EngineName = Literal["auto", "local", "spark"]
# What one live key costs the local key map (compactor.local.keymap: two hash halves and a packed
# position, three uint64); the merge buffer adds at most a quarter more.
KEY_MAP_BYTES_PER_KEY = 24
# What the Spark engine (compactor.spark.engine) costs the driver per live key: nothing,
# the keys stay in Spark's shuffle (the former engine collected them: 77 bytes a key).
SPARK_DRIVER_BYTES_PER_KEY = 0
# Measured speeds (bench.spark, batches of 100 messages, both engines reading key indexes;
# docs/benchmarks.md): input entries a second of the local engine, and of one Spark core;
# what a Spark run costs more, whatever its size; the cores assumed of a cluster master.
LOCAL_ENTRIES_PER_S = 14_800  # 4 M messages / 1 M keys: 40,000 entries in 2.70 s
# local[2] on a 2-core machine (its cores shared with the driver's JVM and Python): 4.42 s
# for the same, less the overhead; local[1]'s one core alone goes about 12,500.
SPARK_ENTRIES_PER_S_PER_CORE = 6_000
SPARK_RUN_OVERHEAD_S = 1.1  # local[1]: 1.52 s at 5,000 entries, 4.32 s at 40,000 (session kept)
SPARK_CLUSTER_CORES = 16
_LOCAL_MASTER = re.compile(r"local(?:\[(\d+|\*)(?:,\d+)?\])?$")


def spark_cores(master: str) -> int:
    """The cores a Spark ``master`` URL gives: ``local`` 1, ``local[N]`` N, ``local[*]``
    this machine's CPUs, any other (a cluster) ``SPARK_CLUSTER_CORES``."""
    match = _LOCAL_MASTER.match(master.strip())
    if match is None:
        return SPARK_CLUSTER_CORES
    if match.group(1) is None:
        return 1
    return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))


def spark_break_even_entries(cores: int) -> float:
    """The input (entries) from which a Spark run on ``cores`` cores is predicted faster
    than a local one; infinite when those cores together are slower than the local engine."""
    spark_rate = cores * SPARK_ENTRIES_PER_S_PER_CORE
    if spark_rate <= LOCAL_ENTRIES_PER_S:
        return math.inf
    return SPARK_RUN_OVERHEAD_S / (1 / LOCAL_ENTRIES_PER_S - 1 / spark_rate)


@dataclass(frozen=True, slots=True)
class LedgerRange:
    """Entries ``first_entry_id..last_entry_id`` (inclusive) of one ledger.

    Attributes:
        ledger_id: the ledger.
        first_entry_id, last_entry_id: the inclusive range; ``last_entry_id`` is at most
            the ledger's last confirmed entry, so the range is immutable even in an open
            ledger.
        compacted: the ledger is a compacted ledger (entries in ``compactor.view.view``'s
            format, carrying their original positions), not a raw one.
    """

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    compacted: bool = False


@dataclass(frozen=True, slots=True)
class RewriteInput:
    """The input stream of one run, as ledgers to read, and how to compact it.

    Attributes:
        ledgers_root: directory of the ledger files (``FileLedgerStore.root``), the same
            path on the broker and the executors — unless ``bucket`` is given.
        ranges: the previous compacted view's ledgers (if any, non-empty ones) first, then
            the raw ledgers after the horizon up to the stop marker, in stream order.
        stop: the stop marker (the last entry of the stream).
        metadata: the custom metadata of every output ledger (component, topic, compactedTo).
        retain_null_key, keep_tombstones_since_ms: as ``compactor.local.algorithm``'s phases.
        bucket: the object store every input ledger (and any key index) is in: the engine
            reads them there, and writes its output ledgers there (``ledgers/<id>``), never
            touching ``ledgers_root``, which its workers need not see (``compactor.spark``).
    """

    ledgers_root: str
    ranges: tuple[LedgerRange, ...]
    stop: Position
    metadata: Mapping[str, str] = field(default_factory=dict)
    retain_null_key: bool = False
    keep_tombstones_since_ms: int | None = None
    bucket: BucketConfig | None = None


@dataclass(frozen=True, slots=True)
class RewriteResult:
    """What a whole-pipeline run produced: sealed compacted ledgers, not yet published.

    Attributes:
        ledger_ids: the output ledgers in stream order; their entries concatenated are
            what ``compactor.local.algorithm.compact`` gives of the input stream. At least one
            (one empty ledger when nothing survives).
        keys_kept: live keys after the run.
        entries_read, messages_read, bytes_read, markers, opaque_entries: phase one's
            figures of the input stream (``PhaseOneResult``'s).
        entries_written, bytes_written, messages_kept: the output ledgers' entries, entry
            bytes and the messages they deliver.
        groups: the groups the input was rewritten in.
    """

    ledger_ids: tuple[int, ...]
    keys_kept: int = 0
    entries_read: int = 0
    messages_read: int = 0
    bytes_read: int = 0
    markers: int = 0
    opaque_entries: int = 0
    entries_written: int = 0
    bytes_written: int = 0
    messages_kept: int = 0
    groups: int = 0


class OutputLedgers(Protocol):
    """The broker's ledger store as a whole-pipeline engine uses it: ids reserved for the
    ledgers written elsewhere, and deleted when they are not published."""

    def reserve_ids(self, count: int) -> list[int]: ...

    def delete(self, ledger_id: int) -> None: ...


class RewriteEngine(Protocol):
    """Runs a whole compaction elsewhere; the output ledgers' entries, concatenated, must
    equal ``compactor.local.algorithm.compact``'s over the same stream, byte for byte.
    ``driver_bytes_per_key``: what it brings back to the driver per live key."""

    driver_bytes_per_key: int

    def compact(self, request: RewriteInput, ledgers: OutputLedgers) -> RewriteResult: ...


def choose_engine(
    engine: EngineName, *, estimated_keys: int, memory_budget_bytes: int, spark_available: bool,
    driver_bytes_per_key: int = SPARK_DRIVER_BYTES_PER_KEY, spark_master: str | None = None,
) -> Literal["local", "spark"]:
    """The engine of one run (see the module docstring); ``driver_bytes_per_key`` is what
    the Spark engine at hand brings back to the driver per key; ``spark_master``: the
    master it would run on (None: unknown, only the memory rule applies)."""
    if engine != "auto":
        return engine
    rounds = estimated_keys * KEY_MAP_BYTES_PER_KEY > memory_budget_bytes
    driver_fits = estimated_keys * driver_bytes_per_key <= memory_budget_bytes
    faster = spark_master is not None and estimated_keys >= spark_break_even_entries(spark_cores(spark_master))
    return "spark" if spark_available and driver_fits and (rounds or faster) else "local"


def raw_ranges(ledgers: Sequence[LedgerRecord], horizon: Position, stop: Position) -> list[LedgerRange]:
    """The raw entries in ``(horizon, stop]`` as per-ledger ranges, skipping empty ones.

    ``ledgers`` is the topic's ledger list with confirmed counts (``ledger_list()``).
    """
    ranges = []
    for ledger in ledgers:
        if not horizon.ledger_id <= ledger.ledger_id <= stop.ledger_id:
            continue
        first = horizon.entry_id + 1 if ledger.ledger_id == horizon.ledger_id else 0
        last = stop.entry_id if ledger.ledger_id == stop.ledger_id else ledger.entries - 1
        last = min(last, ledger.entries - 1)
        if max(first, 0) <= last:
            ranges.append(LedgerRange(ledger.ledger_id, max(first, 0), last))
    return ranges
