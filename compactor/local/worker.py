"""The local engine's rounds in a worker process, off the broker's interpreter.

A run's work (parsing every entry twice, hashing keys, the key map, encoding) is Python
that holds the GIL: on the broker's interpreter it competes with every producer and
consumer (issue 12: a send's p99 went from 0.6 ms idle to 57 ms during a run). With
``CompactionConfig.worker_processes`` > 0 each round of the local engine
(``compactor.local.rounds``) runs in a child process instead, and the broker only plans and
publishes:

1. the broker (``RoundWorkers.run``) reserves the round's ledger id
   (``FileLedgerStore.reserve_ids``) and sends a ``RoundRequest``: the ledgers root, the
   round's input as ranges (the previous view's segments, then the raw ledgers after the
   horizon up to the stop marker; each range ends at a confirmed entry, so it never
   changes), and the run's settings;
2. the child (``run_round``) reads the ranges through a read-only ``FileLedgerStore``
   (with the broker's bucket: an offloaded ledger, and its index, are read there),
   runs the round's phase one and phase two exactly as the in-process round does, with its
   own I/O throttle at the run's rate, and writes the survivors as one whole sealed ledger
   at the reserved id (``ledger.storage.sealed_writer``: temporary file, fsync, atomic
   rename), over key indexes with that ledger's key index beside it, streamed part by part
   as the survivors are written (``_OutputIndexFile``: its memory is one part's rows,
   ``indexed.OUTPUT_PART_ROWS_MAX`` at most, not the round's); it answers a ``RoundReport`` (the round's stop and figures);
3. the broker publishes that ledger as the round's view (``Compactor._publish``).

A child that fails, or is killed (``RoundWorkers.interrupt`` when the broker stops), leaves
at worst temporary files (the ledger's, its index's), which the next start removes, or a
complete ledger at a reserved id that no manifest names: an orphan, collected at the next
start. The children are started with the ``spawn`` method (no copy of the broker's threads
or locks) and die with the broker (``PR_SET_PDEATHSIG`` on Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from compactor.engine import LedgerRange
from compactor.errors import CompactionInterruptedError, CompactorError
from compactor.local import key_index
from compactor.local.index_source import IndexSource
from compactor.local.indexed import IndexedRound, IndexUnavailable, OutputIndex
from compactor.local.rounds import capacity_keys, round_phase_one, round_phase_two
from compactor.record import LATENCY_BUCKETS_MS, RoundFigures, latency_bucket
from compactor.throttle import Throttle
from compactor.view.marks import LedgerMarks
from compactor.view.view import CompactedEntry, decode_compacted_entry, encode_compacted_entry
from ledger.managed_ledger import Entry
from ledger.position import Position
from ledger.storage.base import SyncPolicy
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_writer import SealedLedger, write_sealed_ledger

if TYPE_CHECKING:
    from ledger.storage.object_fs import BucketConfig

__all__ = ["RoundReport", "RoundRequest", "RoundWorkers", "run_round"]

log = logging.getLogger(__name__)

# Entries per store read in the child (a few MiB at typical entry sizes).
READ_BATCH_ENTRIES_MAX = 1000
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A worker's CPU priority below the broker's (nice increment).
CHILD_NICE = 10


@dataclass(frozen=True, slots=True)
class RoundRequest:
    """One round of the local engine, as a child process is given it.

    Attributes:
        ledgers_root: the directory of the ledger files.
        ranges: the round's input stream in order: the previous view's ledgers
            (``compacted``), then the raw ledgers after ``horizon`` up to ``stop``.
        horizon: the previous view's horizon (the last clean position).
        stop: the run's stop marker; the round may stop before it (the key map filled).
        ledger_id: the reserved id of the round's compacted ledger.
        metadata: that ledger's custom metadata (``compactedTo`` is filled in by the child).
        memory_budget_bytes: the key map's budget (``compactor.local.rounds``).
        retain_null_key, keep_tombstones_since_ms: as ``compactor.local.algorithm``.
        max_bytes_per_second: the run's I/O throttle (0: unlimited).
        key_index: run the round over the ledgers' key indexes (``compactor.local.indexed``),
            building the missing ones, unless its input needs parsing.
        bucket: the broker's object store (``LedgerFiles.bucket``): an input ledger whose
            local file is gone (offloaded) is read there, with its index; None: none.
        dead: the dead marks of the compacted ranges' ledgers (``compactor.view.marks``):
            their dead entries and slots are not part of the input.
        report_keys: report the hashes of every key the round's raw input writes
            (``RoundReport.keys``: an incremental run marks the older ledgers by them).
    """

    ledgers_root: str
    ranges: tuple[LedgerRange, ...]
    horizon: Position
    stop: Position
    ledger_id: int
    metadata: tuple[tuple[str, str], ...]
    memory_budget_bytes: int
    retain_null_key: bool = False
    keep_tombstones_since_ms: int | None = None
    max_bytes_per_second: int = 0
    key_index: bool = True
    bucket: BucketConfig | None = None
    dead: tuple[tuple[int, LedgerMarks], ...] = ()
    report_keys: bool = False


@dataclass(frozen=True, slots=True)
class RoundReport:
    """What a child's round did: where it stopped, its ``RoundFigures``, and what only a
    local round measures (``RunFigures``'s names)."""

    stop: Position
    figures: RoundFigures
    key_map_bytes_max: int
    phase_one_s: float
    throttled_s: float
    io_bytes: int
    append_latency_counts: tuple[int, ...]
    entry_offsets: array[int] = field(default_factory=lambda: array("q"))  # the written ledger's layout
    entry_lengths: array[int] = field(default_factory=lambda: array("q"))
    keys: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]] | None = None  # high, low halves (report_keys)


