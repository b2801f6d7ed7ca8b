"""Which engine runs phase one, and what a phase one run elsewhere is given to read.

Phase one is the only phase whose memory grows with the topic (the key map holds every
live key); phase two walks the stream once more and publishing is local. So an engine is
a *phase one*: given the input stream as ranges of ledgers (``PhaseOneInput``), it returns
a ``PhaseOneResult`` that the local phase two consumes unchanged. Two exist:

* ``local``: ``compactor.algorithm.phase_one`` in this process, in rounds within the memory
  budget (``compactor.rounds``);
* ``spark``: ``compactor.spark.engine.SparkPhaseOne``, a distributed aggregation on Apache
  Spark over the same ledgers, read by the executors straight from the ledger files.

``choose_engine`` is the pure selection rule: ``local`` and ``spark`` are what they say.
The local engine never needs more than the memory budget (``compactor.rounds``: when the
key set would pass it, the run goes in rounds), so Spark can only help where it saves the
local engine's extra rounds *without* costing the broker more memory than the budget.
``auto`` therefore picks ``spark`` only when all of these hold:

* PySpark is installed;
* the local key map would pass the budget (``estimated_keys`` × ``KEY_MAP_BYTES_PER_KEY``
  > ``memory_budget_bytes``): one local round would not do;
* what the Spark engine brings back to the driver, which is the broker, fits the budget
  (``estimated_keys`` × ``driver_bytes_per_key`` ≤ ``memory_budget_bytes``). Today's
  Spark engine collects every live key to the driver as Arrow
  (``SPARK_DRIVER_BYTES_PER_KEY``, about 77 bytes a key measured, three times the local
  map's 24), so this never holds and ``auto`` stays local; an engine that keeps the keys on
  the executors says so with a ``driver_bytes_per_key`` attribute of 0, and then ``auto``
  moves every run that needs more than one local round to Spark. So ``auto`` never moves a
  run to a path that needs more broker memory, and never reaches
  ``spark.driver.maxResultSize`` (1 GiB by default: 14 M keys at 77 bytes) unless the
  budget is set above it.

The estimate is what the runner has for free: the previous compacted ledger's entries plus
the raw entries after the horizon (a key written twice is counted twice, a batch once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from compactor.algorithm import PhaseOneResult
from ledger.metadata import LedgerRecord
from ledger.position import Position

__all__ = [
    "KEY_MAP_BYTES_PER_KEY",
    "SPARK_DRIVER_BYTES_PER_KEY",
    "EngineName",
    "LedgerRange",
    "PhaseOneEngine",
    "PhaseOneInput",
    "choose_engine",
    "raw_ranges",
]

EngineName = Literal["auto", "local", "spark"]
# What one live key costs the local key map (compactor.keymap: two hash halves and a packed
# position, three uint64); the merge buffer adds at most a quarter more.
KEY_MAP_BYTES_PER_KEY = 24
# What the Spark engine (compactor.spark.engine) costs the driver per live key: every key
# comes back as Arrow (``toArrow()``), about 77 bytes a key measured (issue 13).
SPARK_DRIVER_BYTES_PER_KEY = 77


@dataclass(frozen=True, slots=True)
class LedgerRange:
    """Entries ``first_entry_id..last_entry_id`` (inclusive) of one ledger.

    Attributes:
        ledger_id: the ledger.
        first_entry_id, last_entry_id: the inclusive range; ``last_entry_id`` is at most
            the ledger's last confirmed entry, so the range is immutable even in an open
            ledger.
        compacted: the ledger is a compacted ledger (entries in ``compactor.view``'s
            format, carrying their original positions), not a raw one.
    """

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    compacted: bool = False


@dataclass(frozen=True, slots=True)
class PhaseOneInput:
    """The input stream of one run, as ledgers to read, and how to read it.

    Attributes:
        ledgers_root: directory of the ledger files (``FileLedgerStore.root``).
        ranges: the previous compacted ledger (if any) first, then the raw ledgers after
            the horizon up to the stop marker, in stream order.
        stop: the stop marker (the last entry of the stream).
        retain_null_key, keep_tombstones_since_ms: as ``compactor.algorithm.phase_one``.
    """

    ledgers_root: str
    ranges: tuple[LedgerRange, ...]
    stop: Position
    retain_null_key: bool = False
    keep_tombstones_since_ms: int | None = None


class PhaseOneEngine(Protocol):
    """Runs phase one somewhere else; the result must equal ``algorithm.phase_one``'s over
    the same stream: the same live keys at the same latest positions."""

    def phase_one(self, request: PhaseOneInput) -> PhaseOneResult: ...


def choose_engine(
    engine: EngineName, *, estimated_keys: int, memory_budget_bytes: int, spark_available: bool,
    driver_bytes_per_key: int = SPARK_DRIVER_BYTES_PER_KEY,
) -> Literal["local", "spark"]:
    """The engine of one run (see the module docstring); ``driver_bytes_per_key`` is what
    the Spark engine at hand brings back to the driver per key."""
    if engine != "auto":
        return engine
    rounds = estimated_keys * KEY_MAP_BYTES_PER_KEY > memory_budget_bytes
    driver_fits = estimated_keys * driver_bytes_per_key <= memory_budget_bytes
    return "spark" if spark_available and rounds and driver_fits else "local"


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
