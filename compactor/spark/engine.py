"""The Spark engine: the whole compaction pipeline on Apache Spark; the driver plans and commits.

``SparkEngine.compact(request, ledgers)`` (a ``compactor.engine.RewriteEngine``) turns a
run's input stream into sealed compacted ledgers written by the executors, the pattern of
Delta's OPTIMIZE or Iceberg's rewrite_data_files: plan immutable input groups, rewrite them
in parallel into new files, commit once.

1. Plan (driver, O(pieces)): the ranges are cut into pieces (``piece_entries``: enough to
   keep every core busy), and the pieces into contiguous *groups* in stream order
   (``plan_groups``: at most ``GROUP_ENTRIES_MAX`` input entries each, at least one group
   per core when there are pieces enough). One ledger id per group is reserved in the
   broker's store (``OutputLedgers.reserve_ids``).
2. Phase one (executors): each task reads a contiguous run of pieces
   (``PARTITIONS_PER_CORE`` tasks a core, more only where a task would read over
   ``PIECES_PER_TASK_MAX`` pieces: a Python task's start costs tens of ms) through
   their ledgers' key indexes (``compactor.spark.index_scan``: Arrow columns, array work,
   no message parsed), one keyed row per key and task (``index_scan.TaskKeyedRows``: per
   up to 2 M rows held): the key's 128-bit hash and ``v``, its place in the stream with
   two flag bits. Spark's own operators do the rest: the rows are hash-partitioned by key
   into as many partitions as there are tasks, each key's
   greatest ``v`` (its last update) kept by Spark's hash aggregate, a key whose last update
   deletes it dropped; the result is kept on the executors (a local checkpoint). Chunked
   messages (``compactor.local.chunks``), only when phase one saw a chunk (a Spark
   accumulator counts them): each uuid's chunks, in stream order, tell every chunk where
   its instance completes (a window); an instance that completes is dropped unless its
   last chunk is its key's latest (key-less: unless ``retain_null_key``). The dropped
   chunks' places, the live places and one figures row per group are the *decision
   rows*, each tagged with the group its place lies in.
3. Phase two (executors): the decision rows are co-partitioned with their group — one
   Spark partition per group, by a key whose hash is the group's index
   (``partition_keys``) — and each group's task rewrites its pieces into one sealed
   compacted ledger at its reserved id (``compactor.spark.rewrite.rewrite_group``), keeping
   exactly what ``compactor.local.algorithm.phase_two`` keeps. Nothing is broadcast from the
   driver (joins are sort-merge joins), nothing per key is collected.
4. Commit (driver, O(groups)): each task returns one report row; ``commit_reports`` accepts
   them only if every group reported exactly once, at its reserved id (Spark keeps one
   successful attempt per partition; a duplicate or a missing report fails the run). The
   result lists the non-empty groups' ledgers in stream order (one empty ledger when every
   group is empty); the unused reserved ledgers are deleted, and on any failure all of
   them, so the previous view keeps serving — once the failed job's cancelled tasks have
   stopped (``_settled_on_failure``), so that none writes its ledger after the delete.

Sessions: one ``SparkSession`` per ``SparkEngine``, created on first use with ``master``
(``local[*]``, ``spark://host:port``); Spark reuses a session already running in the
process whatever its master. The Python workers run this interpreter (``PYSPARK_PYTHON``,
when unset); compactd's own code is shipped to them (``compactor.spark.register``), its
third-party dependencies must be installed there. Errors from PySpark and py4j leave as
``SparkEngineError``.

Where the executors read and write: without a bucket, in the data dir's ledger directory,
which must then be the same path, shared, on the broker and every executor. With a bucket
(``RewriteInput.bucket``: the run's every input ledger is in it, ``compactor.runs.runner``
sees to that), they are given no ledger directory at all: they read the ledgers and key
indexes from the bucket (through each read-only store's block cache), build a missing
index there, and upload each group's ledger as ``ledgers/<reserved id>`` (written in a
local scratch directory, then put atomically and read back for its size and CRC32C). They
get the ``BucketConfig`` (driver, bucket, prefix, endpoint, region), never a credential:
each reads the AWS configuration chain of its own environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from compactor.engine import LedgerRange, OutputLedgers, RewriteInput, RewriteResult
from compactor.errors import SparkEngineError
from compactor.spark.rewrite import (
    DECISION_DROPPED_CHUNK,
    DECISION_FIGURES,
    DECISION_RETAINED,
    REPORT_SCHEMA_DDL,
    GroupReport,
    GroupSpec,
    RewriteJob,
    rewrite_group,
)
from ledger.storage.object_fs import BucketConfig

__all__ = [
    "GROUP_ENTRIES_MAX",
    "PARTITION_ENTRIES_MAX",
    "PARTITION_ENTRIES_MIN",
    "SparkEngine",
    "commit_reports",
    "partition_keys",
    "piece_entries",
    "plan_groups",
    "split_ranges",
]

log = logging.getLogger(__name__)

# Entries per piece: at most PARTITION_ENTRIES_MAX, so that a 50 000-entry ledger keeps
# several cores busy; at least PARTITION_ENTRIES_MIN, else as many pieces as
# PARTITIONS_PER_CORE times the cluster's cores. Phase one runs at most that many tasks
# (a task reads a run of pieces when ledgers are small), and aggregates into as many
# partitions.
PARTITION_ENTRIES_MAX = 10_000
PARTITION_ENTRIES_MIN = 500
PARTITIONS_PER_CORE = 2
# Pieces a phase-one task reads at most (more tasks than PARTITIONS_PER_CORE a core when
# the input is large): a failed or slow task redoes or delays at most this much.
PIECES_PER_TASK_MAX = 16
# Input entries per group (one output ledger each): large output ledgers, and a failed
# task redoes at most this much.
GROUP_ENTRIES_MAX = 1_000_000
# How long a failed run waits for its job's cancelled tasks to stop before it deletes the
# reserved ledgers: a task still running could write its ledger after the delete. PySpark
# kills a cancelled task's Python worker after ``spark.python.task.killTimeout`` (2 s).
SETTLE_TIMEOUT_S = 60.0
APP_NAME = "compactd"


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


def plan_groups(pieces: Sequence[LedgerRange], cores: int, group_entries: int = GROUP_ENTRIES_MAX) -> list[
        tuple[LedgerRange, ...]]:
    """``pieces`` as contiguous groups in stream order, of about equal entries: as many as
    ``cores`` (when there are pieces enough) or as needed to stay within ``group_entries``
    input entries a group, whichever is more."""
    sizes = [piece.last_entry_id - piece.first_entry_id + 1 for piece in pieces]
    total = sum(sizes)
    count = min(len(pieces), max(cores, -(-total // max(1, group_entries))))
    if count == 0:
        return []
    groups: list[tuple[LedgerRange, ...]] = []
    current: list[LedgerRange] = []
    done = 0
    for index, (piece, size) in enumerate(zip(pieces, sizes, strict=True)):
        current.append(piece)
        done += size
        left_pieces, left_groups = len(pieces) - index - 1, count - len(groups) - 1
        if left_groups > 0 and (done * count >= total * (len(groups) + 1) or left_pieces == left_groups):
            groups.append(tuple(current))
            current = []
    groups.append(tuple(current))
    return groups


def commit_reports(specs: Sequence[GroupSpec], reports: Sequence[GroupReport]) -> tuple[RewriteResult, list[int]]:
    """The run's result from its groups' reports, and the reserved ledgers it leaves unused.

    ``SparkEngineError`` unless every group of ``specs`` reported exactly once, at its
    reserved ledger id. The result lists the ledgers of the groups that kept something, in
    stream order; when none did, the first group's empty ledger alone.
    """
    by_group: dict[int, GroupReport] = {}
    for report in reports:
        if not 0 <= report.group < len(specs) or report.figures.ledger_id != specs[report.group].ledger_id:
            raise SparkEngineError(f"spark rewrite: a report for no planned group: {report}", retriable=True)
        if report.group in by_group:
            raise SparkEngineError(f"spark rewrite: group {report.group} reported twice", retriable=True)
        by_group[report.group] = report
    missing = [spec.index for spec in specs if spec.index not in by_group]
    if missing:
        raise SparkEngineError(f"spark rewrite: groups {missing} did not report", retriable=True)
    ordered = [by_group[spec.index] for spec in specs]
    kept = [report.figures for report in ordered if report.figures.entries_written] or [ordered[0].figures]
    used = {figures.ledger_id for figures in kept}

    def total(name: str) -> int:
        return sum(getattr(report.figures, name) for report in ordered)

    result = RewriteResult(
        ledger_ids=tuple(figures.ledger_id for figures in kept), keys_kept=total("keys_kept"),
        entries_read=total("entries_read"), messages_read=total("messages_read"), bytes_read=total("bytes_read"),
        markers=total("markers"), opaque_entries=total("opaque_entries"), entries_written=total("entries_written"),
        bytes_written=total("bytes_written"), messages_kept=total("messages_kept"), groups=len(specs),
    )
    return result, [spec.ledger_id for spec in specs if spec.ledger_id not in used]


def partition_keys(groups: int) -> list[int]:
    """For each group index g, an int whose Spark hash puts it in partition g of ``groups``
    (``HashPartitioning``: ``pmod(murmur3(key, 42), groups)``), so that a shuffle by it
    gives every group a partition of its own."""
    keys: list[int | None] = [None] * groups
    left, candidate = groups, 0
    while left:
        slot = _spark_hash_int(candidate) % groups
        if keys[slot] is None:
            keys[slot] = candidate
            left -= 1
        candidate += 1
    return [key for key in keys if key is not None]


def _spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of one int column (Murmur3_x86_32.hashInt), as a signed int."""
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = rotl((value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


class SparkEngine:
    """A ``compactor.engine.RewriteEngine`` on Spark; see the module docstring."""

    driver_bytes_per_key = 0  # no key ever reaches the driver (compactor.engine)

    def __init__(
        self, master: str, *, config: dict[str, str] | None = None, piece_entries: int | None = None,
        group_entries: int = GROUP_ENTRIES_MAX,
    ) -> None:
        """An engine on the Spark ``master`` URL (the ``spark_master`` setting, whose default
        is ``CompactionConfig``'s); ``config``: more Spark settings of the session;
        ``piece_entries`` (default: ``piece_entries()``) and ``group_entries`` size the
        pieces and groups (tests make them small)."""
        self.master = master
        self.last_run: dict[str, float] = {}  # the last run's timings (seconds) and indexes built
        self.config = dict(config or {})
        self.piece_entries = piece_entries
        self.group_entries = group_entries
        self._session: Any = None
        self._lock = threading.Lock()

    def session(self) -> Any:
        """The SparkSession (created on first use), with compactd's data sources registered."""
        with self._lock:
            if self._session is None:
                self._session = _start_session(self.master, self.config)
            return self._session

    def compact(self, request: RewriteInput, ledgers: OutputLedgers) -> RewriteResult:
        """The whole run of ``request`` on Spark (see the module docstring)."""
        if not request.ranges:
            raise SparkEngineError("spark rewrite: an empty input stream has nothing to compact")
        try:
            cores = self._cores()
        except SparkEngineError:
            raise
        except Exception as error:  # py4j and PySpark errors cross the boundary as ours
            raise SparkEngineError(f"spark rewrite failed: {type(error).__name__}: {error}", retriable=True) from error
        self.last_run = {}
        pieces = split_ranges(request.ranges, self.piece_entries or piece_entries(request.ranges, cores))
        groups = plan_groups(pieces, cores, self.group_entries)
        ids = ledgers.reserve_ids(len(groups))
        firsts = [sum(len(group) for group in groups[:index]) for index in range(len(groups))]
        specs = [GroupSpec(index, group, ledger_id, first) for index, (group, ledger_id, first)
                 in enumerate(zip(groups, ids, firsts, strict=True))]
        try:
            try:
                with _settled_on_failure(self.session(), f"{APP_NAME}-rewrite-{ids[0]}"):
                    reports = self._rewrite(request, specs)
            except SparkEngineError:
                raise
            except Exception as error:
                raise SparkEngineError(f"spark rewrite failed: {type(error).__name__}: {error}",
                                       retriable=True) from error
            result, unused = commit_reports(specs, reports)
        except BaseException:
            _delete(ledgers, ids)
            raise
        _delete(ledgers, unused)
        log.info("spark rewrite: %d pieces in %d groups into ledgers %s, %d live keys",
                 len(pieces), len(specs), list(result.ledger_ids), result.keys_kept)
        return result

    def _cores(self) -> int:
        return int(self.session().sparkContext.defaultParallelism)

    def _rewrite(self, request: RewriteInput, specs: Sequence[GroupSpec]) -> list[GroupReport]:
        """The Spark job (``_job``) run: the groups' reports."""
        job = self._job(request, specs)
        started = time.monotonic()
        reports = [GroupReport.from_row(tuple(row)) for row in job.collect()]
        self.last_run["phase_two_s"] = time.monotonic() - started
        return reports

    def _index_missing(self, request: RewriteInput) -> None:
        """Index, on the executors and in parallel, the input's ledgers that have no key
        index file yet (a task per ledger; an open ledger is skipped); the indexes are
        kept for the next runs. A damaged index is found, and rebuilt, by the phase-one
        task that reads it."""
        from compactor.spark.index_scan import ensure_ledger_index, ledger_ids_without_index

        compacted = {whole.ledger_id: whole.compacted for whole in request.ranges}
        missing = ledger_ids_without_index(request.ledgers_root, sorted(compacted), request.bucket)
        self.last_run["indexes_built"] = len(missing)
        if not missing:
            return
        root, bucket = _executor_root(request), request.bucket
        built = (self.session().sparkContext.parallelize(missing, len(missing))
                 .map(lambda ledger_id: ensure_ledger_index(root, ledger_id, compacted[ledger_id], bucket)).collect())
        log.debug("spark rewrite: indexed %d ledgers on the executors (%s rows)", len(missing), built)

    def _job(self, request: RewriteInput, specs: Sequence[GroupSpec]) -> Any:
        """The Spark job as a DataFrame of reports: phase one (run at once), the decision
        rows co-partitioned with the groups, one rewrite task per group."""
        from pyspark.sql import functions as F

        spark = self.session()
        # The stream is read once: the decisions' branches read the aggregated rows kept on
        # the executors (a local checkpoint: far cheaper than a cache; an executor lost
        # before the end fails the run, which the next run redoes; Spark's context cleaner
        # drops the blocks once the run is over).
        started = time.monotonic()
        self._index_missing(request)
        indexed = time.monotonic()
        pieces = sum(len(spec.pieces) for spec in specs)
        tasks = max(1, min(pieces, max(self._cores() * PARTITIONS_PER_CORE, -(-pieces // PIECES_PER_TASK_MAX))))
        chunks_seen = spark.sparkContext.accumulator(0)
        latest = _latest(spark, request, specs, tasks, chunks_seen).localCheckpoint(eager=True)
        self.last_run.update(index_build_s=indexed - started, phase_one_s=time.monotonic() - started)
        decisions = _decisions(spark, latest, request, specs, tasks if chunks_seen.value else 0)
        keys = partition_keys(len(specs))
        slot = F.element_at(F.array(*[F.lit(key) for key in keys]), F.col("grp") + 1).cast("int")
        job = RewriteJob(_executor_root(request), dict(request.metadata), int(time.time() * 1000),
                         request.retain_null_key, request.keep_tombstones_since_ms, request.bucket)
        task = _task(job, {spec.index: spec for spec in specs})
        return (decisions.withColumn("slot", slot).repartition(len(specs), "slot")
                .groupBy("slot", "grp").applyInArrow(task, REPORT_SCHEMA_DDL))

    def stop(self) -> None:
        """Stop the session this engine started (idempotent)."""
        with self._lock:
            if self._session is not None:
                self._session.stop()
                self._session = None




def _task(job: RewriteJob, specs: dict[int, GroupSpec]) -> Callable[[tuple[pa.Scalar, ...], pa.Table], pa.Table]:
    """The function ``applyInArrow`` runs once per group on an executor (its type hints say
    which form it is: the group's key, (slot, group), and its decision rows as one table)."""
    def rewrite(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
        report = rewrite_group(job, specs[int(key[1].as_py())], table)
        return pa.Table.from_pylist([dict(zip(_REPORT_NAMES, report.row(), strict=True))], schema=_REPORT)

    return rewrite


_REPORT_NAMES = [column.split()[0] for column in REPORT_SCHEMA_DDL.split(", ")]
_REPORT = pa.schema([(name, pa.int32() if name == "grp" else pa.int64()) for name in _REPORT_NAMES])


def _executor_root(request: RewriteInput) -> str | None:
    """The ledger directory the executors open: none with a bucket (they read and write the
    bucket alone, and need not see the broker's disk), else the broker's."""
    return None if request.bucket is not None else request.ledgers_root


def phase_one_reader(ledgers_root: str | None, pieces: Sequence[LedgerRange], keep_tombstones_since_ms: int | None,
                     bucket: BucketConfig | None = None, *, chunks: bool = False,
                     chunks_seen: Any = None) -> Callable[[Any], Any]:
    """The function ``mapInArrow`` runs on the executors over the pieces' numbers: each
    piece's phase-one keyed rows (``chunks``: its chunk rows) from its ledger's key index
    (``compactor.spark.index_scan``), a key's earlier rows dropped across the task's pieces
    (``index_scan.TaskKeyedRows``). ``chunks_seen``, a Spark accumulator, is given the
    count of each keyed piece's chunk rows (the driver skips the chunk pass when none)."""
    def read(batches: Any) -> Any:
        from compactor.spark import index_scan

        if chunks:
            columns: tuple[str, ...] = index_scan.CHUNK_COLUMNS
        else:
            columns = index_scan.PHASE_ONE_COLUMNS + (() if keep_tombstones_since_ms is None else ("publish_time",))
        held, last = index_scan.TaskKeyedRows(), index_scan.LastIndex()
        for batch in batches:
            for number in batch.column(0).to_pylist():
                index = index_scan.PieceIndex(ledgers_root, pieces[number], columns, bucket, last)
                try:
                    if chunks:
                        yield from index_scan.chunk_batches(index, number)
                        continue
                    if chunks_seen is not None:
                        chunks_seen.add(index_scan.chunk_rows(index))
                    keyed = index_scan.keyed_rows(index, number, keep_tombstones_since_ms)
                finally:
                    index.close()
                yield from held.add(*keyed)
        yield from held.flush()

    return read


def _pieces_frame(spark: Any, request: RewriteInput, specs: Sequence[GroupSpec], tasks: int, *, chunks: bool,
                  chunks_seen: Any = None) -> Any:
    """Phase one's rows (``index_scan.PHASE_ONE_ROWS_DDL``) of every piece, read by ``tasks``
    tasks (1 to the pieces' count; each a contiguous run of pieces: a Python task's start
    costs tens of ms)."""
    from compactor.spark.index_scan import PHASE_ONE_ROWS_DDL

    pieces = [piece for spec in specs for piece in spec.pieces]
    read = phase_one_reader(_executor_root(request), pieces, request.keep_tombstones_since_ms, request.bucket,
                            chunks=chunks, chunks_seen=chunks_seen)
    return spark.range(0, len(pieces), 1, numPartitions=tasks).mapInArrow(read, PHASE_ONE_ROWS_DDL)


def _latest(spark: Any, request: RewriteInput, specs: Sequence[GroupSpec], tasks: int, chunks_seen: Any) -> Any:
    """Phase one's aggregation: each live key's latest ``v`` (its greatest, unless that
    deletes the key), in Spark's hash aggregate over plain longs."""
    from pyspark.sql import functions as F

    keyed = _pieces_frame(spark, request, specs, tasks, chunks=False, chunks_seen=chunks_seen)
    keyed = keyed.repartition(tasks, "h1", "h2")
    return keyed.groupBy("h1", "h2").agg(F.max("v").alias("v")).where(F.col("v").bitwiseAND(1) == 0).select("v")


def _group_of(specs: Sequence[GroupSpec], seq: Any) -> Any:
    """The group of the piece of the stream place ``seq`` (groups are contiguous runs of
    pieces: the count of groups starting at or before it, less one)."""
    from pyspark.sql import functions as F

    from compactor.spark.index_scan import ROW_BITS

    piece = F.shiftright(seq, ROW_BITS)
    starts = F.array(*[F.lit(spec.first_piece).cast("bigint") for spec in specs])
    return (F.size(F.filter(starts, lambda start: start <= piece)) - 1).cast("int")


def _decisions(spark: Any, latest: Any, request: RewriteInput, specs: Sequence[GroupSpec], chunk_tasks: int) -> Any:
    """The decision rows ``(grp, kind, seq)`` of every group: the retained places, the
    dropped chunks (read by ``chunk_tasks`` tasks; 0: phase one saw no chunk, there are
    none), and one presence row per group (so that every group's task runs)."""
    from pyspark.sql import functions as F

    from compactor.spark.index_scan import FLAG_BITS

    retained = latest.select(F.shiftright("v", FLAG_BITS).alias("seq"), F.lit(DECISION_RETAINED).alias("kind"))
    if chunk_tasks:
        dropped = _dropped_chunks(spark, latest, request, specs, chunk_tasks).select(
            "seq", F.lit(DECISION_DROPPED_CHUNK).alias("kind"))
        retained = retained.unionByName(dropped)
    placed = retained.select(_group_of(specs, F.col("seq")).alias("grp"), "kind", "seq")
    present = spark.createDataFrame([(spec.index, DECISION_FIGURES, None) for spec in specs],
                                    "grp int, kind int, seq bigint")
    return placed.unionByName(present)


def _dropped_chunks(spark: Any, latest: Any, request: RewriteInput, specs: Sequence[GroupSpec], tasks: int) -> Any:
    """The chunks dropped with their chunked message (``compactor.local.chunks``), as ``seq``:
    each chunk's instance completes at the first last chunk of its uuid at or after it (a
    window over the uuid's chunks, in stream order); a completed keyed instance survives
    iff that last chunk is its key's latest (in ``latest``), a key-less one iff
    ``retain_null_key``; a pending one always does."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from compactor.spark.index_scan import FLAG_BITS

    chunks = _pieces_frame(spark, request, specs, tasks, chunks=True)
    following = Window.partitionBy("h1", "h2").orderBy("v").rowsBetween(Window.currentRow, Window.unboundedFollowing)
    is_last = F.shiftright("v", 1).bitwiseAND(1) == 1
    every = (chunks.withColumn("end", F.min(F.when(is_last, F.col("v"))).over(following))
             .where(F.col("end").isNotNull())
             .select(F.shiftright("v", FLAG_BITS).alias("seq"), F.shiftright("end", FLAG_BITS).alias("end_seq"),
                     (F.col("end").bitwiseAND(1) == 1).alias("keyless")))
    keyless = every.where(F.col("keyless") & F.lit(not request.retain_null_key))
    retained_ends = latest.where(F.shiftright("v", 1).bitwiseAND(1) == 1).select(
        F.shiftright("v", FLAG_BITS).alias("end_seq"))
    keyed = every.where(~F.col("keyless")).hint("merge").join(retained_ends, ["end_seq"], "left_anti")
    return keyless.select("seq").unionByName(keyed.select("seq"))


def _delete(ledgers: OutputLedgers, ids: Sequence[int]) -> None:
    """Delete reserved ledgers (whose files may or may not exist); an id that cannot be
    deleted is an orphan, collected at the next start."""
    for ledger_id in ids:
        try:
            ledgers.delete(ledger_id)
        except Exception as error:  # noqa: BLE001 - an orphan now
            log.warning("could not delete unpublished compacted ledger %d: %s", ledger_id, error)


@contextlib.contextmanager
def _settled_on_failure(spark: Any, job_group: str, timeout_s: float = SETTLE_TIMEOUT_S) -> Iterator[None]:
    """Run the block's Spark jobs in ``job_group``; if it fails, cancel them and wait
    (bounded) until none of their tasks runs, so that the caller's delete of the reserved
    ledgers comes after every write of the run. A failed stage aborts its job at once while
    the stage's other tasks still run: one may rename its ledger into place afterwards."""
    context = spark.sparkContext
    context.setJobGroup(job_group, "compactd: compaction rewrite")
    try:
        yield
    except BaseException:
        _wait_for_tasks(context, job_group, timeout_s)
        raise
    finally:
        context._jsc.clearJobGroup()  # PySpark has no clearJobGroup of its own


def _wait_for_tasks(context: Any, job_group: str, timeout_s: float) -> None:
    try:
        context.cancelJobGroup(job_group)
        tracker = context.statusTracker()
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = [tracker.getJobInfo(job_id) for job_id in tracker.getJobIdsForGroup(job_group)]
            stages = [tracker.getStageInfo(stage_id) for job in jobs if job is not None for stage_id in job.stageIds]
            if not any(stage is not None and stage.numActiveTasks > 0 for stage in stages):
                return
            if time.monotonic() >= deadline:
                log.warning("spark rewrite: tasks of %s still run after %.0f s; a ledger they write is an orphan "
                            "until the next start", job_group, timeout_s)
                return
            time.sleep(0.05)
    except Exception as error:  # noqa: BLE001 - the session is gone: its tasks with it
        log.warning("spark rewrite: could not wait for the tasks of %s: %s", job_group, error)


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
