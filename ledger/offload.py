"""Offload: sealed ledgers copied to the bucket, their local copies let go later (Pulsar's
tiered storage, ``/work/shared/reference/pulsar-offload.md`` §1–3).

One ``Offloader`` per broker owns a small thread pool (Pulsar's
``managedLedgerOffloadMaxThreads``, 2) and, per topic, the offload mutex (one offload job
at a time, admin-triggered and threshold-triggered alike) and the admin job's status.

**One ledger's offload**, oldest first, one at a time:

1. ``LedgerFiles.upload_sealed``: the ledger's file and its sidecars are copied to
   ``ledgers/<id:020d>[suffix]`` (an atomic upload) and read back; size and CRC32C must
   equal the local file's;
2. ``ManagedLedger.record_offloaded``: one metadata transaction (fault seam
   ``ledgers.offloaded``) records ``offloaded_at_ms``. A ledger trimmed meanwhile is not
   recorded; its objects are deleted.

Transient failures (``retriable``: the bucket's 5xx, timeouts, resets, a copy that read
back wrong, SQLite busy) are retried with exponential backoff (``OffloadRetry``,
``retry_transient``: the one retry loop, a Spark run's staging uses it too), then the
ledger fails; the job goes on with the next ledger and ends ERROR with the first failure
(Pulsar's offloadLoop). Nothing is recorded for a ledger whose copy was not verified.

**Selection.** ``offload_prefix(ledger, before)`` (asyncOffloadPrefix): every ledger
strictly before ``before.ledger_id``, never the last (current) one, skipping empty and
already offloaded ones; ``first_unoffloaded`` is ``(first ledger kept, 0)``. A position
that is not an existing entry (nor ``(current, 0)`` of an empty current ledger) ends the
job in ERROR ("Invalid position for offload: L:E"); another job of the topic running
ends it in ERROR ("Offload operation already running"); the admin status (``status``) is
in memory only, ``NOT_RUN`` until the first admin trigger, as in Pulsar.
``maybe_offload(ledger, threshold_bytes)`` (Pulsar 3.4): closed ledgers are summed newest
to oldest, offloaded ones included; a not yet offloaded ledger is taken once the sum
exceeds the threshold (0: every closed ledger; negative: off). It leaves the admin
status alone; when the topic's mutex is busy it runs again after the running job.

**Local copies** (``delete_local_copies(ledger, lag_ms)``, Pulsar 3.6): an offloaded
ledger whose offload is older than ``lag_ms`` (``now - offloaded_at_ms > lag_ms``; a
negative lag lets go at once, as Pulsar's code does) is recorded ``local_deleted``
(fault seam ``ledgers.local_deleted``) BEFORE its file and sidecars are removed; a ledger
recorded so whose file is still there (a crash in between) loses it at the next pass.
Reads then come from the bucket (``ledger.storage.file``).

**Orphans** (``collect_orphan_objects(grace_ms, also_live)``): an object under
``ledgers/`` whose ledger is neither recorded offloaded nor in ``also_live`` (ledgers the
layers above keep in the bucket: compacted ledgers) nor being offloaded now, and older
than ``grace_ms``, is deleted: an upload whose record never came (a crash, a failed
verification) or a trimmed ledger's objects whose delete failed.

Crash rule: at every instant each ledger is either recorded offloaded with a verified
copy in the bucket, or still whole in the local data dir (or both).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

from ledger.errors import CompactionServiceError, LedgerError, OffloadAlreadyRunning
from ledger.job_status import JobStatus
from ledger.managed_ledger import ManagedLedger
from ledger.metadata import LedgerRecord, MetadataStore
from ledger.position import Position
from ledger.storage.base import LedgerStore
from ledger.storage.bucket import LedgerBucket
from ledger.storage.byte_source import BlockCache
from ledger.storage.powers import LedgerFiles

__all__ = [
    "OFFLOAD_THREADS_DEFAULT",
    "OffloadAlreadyRunning",
    "OffloadProgress",
    "OffloadRetry",
    "Offloader",
    "retry_transient",
]

log = logging.getLogger(__name__)

OFFLOAD_THREADS_DEFAULT = 2
"""Pulsar's ``managedLedgerOffloadMaxThreads``."""
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class OffloadProgress:
    """What ``GET …/offload`` shows: the status, the error of a failed job, and after a
    success the first position not offloaded (``(ledger, 0)``)."""

    status: JobStatus
    last_error: str = ""
    first_unoffloaded: Position | None = None


@dataclass(frozen=True, slots=True)
class OffloadRetry:
    """Tries of one step of one ledger's offload on a transient failure, and the waits
    between them (doubling from ``backoff_first_s`` up to ``backoff_max_s``)."""

    tries_max: int = 6
    backoff_first_s: float = 0.5
    backoff_max_s: float = 30.0