def run_round(request: RoundRequest, *, throttle: Throttle | None = None) -> RoundReport:
    """The round of ``request``, in this process (a child's, or the broker's own when
    ``throttle``, the run's, is given: it also carries the run's interruption, and its
    figures stay the run's, so the report's ``throttled_s`` and ``io_bytes`` are 0); see
    the module docstring."""
    store = FileLedgerStore(request.ledgers_root, sync=SyncPolicy.NONE, read_only=True, bucket=request.bucket)
    try:
        if throttle is None:
            return _round(store, request, Throttle(request.max_bytes_per_second))
        return dataclasses.replace(_round(store, request, throttle), throttled_s=0.0, io_bytes=0)
    finally:
        store.shutdown()


def _round(store: FileLedgerStore, request: RoundRequest, throttle: Throttle) -> RoundReport:
    """The round over key indexes where it can, else parsing its input."""
    started = time.monotonic()
    if request.key_index:
        report = _indexed_round(store, request, throttle, started)
        if report is not None:
            return report
    one = round_phase_one(_stream(store, request, throttle), horizon=request.horizon,
                          capacity_keys=capacity_keys(request.memory_budget_bytes),
                          keep_tombstones_since_ms=request.keep_tombstones_since_ms)
    stop = one.stop if one.filled and one.stop is not None else request.stop
    phase_one_s = time.monotonic() - started
    survivors = round_phase_two(_stream(store, request, throttle, stop), one,
                                retain_null_key=request.retain_null_key,
                                keep_tombstones_since_ms=request.keep_tombstones_since_ms)
    kept, latencies, written = _write(request, stop, survivors, throttle)
    return RoundReport(
        stop=stop, figures=one.figures(written.ledger_id, written.entries, written.size_bytes, kept),
        key_map_bytes_max=one.key_map_bytes_max, phase_one_s=phase_one_s, throttled_s=throttle.throttled_s,
        io_bytes=throttle.charged_bytes, append_latency_counts=tuple(latencies),
        entry_offsets=written.entry_offsets, entry_lengths=written.entry_lengths,
    )


