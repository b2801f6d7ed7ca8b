"""The compaction run: carries out the pure phases against storage and publishes the result.

One run of ``Compactor.compact(topic)``, in order (reference ``pulsar-compaction.md`` §1):

1. Take the topic's durable ``__compaction`` cursor (``CompactedTopic.cursor``, opened
   when the topic was restored). Its mark-delete position is the current horizon.
2. Stop marker = the topic's last confirmed entry *now*; later appends wait for the next
   run. With a minimum lag (``minCompactionLagMs``, ``compactor.runs.lag``) the raw entries
   after the horizon are read for their publish times up to the first one published
   within the lag, and the stop marker moves back to the entry before it. Nothing after
   the horizon (an empty topic, nothing new, or nothing old enough): no ledger is written
   and the run succeeds with ``ledger_id = -1``.
3. Phase one over the input stream: the previous compacted view's entries (with their
   original positions), then the raw entries after the horizon up to the stop marker.
   The engine (``compactor.engine.choose_engine``: ``local``, ``spark``, or ``auto``)
   decides where. ``local``: here, where every store read must finish within
   ``phase_one_read_timeout_s``. The local engine keeps its key map within
   ``memory_budget_bytes`` (``compactor.local.rounds``): when the keys after the horizon would
   pass it, phase one stops where the map filled, and steps 4 and 5 run up to there as a
   *round*; the next round starts from the view just published, until the view reaches
   the stop marker. Every round is published like a whole run, so a run that fails or
   dies between rounds leaves the last round's view serving. ``spark``: steps 3 and 4 run
   whole on the Spark executors over the same ledgers (``compactor.spark.engine``), which
   write one sealed compacted ledger per group of the input; step 5 publishes their list.
   With object storage (the store's ``LedgerFiles.bucket``) the topic is rolled over and
   every input ledger put in the bucket first (``compactor.runs.bucket_input``); the
   executors read and write only there, and the manifest records the view ``in_bucket``.
4. Phase two over the same stream writes the survivors to a new ledger (metadata:
   component ``compacted-ledger``, the topic, ``compactedTo``), each entry carrying its
   original message id and, for batches, the surviving-slot mask. If every key was
   deleted, the new ledger is empty and is published all the same.
5. Publish (``_publish``, ``CompactedTopic.publish``): seal the new ledger (the local
   engine writes one; a run may hand over several, in stream order, read as one view:
   ``compactor.view.view``) → **one transaction** persisting the cursor's mark-delete = stop
   marker with ``CompactedTopicLedger`` = the first new ledger, the manifest = every new
   ledger, and the previous view's ledgers as garbage (``compactor.view.manifest``) → swap the
   in-memory view → the previous ledgers are deleted after the grace period (at once
   without one). A run whose cursor was deleted, or whose previous view was replaced,
   meanwhile fails here.

**Incremental runs** (``CompactionConfig.incremental``, the default; ``compact(rewrite=True)``
forces a full rewrite). Steps 3 and 4 of the local engine read only the raw entries after
the horizon (no previous view: every round is a round over its backlog alone), and the
new ledger is *appended* to the previous view's ledgers. Before the publish,
``compactor.local.supersede`` finds what the round's backlog superseded in the older
ledgers from key indexes and records it as dead marks (``compactor.view.marks``), stored in
step 5's transaction with the manifest; nothing is garbage. A backlog or view holding a
chunk (``NeedsRewrite``) makes the run delete its ledger and rewrite instead. After the
last round, one **merge step** (``_merge``, policy ``compactor.runs.merges``) copies the live
entries of each group of ledgers to plan into one new ledger each and publishes the view
with them in place (same horizon, same transaction and crash rules; the replaced
ledgers become garbage). A full rewrite over a view with marks reads it through them: the
previous view's dead entries are skipped and its dead slots emptied (``CompactedView.read``
with ``emptied``, ``RoundRequest.dead``). On the Spark engine an incremental run's job
reads the backlog alone and the driver marks what its ledgers supersede (``_spark_run``);
a Spark rewrite over a marked view first merges the marked ledgers (its executors read
ledgers whole).

This module is over the project's 600 lines on purpose: it is the one procedure of a run
(plan, the engine's phases, marking, the merge step, publish), and every path ends in the
same ``_publish`` with the same clean-up of unpublished ledgers; the pure parts already
live beside it (``merges``, ``held``, ``bucket_input``, ``run_tally``, the engines).

Every read batch and every append of a run is charged to the run's I/O throttle
(``compactor.throttle``, ``compactionMaxBytesPerSecond``; unlimited by default), and each
run ends with one log line (``compactor.runs.run_log``).

``compact`` is the inside of a run, a straight procedure that records its outcome in the
topic's ``CompactionRecord``. Who may run when (one run per topic, the slots, the queue,
the persisted status) is ``compactor.runs.runs``'s; calling ``compact`` directly (tests,
benchmarks) skips it.

Any failure (an ``Exception``) before the transaction deletes the new ledgers and leaves the
previous view serving. A crash (the process dying, ``SimulatedCrash`` in tests) leaves at
worst unreferenced ledgers, which ``collect_orphans`` removes at the next start (with the
replaced ledgers whose grace period is over): the persisted state always names complete,
sealed compacted ledgers or none.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from compactor.engine import (
    SPARK_DRIVER_BYTES_PER_KEY,
    EngineName,
    LedgerRange,
    RewriteEngine,
    RewriteInput,
    choose_engine,
    raw_ranges,
)
from compactor.errors import CompactionTimeoutError, MalformedEntryError, SparkEngineError
from compactor.local.rounds import RoundPhaseOne, capacity_keys, round_phase_one, round_phase_two
from compactor.local.supersede import (
    BacklogKeys,
    Indexes,
    NeedsRewrite,
    backlog_keys,
    ledger_counts,
    mark_dead,
)
from compactor.local.worker import RoundReport, RoundRequest, RoundWorkers, run_round
from compactor.record import LATENCY_BUCKETS_MS, RunFigures
from compactor.runs.bucket_input import stage_input
from compactor.runs.held import HeldLedgers, HoldingOutput
from compactor.runs.lag import stop_before_young, young_after
from compactor.runs.merges import LedgerShape, plan_merges
from compactor.runs.run_log import log_run, log_run_failed
from compactor.runs.run_tally import Counted, Progress, RoundTally, RunIo, no_progress, took
from compactor.throttle import Throttle
from compactor.view.manifest import CompactedManifests
from compactor.view.marks import LedgerMarks
from compactor.view.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION, CompactedTopic
from compactor.view.view import (
    READ_BATCH_ENTRIES_MAX,
    CompactedEntry,
    CompactedView,
    encode_compacted_entry,
)
from cursor.cursor import ManagedCursor
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.errors import LedgerNotFoundError
from ledger.managed_ledger import Entry, LedgerSnapshot
from ledger.position import Position
from ledger.storage.powers import LedgerFiles
from message.entry import parse_header

__all__ = ["MEMORY_BUDGET_BYTES_DEFAULT", "MERGE_DEAD_RATIO_DEFAULT", "MERGE_FAN_IN_DEFAULT", "CompactionConfig", "Compactor", "Progress", "collect_orphans",
           "sweep_compacted_garbage"]

log = logging.getLogger(__name__)

# Pulsar's MAX_OUTSTANDING: appends to the new compacted ledger in flight at once.
OUTSTANDING_APPENDS_MAX = 500
# Default memory the local key map may take before a run goes in rounds: 1 GiB holds about
# 45 million keys at 24 bytes each.
MEMORY_BUDGET_BYTES_DEFAULT = 1 << 30
# Kafka's min.cleanable.dirty.ratio, and the tiered merge's fan-in.
MERGE_DEAD_RATIO_DEFAULT = 0.5
MERGE_FAN_IN_DEFAULT = 4


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """Settings of the compactor (broker.conf names in the comments). These defaults are
    the broker's: ``api.config.Settings`` takes its compaction defaults from here.

    Attributes:
        retain_null_key: keep key-less messages (``topicCompactionRetainNullKey``, false).
        phase_one_read_timeout_s: limit on each phase-one read
            (``brokerServiceCompactionPhaseOneLoopTimeInSeconds``, 30).
        read_batch_entries: raw entries per store read.
        engine: which engine runs phase one: ``local``, ``spark`` or ``auto``
            (``compactor.engine.choose_engine``: ``auto`` moves a run to Spark only where
            Spark saves local rounds without costing the broker more than the budget).
        spark_master: the Spark master URL of the ``spark`` engine.
        memory_budget_bytes: the most the local engine's key map holds (24 bytes a key):
            beyond it the run goes in rounds (``compactor.local.rounds``).
        worker_processes: run the local engine's rounds in up to this many child processes
            (``compactor.local.worker``), off this interpreter, where the store has ledger files
            (``LedgerStore.file_powers``); 0 runs them here.
        key_index: where the store has ledger files, rounds run over the ledgers' key
            indexes (``compactor.local.indexed``, ``compactor.local.key_index``), building the missing
            ones, in a worker process or here; off, they parse every entry twice.
        incremental: a local run compacts only the backlog into a new ledger and marks what
            it supersedes in the older ones dead (``compactor.local.supersede``), then merges
            (``compactor.runs.merges``); off, every run rewrites the whole view.
        merge_dead_ratio: a ledger whose dead share passes it is rewritten (Kafka's
            ``min.cleanable.dirty.ratio``).
        merge_fan_in: the tiered merge's fan-in ``F``: at most ``F - 1`` ledgers per tier.
    """

    retain_null_key: bool = False
    phase_one_read_timeout_s: float = 30.0
    read_batch_entries: int = 1000
    engine: EngineName = "auto"
    spark_master: str = "local[*]"
    memory_budget_bytes: int = MEMORY_BUDGET_BYTES_DEFAULT
    worker_processes: int = 0
    key_index: bool = True
    incremental: bool = True
    merge_dead_ratio: float = MERGE_DEAD_RATIO_DEFAULT
    merge_fan_in: int = MERGE_FAN_IN_DEFAULT


class Compactor:
    """Runs compactions with one configuration; safe to share between topics."""

    def __init__(
        self, config: CompactionConfig | None = None, *, clock: Callable[[], float] = time.time,
        spark_engine: RewriteEngine | None = None, throttle: Callable[..., Throttle] = Throttle,
    ) -> None:
        """``spark_engine`` runs phase one when the spark engine is chosen; by default a
        ``compactor.spark.SparkEngine`` on ``config.spark_master``, made on first use.
        ``clock`` (seconds since the epoch) gives each run its "now" (tombstone retention,
        the minimum lag); ``throttle(bytes_per_second, interrupt=event)`` makes each run's
        I/O throttle (tests pass one on a fake clock)."""
        self.config = config or CompactionConfig()
        self._clock = clock
        self._throttle = throttle
        self._interrupt = threading.Event()
        self._spark_engine = spark_engine
        self._owns_spark_engine = False
        self._spark_lock = threading.Lock()
        self._workers = RoundWorkers(self.config.worker_processes) if self.config.worker_processes > 0 else None
        self.held = HeldLedgers()  # what Spark runs in flight hold in the bucket (orphan collection spares it)

    def compact(
        self, topic: CompactedTopic, *, delete_retention_ms: int = 0, progress: Progress | None = None,
        min_compaction_lag_ms: int = 0, max_bytes_per_second: int = 0, rewrite: bool = False,
    ) -> RunFigures:
        """Run one compaction of ``topic`` and record its outcome; raises on failure.

        ``rewrite`` forces a full rewrite (one new view of every survivor; every old ledger
        garbage); by default a local run is incremental when ``config.incremental`` is
        (the module docstring's "Incremental runs").
        ``delete_retention_ms`` > 0 keeps tombstones published in the last that many ms
        (measured from this run's start) as their keys' latest values
        (``compactor.local.algorithm``, tombstone retention); 0 drops every tombstone, as Pulsar.
        ``min_compaction_lag_ms`` > 0 stops the run before the first raw entry published
        within that many ms of its start (``compactor.runs.lag``); 0 holds nothing back.
        ``max_bytes_per_second`` > 0 throttles the run's reads and appends to that rate
        (``compactor.throttle``; the spark engine's phase-one reads, done by its executors,
        are not throttled); 0 is unlimited. The time waited is the figures' ``throttled_s``.
        ``progress(phase, entries_done, entries_total)`` is called from the run's thread
        as each phase ("phase-one", "phase-two") goes through the input stream: at its
        start, after each read batch, and at its end; a run in several rounds goes through
        both phases once per round.
        """
        started = time.monotonic()
        now_ms = self._now_ms()
        cutoff = now_ms - delete_retention_ms if delete_retention_ms > 0 else None
        run = RunIo(self._throttle(max_bytes_per_second, interrupt=self._interrupt),
                     young_after(now_ms, min_compaction_lag_ms))
        try:
            figures = self._run(topic, started, cutoff, progress or no_progress, run,
                                incremental=self.config.incremental and not rewrite)
        except Exception as error:
            log_run_failed(topic.name, error, time.monotonic() - started)
            topic.record.failed(error, time.monotonic() - started, self._now_ms())
            raise
        topic.record.succeeded(figures, self._now_ms())
        log_run(topic.name, figures)
        return figures

    def _run(
        self, topic: CompactedTopic, started: float, cutoff: int | None, progress: Progress, run: RunIo, *,
        incremental: bool,
    ) -> RunFigures:
        cursor = topic.cursor
        previous = topic.view  # raises CompactedLedgerMissingError: never publish a partial view
        snapshot = topic.ledger.snapshot()  # the list and the stop marker, at one instant
        stop = snapshot.last_confirmed
        horizon = cursor.mark_delete_position
        if stop.entry_id >= 0 and stop > horizon and run.young_after_ms is not None:
            stop = self._lag_stop(topic, horizon, stop, run)
        if stop.entry_id < 0 or stop <= horizon:
            return RunFigures(duration_s=time.monotonic() - started, horizon=str(horizon),
                              throttled_s=run.throttle.throttled_s, io_bytes=run.throttle.charged_bytes)
        backlog = snapshot.entries_between(horizon, stop)
        engine = self._engine(backlog + (previous.entries if previous is not None and not incremental else 0))
        log.debug("%s: phase one on the %s engine", topic.name, engine)
        if engine == "local":
            return self._local_run(topic, _Round(cursor, previous, horizon), started, cutoff, progress, run,
                                   _Planned(snapshot, stop), incremental=incremental)
        if incremental and previous is not None:
            try:
                return self._spark_run(topic, _Round(cursor, previous, horizon), _Planned(snapshot, stop), cutoff,
                                       Counted("phase-one", backlog, progress), started, run, incremental=True)
            except NeedsRewrite as reason:
                log.info("%s: rewriting the view whole: %s", topic.name, reason)
        total = (previous.entries if previous is not None else 0) + backlog
        if previous is not None and previous.dead_messages:  # the executors read ledgers whole: merge first
            files = topic.ledger.store.file_powers()
            previous, _ = self._merge(topic, cursor, previous, [
                (place, place) for place, ledger_id in enumerate(previous.ledger_ids)
                if (marks := previous.marks_of(ledger_id)) is not None and marks.any_dead], run,
                in_bucket=files is not None and files.bucket is not None)
        return self._spark_run(topic, _Round(cursor, previous, horizon), _Planned(snapshot, stop), cutoff,
                               Counted("phase-one", total, progress), started, run)

    def _spark_run(
        self, topic: CompactedTopic, start: _Round, planned: _Planned, cutoff: int | None, counted: Counted,
        started: float, run: RunIo, *, incremental: bool = False,
    ) -> RunFigures:
        """The run on the spark engine: both phases in one Spark job over the same stream as
        ``_stream`` reads, writing the compacted ledgers on the executors; the driver
        publishes their list. ``phase_one_s`` is the job's whole time. ``incremental``: the
        job's input is the backlog alone, its ledgers are appended to the previous view and
        the driver marks what they supersede (``_round_view``; ``NeedsRewrite``, with the
        job's ledgers deleted, when it cannot), then the merge step runs."""
        cursor, previous, horizon = start
        stop = planned.stop
        files = topic.ledger.store.file_powers()
        if files is None:
            raise SparkEngineError(f"{topic.name}: the spark engine reads and writes ledger files, and this store "
                                   "has none")
        ranges = [] if previous is None or incremental else [
            LedgerRange(ledger_id, 0, entries - 1, compacted=True) for ledger_id, entries in previous.segments if entries]
        backlog = raw_ranges(planned.snapshot.ledgers, horizon, stop)
        ranges += backlog
        with self.held.holding(sorted({piece.ledger_id for piece in ranges})) as hold:
            if files.bucket is not None:  # the executors see the bucket only: every input goes there first
                stage_input(topic.ledger, files, files.bucket, ranges, now_ms=self._now_ms())
            request = RewriteInput(files.root, tuple(ranges), stop, _compacted_metadata(topic, stop),
                                   self.config.retain_null_key, cutoff, files.bucket)
            counted.start()
            result = self._spark().compact(request, HoldingOutput(files, hold))
            counted.done = result.entries_read
            counted.end()
            job_s = time.monotonic() - started
            marked = RoundTally(incremental=incremental)
            try:
                ledger_ids, marks = self._round_view(topic, previous, backlog, dict.fromkeys(result.ledger_ids),
                                                     cutoff, marked, incremental=incremental, run=run)
            except NeedsRewrite:
                for ledger_id in result.ledger_ids:
                    _delete_quietly_store(topic, ledger_id)
                raise
            view = self._publish(topic, cursor, stop, ledger_ids, previous, marks,
                                 in_bucket=files.bucket is not None)
        merged: tuple[int, int, int] = (0, 0, 0)
        if incremental:
            view, merged = self._merge(topic, cursor, view, self._planned_merges(view), run,
                                       in_bucket=files.bucket is not None)
        duration_s = time.monotonic() - started
        keys_kept = _live_keys(view) if incremental else None
        return RunFigures(
            engine="spark", horizon=str(stop), keys_kept=result.keys_kept if keys_kept is None else keys_kept,
            throttled_s=run.throttle.throttled_s, io_bytes=run.throttle.charged_bytes,
            ledger_id=view.ledger_ids[-1] if incremental else result.ledger_ids[0],
            removed_events=result.messages_read - result.messages_kept + marked.dead_marked,
            entries_read=result.entries_read, messages_read=result.messages_read,
            bytes_read=result.bytes_read, entries_written=result.entries_written + merged[2],
            bytes_written=result.bytes_written + merged[1], phase_one_s=job_s, phase_two_s=duration_s - job_s,
            duration_s=duration_s, key_map_bytes=0, append_latency_counts=(), rounds=1,
            dead_marked=marked.dead_marked, merged_ledgers=merged[0],
        )

    def _local_run(
        self, topic: CompactedTopic, start: _Round, started: float, cutoff: int | None, progress: Progress,
        run: RunIo, planned: _Planned, *, incremental: bool,
    ) -> RunFigures:
        """The run on the local engine: rounds (``compactor.local.rounds``) from ``start``, each
        published, until the view reaches the planned stop; the figures add up every round's.
        ``incremental``: each round compacts its backlog alone and marks what it supersedes
        (``_round_view``), and the run ends with its merge step (``_merge``).
        Rounds run over the ledger files (a worker process, or the key indexes here) where
        the store has them (``LedgerStore.file_powers``), else through the store."""
        snapshot, stop = planned
        rounds = RoundTally(incremental=incremental)
        at = start
        files = topic.ledger.store.file_powers()
        execute: Callable[[RoundRequest], RoundReport] | None = None
        if files is not None and self._workers is not None:
            execute = self._workers.run
        elif files is not None and self.config.key_index:
            execute = functools.partial(run_round, throttle=run.throttle)  # here, over the indexes
        while True:
            cursor, previous, horizon = at
            clean = None if incremental else previous  # an incremental round reads the backlog only
            total = (clean.entries if clean is not None else 0) + snapshot.entries_between(horizon, stop)
            if files is not None and execute is not None:
                report = self._worker_round(topic, _Round(cursor, clean, horizon), _Planned(snapshot, stop), cutoff,
                                            (Counted("phase-one", total, progress),
                                             Counted("phase-two", total, progress)), run, (files, execute),
                                            report_keys=incremental and previous is not None)
                _adopt(files, report)
                round_stop, figures = report.stop, report.figures
                keys = None if report.keys is None else BacklogKeys(*report.keys)
            else:
                round_started = time.monotonic()
                one = self._local_phase_one(topic, clean, horizon, stop, cutoff,
                                            Counted("phase-one", total, progress), run.throttle)
                # A round that read to the end covers up to ``stop``, as a run in one piece does.
                round_stop = one.stop if one.filled and one.stop is not None else stop
                assert horizon < round_stop <= stop
                rounds.phase_one_s += time.monotonic() - round_started
                written = self._phase_two(
                    topic, _Round(cursor, clean, horizon), round_stop,
                    functools.partial(round_phase_two, one=one, retain_null_key=self.config.retain_null_key,
                                      keep_tombstones_since_ms=cutoff),
                    Counted("phase-two", total, progress), rounds.latencies, run.throttle)
                report, figures, keys = None, one.figures(*written), None
            new = LedgerMarks.none(figures.entries_written, figures.messages_kept, figures.keys_kept)
            try:
                ledger_ids, marks = self._round_view(topic, previous, raw_ranges(snapshot.ledgers, horizon, round_stop),
                                                     {figures.ledger_id: new}, cutoff, rounds,
                                                     incremental=incremental, run=run, keys=keys)
            except NeedsRewrite as reason:
                _delete_quietly_store(topic, figures.ledger_id)
                log.info("%s: rewriting the view whole: %s", topic.name, reason)
                incremental = rounds.incremental = False
                continue
            at = _Round(cursor, self._publish(topic, cursor, round_stop, ledger_ids, previous, marks), round_stop)
            if report is not None:
                rounds.add_report(report)
            else:
                rounds.add(figures, one.key_map_bytes_max)
            if round_stop >= stop:
                break
            log.info("%s: compacted up to %s in round %d (the key map reached the memory budget); "
                     "going on to %s", topic.name, round_stop, rounds.count, stop)
        if incremental and at.previous is not None:
            view, merged = self._merge(topic, cursor, at.previous, self._planned_merges(at.previous), run)
            rounds.merged_ledgers, rounds.bytes_written = merged[0], rounds.bytes_written + merged[1]
            rounds.entries_written += merged[2]
            rounds.keys_live, rounds.newest_ledger_id = _live_keys(view), view.ledger_ids[-1]
        return rounds.figures(started, stop, run)

    def _round_view(
        self, topic: CompactedTopic, previous: CompactedView | None, backlog: Sequence[LedgerRange],
        new: Mapping[int, LedgerMarks | None], cutoff: int | None, rounds: RoundTally, *, incremental: bool,
        run: RunIo, keys: BacklogKeys | None = None,
    ) -> tuple[list[int], dict[int, LedgerMarks]]:
        """The ledgers and marks of a round's view: the ``new`` ledgers alone (a rewrite), or
        the previous view's ledgers with the marks the round's ``backlog`` (its raw ranges)
        changed, then the new ones (``compactor.local.supersede``; ``NeedsRewrite`` when it
        cannot). ``new``: the new ledgers in stream order, each with its marks (None: its
        counts are not known; they are read from its index when it is first marked).
        ``keys``: the backlog's keys when the round already has them (a round over
        indexes), else they are read from the backlog's indexes."""
        fresh = {ledger_id: marks for ledger_id, marks in new.items() if marks is not None}
        if not incremental or previous is None:
            return list(new), fresh
        indexes = Indexes(topic.ledger.store, run.throttle.charge)  # the key indexes read: io_bytes
        try:
            keys = backlog_keys(indexes, backlog) if keys is None else keys
            older = [(LedgerRange(i, 0, entries - 1, compacted=True), previous.marks_of(i))
                     for i, entries in previous.segments if entries]
            changed, dead_marked = mark_dead(indexes, older, keys, keep_tombstones_since_ms=cutoff,
                                             retain_null_key=self.config.retain_null_key)
            for ledger_id in (i for i, marks in new.items() if marks is None):  # a Spark job's: counted here
                entries = topic.ledger.store.last_add_confirmed(ledger_id) + 1
                flags = indexes.load(LedgerRange(ledger_id, 0, entries - 1, compacted=True), ("flags",))["flags"] \
                    if entries else np.empty(0, np.uint8)
                fresh[ledger_id] = LedgerMarks.none(entries, *ledger_counts(flags))
        finally:
            indexes.close()
        rounds.dead_marked += dead_marked
        empty = {i: LedgerMarks.none(0, 0, 0) for i, entries in previous.segments if not entries}
        return [*previous.ledger_ids, *new], {**empty, **previous.marks, **changed, **fresh}

    def _planned_merges(self, view: CompactedView) -> list[tuple[int, int]]:
        """The merge step's groups over ``view`` (``compactor.runs.merges``)."""
        shapes = []
        for ledger_id, size in zip(view.ledger_ids, view.sizes, strict=True):
            marks = view.marks_of(ledger_id)
            shapes.append(LedgerShape(size, 0.0 if marks is None else marks.dead_ratio))
        return plan_merges(shapes, dead_ratio=self.config.merge_dead_ratio, fan_in=self.config.merge_fan_in)

    def _merge(
        self, topic: CompactedTopic, cursor: ManagedCursor, view: CompactedView, groups: Sequence[tuple[int, int]],
        run: RunIo, *, in_bucket: bool = False,
    ) -> tuple[CompactedView, tuple[int, int, int]]:
        """Rewrite each group ``(first, last)`` of ``view``'s ledgers (places, inclusive) as
        one new ledger of their live entries, dead slots emptied, and publish the view with
        them in the groups' places (same horizon); the view, and (ledgers merged, bytes and
        entries written). A merge is an ordinary run's publish: on failure its new ledgers
        are deleted and ``view`` keeps serving. ``in_bucket`` (a view the Spark engine keeps
        in the object store): each new ledger is uploaded there and its local file let go
        before the publish, held against the orphan collection until then
        (``compactor.runs.held``), so the view stays where the executors read it."""
        if not groups:
            return view, (0, 0, 0)
        store = topic.ledger.store
        files = store.file_powers() if in_bucket else None
        ledger_ids, marks = list(view.ledger_ids), dict(view.marks)
        written_bytes = written_entries = 0
        made: list[int] = []
        with self.held.holding() as hold:
            try:
                for first, last in reversed(groups):  # later places first: earlier ones keep their place
                    merged_ids = view.ledger_ids[first:last + 1]
                    ledger_id = store.create(_compacted_metadata(topic, view.horizon), durable_at_seal=True)
                    made.append(ledger_id)
                    hold([ledger_id])
                    entries, size, messages = self._write(topic, ledger_id, _live_entries(view, first, last),
                                                          [0] * (len(LATENCY_BUCKETS_MS) + 1), run.throttle)
                    store.close(ledger_id)
                    if files is not None and files.bucket is not None:
                        files.upload_sealed(ledger_id)
                        files.drop_local(ledger_id)
                    keys = sum(m.live_keys for i in merged_ids if (m := view.marks_of(i)) is not None)
                    ledger_ids[first:last + 1] = [ledger_id]
                    for i in merged_ids:
                        marks.pop(i, None)
                    marks[ledger_id] = LedgerMarks.none(entries, messages, keys)
                    written_bytes, written_entries = written_bytes + size, written_entries + entries
            except Exception:
                for ledger_id in made:
                    _delete_quietly_store(topic, ledger_id)
                raise
            merged = self._publish(topic, cursor, view.horizon, ledger_ids, view, marks,
                                   in_bucket=files is not None and files.bucket is not None)
        log.info("%s: merged %d ledgers of the view into %d", topic.name,
                 sum(last - first + 1 for first, last in groups), len(groups))
        return merged, (sum(last - first + 1 for first, last in groups), written_bytes, written_entries)

    def _worker_round(
        self, topic: CompactedTopic, start: _Round, planned: _Planned, cutoff: int | None,
        counted: tuple[Counted, Counted], run: RunIo,
        over: tuple[LedgerFiles, Callable[[RoundRequest], RoundReport]], *, report_keys: bool = False,
    ) -> RoundReport:
        """One round of the local engine as ``compactor.local.worker`` runs it over the
        store's ledger ``files`` (``execute``: in a worker process, or here): its ledger id
        reserved here, then both phases and the sealed ledger (``report_keys``: and the keys
        its raw input writes, when it ran over indexes)."""
        _, previous, horizon = start
        snapshot, stop = planned
        files, execute = over
        ranges = [] if previous is None else [
            LedgerRange(ledger_id, 0, entries - 1, compacted=True) for ledger_id, entries in previous.segments if entries]
        ranges += raw_ranges(snapshot.ledgers, horizon, stop)
        [ledger_id] = files.reserve_ids(1)
        dead = () if previous is None else tuple(previous.marks.items())
        request = RoundRequest(
            files.root, tuple(ranges), horizon, stop, ledger_id,
            tuple(_compacted_metadata(topic, stop).items()), self.config.memory_budget_bytes,
            self.config.retain_null_key, cutoff, run.throttle.bytes_per_second, self.config.key_index, files.bucket,
            dead, report_keys)
        for phase in counted:  # both phases run in one call: a bar each, whole at its end
            phase.start()
        try:
            report = execute(request)
        except BaseException:
            _delete_quietly(files, ledger_id)  # a complete file may be there, or none
            raise
        for phase in counted:
            phase.done = report.figures.entries_read
            phase.end()
        return report

    # -- the input stream ---------------------------------------------------------------

    def _stream(
        self, topic: CompactedTopic, previous: CompactedView | None, horizon: Position, stop: Position,
        read: Callable[[Callable[[], list[Entry]]], list[Entry]], throttle: Throttle,
    ) -> Iterator[Entry]:
        """Previous compacted entries, then raw entries in ``(horizon, stop]``; each read
        batch is charged to ``throttle`` before it is handed on."""
        if previous is not None:
            step = self.config.read_batch_entries
            for first in range(0, previous.entries, step):
                last = min(previous.entries - 1, first + step - 1)
                yield from _charged(throttle, read(functools.partial(_read_previous, previous, first, last)))
        yield from self._raw(topic, horizon, stop, read, throttle)

    def _raw(
        self, topic: CompactedTopic, horizon: Position, stop: Position,
        read: Callable[[Callable[[], list[Entry]]], list[Entry]], throttle: Throttle,
    ) -> Iterator[Entry]:
        """The raw entries in ``(horizon, stop]``, read in batches charged to ``throttle``."""
        ledger = topic.ledger
        position = ledger.next_valid_position(horizon)
        while position <= stop:
            batch = read(functools.partial(ledger.read_entries, position, self.config.read_batch_entries, end=stop))
            if not batch:
                break
            yield from _charged(throttle, batch)
            position = ledger.next_valid_position(batch[-1].position)

    def _lag_stop(self, topic: CompactedTopic, horizon: Position, stop: Position, run: RunIo) -> Position:
        """The stop marker the minimum lag allows (``compactor.runs.lag``): the raw entries after
        the horizon are read until the first young one."""
        entries = self._raw(topic, horizon, stop, lambda read: read(), run.throttle)
        return stop_before_young(((entry.position, _publish_time(entry.data)) for entry in entries),
                                 run.young_after_ms, horizon=horizon)

    def _engine(self, estimated_keys: int) -> Literal["local", "spark"]:
        """The engine of a run over about ``estimated_keys`` keys (``choose_engine``)."""
        driver_bytes_per_key = getattr(self._spark_engine, "driver_bytes_per_key", SPARK_DRIVER_BYTES_PER_KEY)
        return choose_engine(
            self.config.engine, estimated_keys=estimated_keys, memory_budget_bytes=self.config.memory_budget_bytes,
            spark_available=_spark_installed(), driver_bytes_per_key=driver_bytes_per_key,
            spark_master=self.config.spark_master,
        )

    def _spark(self) -> RewriteEngine:
        with self._spark_lock:
            if self._spark_engine is None:
                from compactor.spark.engine import SparkEngine  # PySpark loads only here

                self._spark_engine = SparkEngine(self.config.spark_master)
                self._owns_spark_engine = True
            return self._spark_engine

    def interrupt(self) -> None:
        """End every throttled wait of the runs in flight, and of any later run: each fails
        with ``CompactionInterruptedError`` (the broker stops; a run that is not waiting on
        its throttle goes on to its end; a round in a worker process is killed)."""
        self._interrupt.set()
        if self._workers is not None:
            self._workers.interrupt()

    def worker_pids(self) -> list[int]:
        """The process ids of the worker processes running this compactor's rounds
        (``compactor.local.worker``; none when rounds run here, or before the first)."""
        return [] if self._workers is None else self._workers.pids()

    def close(self) -> None:
        """Stop the worker processes and the Spark session this compactor started, if any
        (idempotent)."""
        if self._workers is not None:
            self._workers.close()
        with self._spark_lock:
            if not self._owns_spark_engine:
                return
            engine, self._spark_engine, self._owns_spark_engine = self._spark_engine, None, False
        stop = getattr(engine, "stop", None)
        if stop is not None:
            stop()

    def _local_phase_one(
        self, topic: CompactedTopic, previous: CompactedView | None, horizon: Position, stop: Position,
        cutoff: int | None, counted: Counted, throttle: Throttle,
    ) -> RoundPhaseOne:
        """Phase one of a local round: up to ``stop``, or to where the key map fills."""
        timeout_s = self.config.phase_one_read_timeout_s
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="phase-one-read")

        def timed(read: Callable[[], list[Entry]]) -> list[Entry]:
            try:
                return counted(reader.submit(read).result(timeout=timeout_s))
            except FutureTimeoutError:
                raise CompactionTimeoutError(
                    f"{topic.name}: a phase-one read took longer than {timeout_s} s"
                ) from None

        try:
            stream = self._stream(topic, previous, horizon, stop, timed, throttle)
            counted.start()
            result = round_phase_one(stream, horizon=horizon, capacity_keys=capacity_keys(
                self.config.memory_budget_bytes), keep_tombstones_since_ms=cutoff)
            counted.end()
            return result
        finally:
            # A timed-out read may never return: leave it behind, as Pulsar does.
            reader.shutdown(wait=False, cancel_futures=True)

    # -- phase two and publishing -------------------------------------------------------

    def _phase_two(
        self, topic: CompactedTopic, start: _Round, stop: Position, survivors_of: Callable[[Iterator[Entry]], Iterator[CompactedEntry]],
        counted: Counted, latencies: list[int], throttle: Throttle,
    ) -> tuple[int, int, int, int]:
        """Write the survivors (``survivors_of`` the input stream from ``start`` up to
        ``stop``) to a new sealed ledger: (ledger id, entries, bytes, messages)."""
        store = topic.ledger.store
        ledger_id = store.create(_compacted_metadata(topic, stop), durable_at_seal=True)  # of use only once sealed: never queues behind the live topics' syncs
        try:
            stream = self._stream(topic, start.previous, start.horizon, stop, lambda read: counted(read()), throttle)
            counted.start()
            entries, size, messages = self._write(topic, ledger_id, survivors_of(stream), latencies, throttle)
            counted.end()
            store.close(ledger_id)
        except Exception:
            store.delete(ledger_id)
            raise
        return ledger_id, entries, size, messages

    def _write(
        self, topic: CompactedTopic, ledger_id: int, survivors: Iterator[CompactedEntry], latencies: list[int],
        throttle: Throttle,
    ) -> tuple[int, int, int]:
        """Append every survivor, at most OUTSTANDING_APPENDS_MAX in flight: (entries, bytes,
        messages); each append's latency (call to durable) is counted in its bucket of
        ``latencies``, and its bytes are charged to ``throttle`` before it is made."""
        outstanding: deque[Future[int]] = deque()
        entries = size = messages = 0
        for survivor in survivors:
            data = encode_compacted_entry(survivor)
            throttle.charge(len(data))
            appended = topic.ledger.store.append(ledger_id, data)
            appended.add_done_callback(functools.partial(took, time.monotonic(), latencies))
            outstanding.append(appended)
            entries += 1
            size += len(data)
            messages += survivor.messages
            while len(outstanding) >= OUTSTANDING_APPENDS_MAX:
                outstanding.popleft().result()
        while outstanding:
            outstanding.popleft().result()
        return entries, size, messages

    def _publish(
        self, topic: CompactedTopic, cursor: ManagedCursor, stop: Position, ledger_ids: Sequence[int],
        previous: CompactedView | None, marks: Mapping[int, LedgerMarks] | None = None, *,
        in_bucket: bool = False,
    ) -> CompactedView:
        """Publish the sealed ``ledger_ids`` (in stream order: their entries concatenated are
        the compacted stream; ``in_bucket``: written into the object store, where the store
        reads them through its cache), with the dead ``marks`` of its ledgers, as the view up
        to ``stop``, and return it. On any failure
        (``Exception``) every one of ``ledger_ids`` the previous view does not hold is deleted
        and the previous view keeps serving; once published, the previous view's ledgers the
        new one does not hold become garbage (``CompactedTopic.publish``)."""
        store = topic.ledger.store
        try:
            view = CompactedView(store, ledger_ids, stop, marks)
            topic.publish(cursor, view, previous, in_bucket=in_bucket)  # the one transaction
        except Exception:
            held = set(previous.ledger_ids) if previous is not None else set()
            for ledger_id in (i for i in ledger_ids if i not in held):
                try:
                    store.delete(ledger_id)
                except Exception as error:  # noqa: BLE001 - an orphan now: collected at the next start
                    log.warning("%s: could not delete unpublished compacted ledger %d: %s",
                                topic.name, ledger_id, error)
            raise
        return view

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _adopt(files: LedgerFiles, report: RoundReport) -> None:
    """Hand the store the layout of the ledger a round wrote elsewhere (a worker process),
    so that publishing it scans no record of it (``LedgerFiles.adopt_sealed``); a report
    without the whole layout leaves the file to be scanned on first use, as any."""
    if len(report.entry_offsets) == report.figures.entries_written:
        files.adopt_sealed(report.figures.ledger_id, report.entry_offsets, report.entry_lengths)


def _delete_quietly(files: LedgerFiles, ledger_id: int) -> None:
    """Delete ``ledger_id`` if its file is there (a failed round's reserved id)."""
    try:
        files.delete(ledger_id)
    except LedgerNotFoundError:
        pass
    except Exception as error:  # noqa: BLE001 - an orphan now, collected at the next start
        log.warning("could not delete ledger %d of a failed round: %s", ledger_id, error)


def _spark_installed() -> bool:
    """PySpark can be imported (the ``spark`` extra); ``auto`` never picks spark without it."""
    return importlib.util.find_spec("pyspark") is not None


class _Round(NamedTuple):
    """Where a round starts: the run's cursor, the view it builds on and its horizon."""

    cursor: ManagedCursor
    previous: CompactedView | None
    horizon: Position


class _Planned(NamedTuple):
    """Where a run (or a round) ends: the topic's ledger list taken at the run's start, and
    the stop marker within it."""

    snapshot: LedgerSnapshot
    stop: Position


def _charged(throttle: Throttle, batch: list[Entry]) -> list[Entry]:
    throttle.charge(sum(len(entry.data) for entry in batch))
    return batch


def _compacted_metadata(topic: CompactedTopic, stop: Position) -> dict[str, str]:
    """The custom metadata of a compacted ledger of ``topic`` compacted up to ``stop``."""
    return {"application": "compactd", "component": "compacted-ledger", "topic": topic.name, "compactedTo": str(stop)}


def _publish_time(data: bytes) -> int:
    """The entry's ``publish_time`` (ms); 0 when its metadata cannot be read."""
    try:
        return int(parse_header(bytes(data))[0].publish_time)
    except MalformedEntryError:
        return 0


def _read_previous(previous: CompactedView, first: int, last: int) -> list[Entry]:
    """Entries ``first..last`` of the previous compacted view, at their original positions,
    their dead slots emptied (a rewrite parses the bytes)."""
    return [Entry(compacted.position, compacted.data) for compacted in previous.read(first, last, emptied=True)]


def _live_entries(view: CompactedView, first: int, last: int) -> Iterator[CompactedEntry]:
    """The live entries of ``view``'s ledgers at places ``first..last``, dead slots emptied."""
    start = sum(entries for _, entries in view.live_segments[:first])
    end = start + sum(entries for _, entries in view.live_segments[first:last + 1])
    for at in range(start, end, READ_BATCH_ENTRIES_MAX):
        for entry in view.read(at, min(end, at + READ_BATCH_ENTRIES_MAX) - 1, emptied=True):
            yield CompactedEntry(entry.position, entry.data, entry.batch_size, entry.surviving)


def _live_keys(view: CompactedView) -> int | None:
    """The live keys of ``view`` when every ledger's marks count them, else None."""
    counted = [view.marks_of(ledger_id) for ledger_id, entries in view.segments if entries]
    return None if any(m is None for m in counted) else sum(m.live_keys for m in counted if m is not None)


def _delete_quietly_store(topic: CompactedTopic, ledger_id: int) -> None:
    """Delete the unpublished ledger ``ledger_id`` (a failure leaves an orphan, collected at
    the next start)."""
    try:
        topic.ledger.store.delete(ledger_id)
    except Exception as error:  # noqa: BLE001 - an orphan now
        log.warning("%s: could not delete unpublished compacted ledger %d: %s", topic.name, ledger_id, error)


def collect_orphans(data_dir: DataDir, *, now_ms: int | None = None) -> list[int]:
    """At start: delete the replaced compacted ledgers whose grace period is over, then every
    ledger no topic, no ``__compaction`` cursor, no manifest and no garbage still in its
    grace period references (orphans of an aborted or crashed run)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    manifests = CompactedManifests(data_dir.database)
    swept = manifests.sweep(data_dir.ledgers, now_ms)
    live = CursorStore(data_dir.database).cursor_property_values(COMPACTION_SUBSCRIPTION, COMPACTED_TOPIC_LEDGER)
    return swept + data_dir.collect_orphans(also_live=live | manifests.live_ledger_ids(now_ms))


def sweep_compacted_garbage(data_dir: DataDir, *, now_ms: int | None = None) -> list[int]:
    """Delete the replaced compacted ledgers whose grace period is over (``compactor.view.manifest``);
    the ids deleted. The broker calls it periodically, off its event loop."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return CompactedManifests(data_dir.database).sweep(data_dir.ledgers, now_ms)