class _Stopped(Exception):
    """The offloader is shutting down: the job ends where it is."""


def retry_transient(what: str, action: Callable[[], _R], retry: OffloadRetry = OffloadRetry(), *,
                    stopping: threading.Event | None = None) -> _R:
    """``action()``, tried again on a transient failure (a ``CompactionServiceError`` whose
    ``retriable`` is set: the bucket's 5xx, timeouts, resets, a copy that read back wrong,
    SQLite busy) up to ``retry.tries_max`` tries in all, waiting between them from
    ``retry.backoff_first_s`` doubling up to ``retry.backoff_max_s``; each retry is logged
    with ``what``. Raises the last failure, or at once one that is not retriable.
    ``stopping`` set during a wait ends it: the offloader's shutdown (raises ``_Stopped``).
    One loop for every offload step, the broker's ``Offloader`` and a Spark run's staging
    (``compactor.runs.bucket_input``) alike."""
    delay = retry.backoff_first_s
    waiting = stopping if stopping is not None else threading.Event()
    for attempt in range(1, retry.tries_max + 1):
        try:
            return action()
        except CompactionServiceError as error:
            if not error.retriable or attempt == retry.tries_max:
                raise
            log.warning("%s failed (try %d of %d), retrying in %.1f s: %s", what, attempt, retry.tries_max, delay,
                        error)
        if waiting.wait(delay):
            raise _Stopped
        delay = min(delay * 2, retry.backoff_max_s)
    raise AssertionError("unreachable")