def _write(
    request: RoundRequest, stop: Position, survivors: Iterator[CompactedEntry], throttle: Throttle,
    placed: Callable[[int, int], object] | None = None,
) -> tuple[int, list[int], SealedLedger]:
    """Write the survivors as the round's sealed ledger; gives the messages kept, the
    append latency counts and the ledger. Each entry's latency is the time the writer takes
    to add it (the ledger is durable at its seal, as an in-process round's). ``placed``: as
    ``write_sealed_ledger``'s."""
    kept = 0
    latencies = [0] * (len(LATENCY_BUCKETS_MS) + 1)

    def encoded() -> Iterator[bytes]:
        nonlocal kept
        for survivor in survivors:
            data = encode_compacted_entry(survivor)
            throttle.charge(len(data))
            kept += survivor.messages
            handed = time.monotonic()
            yield data
            latencies[latency_bucket((time.monotonic() - handed) * 1000)] += 1

    metadata = {**dict(request.metadata), "compactedTo": str(stop)}
    written = write_sealed_ledger(request.ledgers_root, request.ledger_id, metadata, encoded(),
                                  created_at_ms=int(time.time() * 1000), placed=placed)
    return kept, latencies, written


def _indexed_round(
    store: FileLedgerStore, request: RoundRequest, throttle: Throttle, started: float,
) -> RoundReport | None:
    """The round over key indexes (``compactor.local.indexed``); None when its input needs
    parsing (the caller runs the parsing round)."""
    source = IndexSource(store, throttle.charge)
    indexed = IndexedRound(
        request.ranges, capacity_keys=capacity_keys(request.memory_budget_bytes),
        keep_tombstones_since_ms=request.keep_tombstones_since_ms, retain_null_key=request.retain_null_key,
        load=source.load, read=source.read, dead=dict(request.dead))
    try:
        try:
            indexed.plan()
        except IndexUnavailable as reason:
            log.info("round over %d ranges parses its input: %s", len(request.ranges), reason)
            return None
        stop = indexed.stop if indexed.filled and indexed.stop is not None else request.stop
        phase_one_s = time.monotonic() - started
        index_file = _OutputIndexFile(request)
        try:
            output = OutputIndex(index_file.write)
            kept, latencies, written = _write(request, stop, indexed.survivors(output), throttle, output.placed)
            output.finish()
        except BaseException:
            index_file.abort()
            raise
    finally:
        source.close()
    index_file.commit(written)
    return RoundReport(
        stop=stop, figures=indexed.figures(written.ledger_id, written.entries, written.size_bytes, kept),
        key_map_bytes_max=indexed.key_map.nbytes_max, phase_one_s=phase_one_s, throttled_s=throttle.throttled_s,
        io_bytes=throttle.charged_bytes, append_latency_counts=tuple(latencies),
        entry_offsets=written.entry_offsets, entry_lengths=written.entry_lengths,
        keys=(indexed.key_map.high, indexed.key_map.low) if request.report_keys else None,
    )