class Offloader:
    """Offloads of one broker's topics; see the module docstring."""

    def __init__(self, store: LedgerStore, metadata: MetadataStore, *, clock: Callable[[], float] = time.time,
                 retry: OffloadRetry = OffloadRetry(), threads: int = OFFLOAD_THREADS_DEFAULT) -> None:
        self._files: LedgerFiles | None = store.file_powers()
        self._metadata = metadata
        self._clock = clock
        self._retry = retry
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="offload")
        self._lock = threading.Lock()
        self._mutexes: dict[str, threading.Lock] = {}  # per topic: one job at a time
        self._status: dict[str, OffloadProgress] = {}
        self._again: dict[str, tuple[ManagedLedger, int]] = {}  # threshold runs deferred behind a job
        self._in_flight: set[int] = set()  # ledgers being uploaded now (never orphans)
        self._jobs: set[Future[None]] = set()  # submitted, not finished
        self._stopping = threading.Event()
        bucket = None if self._files is None else self._files.bucket
        self._bucket = None if bucket is None else LedgerBucket(bucket, BlockCache(0))

    # -- admin-triggered ----------------------------------------------------------------

    def offload_prefix(self, ledger: ManagedLedger, before: Position) -> None:
        """Start offloading every sealed ledger before ``before.ledger_id`` and return;
        ``OffloadAlreadyRunning`` when the topic's admin job has not finished."""
        topic = ledger.name
        with self._lock:
            if self._status.get(topic, OffloadProgress(JobStatus.NOT_RUN)).status is JobStatus.RUNNING:
                raise OffloadAlreadyRunning(f"offload of {topic} already running", topic=topic)
            self._status[topic] = OffloadProgress(JobStatus.RUNNING)
        try:
            self._submit(self._admin_job, ledger, before)
        except RuntimeError:  # shut down
            self._finish(topic, OffloadProgress(JobStatus.ERROR, "the offloader is shut down"))

    def status(self, topic: str) -> OffloadProgress:
        """The topic's admin offload job (``NOT_RUN`` when none since this broker started)."""
        with self._lock:
            return self._status.get(topic, OffloadProgress(JobStatus.NOT_RUN))

    def forget(self, topic: str) -> None:
        """The topic was unloaded or deleted: its admin status goes (``NOT_RUN`` when it is
        loaded again, as in Pulsar). A job still running finishes on its own."""
        with self._lock:
            if self._status.get(topic, OffloadProgress(JobStatus.NOT_RUN)).status is not JobStatus.RUNNING:
                self._status.pop(topic, None)
            self._again.pop(topic, None)

    def _admin_job(self, ledger: ManagedLedger, before: Position) -> None:
        topic = ledger.name
        try:
            records = ledger.ledger_list()
            if not _offloadable_position(records, before):
                raise LedgerError(f"Invalid position for offload: {before.ledger_id}:{before.entry_id}")
            mutex = self._mutex(topic)
            if not mutex.acquire(blocking=False):
                raise LedgerError("Offload operation already running")
            try:
                chosen, kept = _prefix(records, before.ledger_id)
                failed = self._offload_each(ledger, [record.ledger_id for record in chosen])
            finally:
                mutex.release()
                self._run_deferred(topic)
            if failed:
                first_failed, error = failed[0]
                raise LedgerError(f"ledger {first_failed}: {error}")
            self._finish(topic, OffloadProgress(JobStatus.SUCCESS, "", Position(kept, 0)))
        except Exception as error:  # noqa: BLE001 - the job's outcome is its status
            log.warning("topic %s: offload failed: %s", topic, error)
            self._finish(topic, OffloadProgress(JobStatus.ERROR, f"{type(error).__name__}: {error}"))

    def _finish(self, topic: str, progress: OffloadProgress) -> None:
        with self._lock:
            self._status[topic] = progress

    # -- threshold-triggered ------------------------------------------------------------

    def maybe_offload(self, ledger: ManagedLedger, threshold_bytes: int) -> None:
        """Offload, in the background, the closed ledgers that the newest
        ``threshold_bytes`` leave out (see the module docstring); negative: nothing."""
        if threshold_bytes < 0 or self._stopping.is_set():
            return
        try:
            self._submit(self._threshold_job, ledger, threshold_bytes)
        except RuntimeError:  # shut down meanwhile
            return

    def _threshold_job(self, ledger: ManagedLedger, threshold_bytes: int) -> None:
        topic = ledger.name
        mutex = self._mutex(topic)
        if not mutex.acquire(blocking=False):
            with self._lock:
                self._again[topic] = (ledger, threshold_bytes)  # after the job that holds it
            return
        try:
            chosen = _over_threshold(ledger.ledger_list(), threshold_bytes)
            for ledger_id, error in self._offload_each(ledger, chosen):
                log.warning("topic %s: threshold offload of ledger %d failed: %s", topic, ledger_id, error)
        except Exception:  # a background job: logged, retried at the next roll-over
            log.exception("topic %s: threshold offload failed", topic)
        finally:
            mutex.release()
            self._run_deferred(topic)

    def _run_deferred(self, topic: str) -> None:
        with self._lock:
            deferred = self._again.pop(topic, None)
        if deferred is not None:
            self.maybe_offload(*deferred)

    # -- synchronous (a Spark run's inputs) ---------------------------------------------

    def offload_ledgers(self, ledger: ManagedLedger, ledger_ids: Iterable[int]) -> None:
        """Offload ``ledger_ids`` now (waiting for a running job of the topic), keeping
        their local copies; those already offloaded are skipped. Raises the first
        failure. The admin status is left alone."""
        with self._mutex(ledger.name):
            failed = self._offload_each(ledger, sorted(ledger_ids))
        if failed:
            ledger_id, error = failed[0]
            raise error if isinstance(error, CompactionServiceError) else LedgerError(
                f"ledger {ledger_id}: {error}", ledger_id=ledger_id)

    # -- one ledger at a time -----------------------------------------------------------

    def _offload_each(self, ledger: ManagedLedger, ledger_ids: Sequence[int]) -> list[tuple[int, Exception]]:
        """Offload ``ledger_ids`` oldest first, going on past failures; the failures.
        The caller holds the topic's mutex."""
        failures: list[tuple[int, Exception]] = []
        for ledger_id in sorted(ledger_ids):
            if ledger.closed or self._stopping.is_set():
                failures.append((ledger_id, LedgerError(f"topic {ledger.name} closed; offload stopped")))
                break
            try:
                self._offload_one(ledger, ledger_id)
            except _Stopped:
                failures.append((ledger_id, LedgerError("the offloader is shut down")))
                break
            except Exception as error:  # noqa: BLE001 - Pulsar goes on with the next ledger
                failures.append((ledger_id, error))
        return failures

    def _offload_one(self, ledger: ManagedLedger, ledger_id: int) -> None:
        files = self._files
        if files is None or files.bucket is None:
            raise LedgerError("offload is not configured: the ledger store has no bucket")
        record = next((record for record in ledger.ledger_list() if record.ledger_id == ledger_id), None)
        if record is None or record.offloaded or record.is_open or record.entries == 0:
            return  # trimmed meanwhile, done already, or nothing to copy
        with self._lock:
            self._in_flight.add(ledger_id)
        try:
            self._retrying(f"upload of ledger {ledger_id}", lambda: files.upload_sealed(ledger_id))
            recorded = self._retrying(f"record of ledger {ledger_id}",
                                      lambda: ledger.record_offloaded(ledger_id, self._now_ms()))
            if not recorded:  # trimmed while it was uploaded: its objects are nobody's
                log.info("topic %s: ledger %d went while it was offloaded; deleting its objects",
                         ledger.name, ledger_id)
                if self._bucket is not None:
                    self._bucket.delete_ledger(ledger_id)
            else:
                log.info("topic %s: offloaded ledger %d", ledger.name, ledger_id)
        finally:
            with self._lock:
                self._in_flight.discard(ledger_id)

    def _retrying(self, what: str, action: Callable[[], _R]) -> _R:
        return retry_transient(what, action, self._retry, stopping=self._stopping)

    # -- local copies and orphans -------------------------------------------------------

    def delete_local_copies(self, ledger: ManagedLedger, lag_ms: int) -> list[int]:
        """Let go of the local copies of the topic's ledgers offloaded more than
        ``lag_ms`` ago: recorded first, then removed. The ids removed now."""
        files = self._files
        if files is None or files.bucket is None:
            return []
        now_ms = self._now_ms()
        records = ledger.ledger_list()
        due = [record.ledger_id for record in records
               if record.offloaded and not record.local_deleted and now_ms - record.offloaded_at_ms > lag_ms]
        recorded = ledger.record_local_deleted(due, now_ms) if due else []
        unfinished = [record.ledger_id for record in records if record.local_deleted]  # a crash came between
        dropped = []
        for ledger_id in [*recorded, *unfinished]:
            try:
                if files.drop_local(ledger_id):
                    dropped.append(ledger_id)
            except (LedgerError, OSError) as error:
                log.error("topic %s: ledger %d: local copy kept: %s", ledger.name, ledger_id, error)
        if dropped:
            log.info("topic %s: local copies of offloaded ledgers %s deleted", ledger.name, dropped)
        return dropped

    def collect_orphan_objects(self, grace_ms: int, also_live: Iterable[int] = ()) -> list[str]:
        """Delete the bucket's objects no ledger record references (see the module
        docstring) once older than ``grace_ms``; their names."""
        if self._bucket is None:
            return []
        also_live = set(also_live)
        now_ms = self._now_ms()
        removed = []
        for found in self._bucket.objects():
            if found.ledger_id in also_live or now_ms - found.modified_ms <= grace_ms:
                continue
            with self._lock:  # no offload of it starts (nor records) between the check and the delete
                if found.ledger_id in self._in_flight or self._metadata.is_offloaded(found.ledger_id):
                    continue
                if self._bucket.delete(found.name):
                    removed.append(found.name)
        if removed:
            log.info("deleted orphan objects %s", removed)
        return removed

    # -- lifecycle ----------------------------------------------------------------------

    def _submit(self, job: Callable[..., None], *args: object) -> None:
        with self._lock:  # added before its done-callback can discard it
            future = self._pool.submit(job, *args)
            self._jobs.add(future)
        future.add_done_callback(self._forget_job)

    def _forget_job(self, future: Future[None]) -> None:
        with self._lock:
            self._jobs.discard(future)

    def drain(self, timeout_s: float) -> bool:
        """Wait until no job is queued or running (those a finished job started included);
        False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                jobs = set(self._jobs)
            if not jobs:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            wait(jobs, timeout=remaining)

    def shutdown(self) -> None:
        """Stop: running jobs end after the step they are in (backoff waits end at once),
        queued ones do not start; returns once every job is over."""
        self._stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for topic, progress in self._status.items():
                if progress.status is JobStatus.RUNNING:
                    self._status[topic] = OffloadProgress(JobStatus.ERROR, "the offloader is shut down")

    def _mutex(self, topic: str) -> threading.Lock:
        with self._lock:
            return self._mutexes.setdefault(topic, threading.Lock())

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _offloadable_position(records: Sequence[LedgerRecord], position: Position) -> bool:
    """Pulsar's check: an existing entry, or ``(current, 0)`` of an empty current ledger."""
    for index, record in enumerate(records):
        if record.ledger_id == position.ledger_id:
            if 0 <= position.entry_id < record.entries:
                return True
            return index == len(records) - 1 and record.entries == 0 and position.entry_id == 0
    return False


def _prefix(records: Sequence[LedgerRecord], before_ledger_id: int) -> tuple[list[LedgerRecord], int]:
    """asyncOffloadPrefix's selection: the ledgers to offload, and the first one kept."""
    chosen: list[LedgerRecord] = []
    kept = records[-1].ledger_id if records else before_ledger_id
    for record in records[:-1]:  # never the current ledger
        if record.ledger_id >= before_ledger_id:
            kept = record.ledger_id
            break
        if not record.offloaded and record.size_bytes > 0 and not record.is_open:
            chosen.append(record)
    return chosen, kept


def _over_threshold(records: Sequence[LedgerRecord], threshold_bytes: int) -> list[int]:
    """maybeOffload's selection (Pulsar 3.4): newest to oldest over closed ledgers, the
    running sum counting offloaded ones too; oldest first."""
    chosen = []
    summed = 0
    for record in reversed(records):
        if record.is_open:
            continue
        summed += record.size_bytes
        if not record.offloaded and record.entries > 0 and summed > threshold_bytes:
            chosen.append(record.ledger_id)
    return sorted(chosen)