class _OutputIndexFile:
    """The key index of the ledger a round writes (``indexed.OutputIndex``: from the
    input's rows, no parse), written part by part as the round makes it
    (``key_index.IndexWriter``: a part's rows are never kept for the round), so that the
    next incremental run finds its keys without reading the ledger. A failure is only
    logged and the index given up (it is built when first needed)."""

    def __init__(self, request: RoundRequest) -> None:
        self.ledger_id = request.ledger_id
        path = key_index.index_path(key_index.ledger_path(request.ledgers_root, request.ledger_id))
        self._writer: key_index.IndexWriter | None = None
        try:
            self._writer = key_index.IndexWriter(path)
        except (OSError, ValueError) as error:
            self._failed(error)

    def write(self, part: dict[str, npt.NDArray[Any]]) -> None:
        """Append the next part's rows (``OutputIndex``'s)."""
        if self._writer is not None:
            try:
                self._writer.write(part)
            except (OSError, ValueError) as error:  # the writer removed its file
                self._failed(error)

    def commit(self, written: SealedLedger) -> None:
        """The ledger is written: the index is complete; rename it to its name."""
        if self._writer is not None:
            try:
                self._writer.commit(key_index.IndexedLedger(written.ledger_id, written.entries, written.size_bytes))
            except (OSError, ValueError) as error:
                self._failed(error)

    def abort(self) -> None:
        """The round failed: remove the temporary file."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def _failed(self, error: Exception) -> None:
        log.warning("could not write the key index of compacted ledger %d: %s", self.ledger_id, error)
        self._writer = None


def _stream(
    store: FileLedgerStore, request: RoundRequest, throttle: Throttle, stop: Position | None = None,
) -> Iterator[Entry]:
    """The round's input stream up to ``stop`` (all of it when None), each read batch
    charged to ``throttle`` before it is handed on; a compacted ledger's dead entries are
    skipped and its dead slots emptied (``request.dead``)."""
    dead = dict(request.dead)
    for whole in request.ranges:
        marks = dead.get(whole.ledger_id) if whole.compacted else None
        last = whole.last_entry_id
        for first in range(whole.first_entry_id, last + 1, READ_BATCH_ENTRIES_MAX):
            batch = store.read(whole.ledger_id, first, min(last, first + READ_BATCH_ENTRIES_MAX - 1))
            throttle.charge(sum(len(data) for data in batch))
            for offset, data in enumerate(batch):
                if whole.compacted:
                    compacted = decode_compacted_entry(data)
                    if marks is not None and marks.any_dead:
                        if marks.dead_entries[first + offset]:
                            continue
                        slots = marks.dead_slots_of(first + offset)
                        if slots:
                            compacted = compacted.without(slots)
                            compacted = CompactedEntry(compacted.position, compacted.emptied())
                    entry = Entry(compacted.position, compacted.data)
                else:
                    entry = Entry(Position(whole.ledger_id, first + offset), data)
                if stop is not None and entry.position > stop:
                    return
                yield entry


def _child_started(parent_pid: int | None = None) -> None:
    """In each child: die with the broker, leave SIGINT to the broker's handling, and run at
    a lower CPU priority (``CHILD_NICE``): the broker's producers and consumers come first.
    A broker that died (kill -9) before the child asked to die with it is not its parent
    any more (``parent_pid``, the broker's): the child exits at once instead of staying."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICE)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)


class RoundWorkers:
    """Up to ``processes`` child processes running rounds (started on first use)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._interrupted = False

    def run(self, request: RoundRequest) -> RoundReport:
        """Run ``request`` in a child and wait for its report. Raises what the round raised
        (``CompactorError`` and the ledger errors cross as themselves),
        ``CompactionInterruptedError`` when ``interrupt`` killed it, ``CompactorError`` when
        the child died."""
        try:
            with self._lock:
                if self._interrupted:
                    raise CompactionInterruptedError("the broker is stopping")
                if self._pool is None:
                    self._pool = ProcessPoolExecutor(
                        self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=_child_started,
                        initargs=(os.getpid(),))
                future = self._pool.submit(run_round, request)  # a pool whose child died refuses it
            return future.result()
        except BrokenProcessPool:
            self._forget_broken()
            if self._interrupted:
                raise CompactionInterruptedError("the broker stopped the compaction's worker process") from None
            raise CompactorError("the compaction's worker process died") from None

    def _forget_broken(self) -> None:
        """Drop a pool whose child died: the next round starts a fresh one."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def pids(self) -> list[int]:
        """The process ids of the children now running (none before the first round)."""
        with self._lock:
            pool = self._pool
        return [] if pool is None else list(getattr(pool, "_processes", {}))

    def interrupt(self) -> None:
        """Kill the children: every round in flight fails, and no new one starts."""
        with self._lock:
            self._interrupted = True
            pool = self._pool
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                with contextlib.suppress(OSError):
                    process.kill()

    def close(self) -> None:
        """Stop the children (idempotent); a round in flight is killed."""
        self.interrupt()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

