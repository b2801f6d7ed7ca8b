"""Key indexes built in the background, in a worker process, as raw ledgers are sealed.

A run reads a sealed ledger's key index (``compactor.local.key_index``) instead of parsing the
ledger; building it means parsing every message once, Python that holds the GIL. The
broker asks ``KeyIndexBuilds`` for it when a ledger is sealed (``ManagedLedger``'s
``on_sealed`` hook) and, at start, for every sealed ledger that lacks one
(``unindexed_ledgers``); the builds run one at a time in one child process (``spawn``
start method, started on the first build, at a lower CPU priority, killed with the broker
as ``compactor.local.worker``'s round workers), so they never hold the broker's interpreter:

* ``submit`` only queues the ledger id (any thread, never blocks); one thread of the
  broker hands the queue to the child in order, a build at a time (bounded: the queue
  holds ids, and an id already queued is not queued twice);
* the child (``build_key_index``) opens the ledger directory with a read-only
  ``FileLedgerStore`` (with the broker's bucket, if any: a ledger offloaded meanwhile is
  read there, and its index written there), as a round does, and calls ``ensure_index``:
  an index already there and whole is kept, a missing or corrupt one is (re)written
  atomically;
* a ledger deleted meanwhile (trimmed, its topic deleted) is skipped, and an index written
  just after its ledger went is removed again by the child (and in any case by the next
  start, ``ledger.storage.sidecars``); a child that dies (killed) loses only that build:
  the next one starts a fresh child, and the ledger is indexed again at the next start or
  by the run that needs it (``ensure_index`` parses and writes).

A ledger under ``INDEX_MIN_ENTRIES`` entries is not indexed in the background: a run parses
it in a few milliseconds, less than what a worker process costs to start.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from compactor.local.key_index import ensure_index, index_path
from compactor.local.worker import _child_started
from ledger.errors import LedgerNotFoundError
from ledger.metadata import MetadataStore
from ledger.storage.base import SyncPolicy
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_writer import ledger_file_name

if TYPE_CHECKING:
    from ledger.storage.object_fs import BucketConfig

__all__ = ["INDEX_MIN_ENTRIES", "KeyIndexBuilds", "build_key_index", "unindexed_ledgers"]

log = logging.getLogger(__name__)

INDEX_MIN_ENTRIES = 500
"""Sealed ledgers with fewer entries are left to the run that reads them."""


def build_key_index(ledgers_root: str, ledger_id: int, bucket: BucketConfig | None = None) -> int:
    """In the child: make sure sealed raw ledger ``ledger_id`` of ``ledgers_root`` (or,
    offloaded, of ``bucket``) has a whole index; its rows, or -1 when the ledger is gone."""
    store = FileLedgerStore(ledgers_root, sync=SyncPolicy.NONE, read_only=True, bucket=bucket)
    ledger_file = os.path.join(ledgers_root, ledger_file_name(ledger_id))
    local = os.path.exists(ledger_file)
    try:
        index = ensure_index(store, ledger_id, compacted=False)
    except LedgerNotFoundError:
        return -1
    finally:
        store.shutdown()
    if local and not os.path.exists(ledger_file):  # deleted while we wrote: no index outlives its ledger
        with contextlib.suppress(FileNotFoundError):
            os.unlink(index_path(ledger_file))
        return -1
    return len(index)


def _child_initializer(parent_pid: int) -> None:
    """As a round's worker: dies with the broker (``parent_pid``), at a lower CPU priority."""
    _child_started(parent_pid)


def unindexed_ledgers(metadata: MetadataStore, ledgers_root: str) -> list[tuple[int, int]]:
    """``(ledger_id, entries)`` of the sealed raw ledgers of every topic, with at least
    ``INDEX_MIN_ENTRIES`` entries, that have no index file yet (ascending). An offloaded
    ledger is left out: its index went to the bucket with it, or a run builds it there."""
    missing = []
    for topic in metadata.list_topics():
        for record in metadata.topic_ledgers(topic):
            if record.is_open or record.entries < INDEX_MIN_ENTRIES or record.offloaded:
                continue
            if not os.path.exists(index_path(os.path.join(ledgers_root, ledger_file_name(record.ledger_id)))):
                missing.append((record.ledger_id, record.entries))
    return sorted(missing)


class KeyIndexBuilds:
    """The background builds of one ledger directory (see the module docstring)."""

    def __init__(self, ledgers_root: str, bucket: BucketConfig | None = None) -> None:
        self.ledgers_root = ledgers_root
        self.bucket = bucket
        self.built = 0  # indexes the child made sure of (figures for tests and logs)
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._queue: collections.deque[int] = collections.deque()
        self._queued: set[int] = set()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, ledger_id: int, entries: int) -> None:
        """Queue sealed raw ledger ``ledger_id`` of ``entries`` entries for indexing
        (nothing once closed, or under ``INDEX_MIN_ENTRIES`` entries); returns at once.
        ``ManagedLedger``'s ``on_sealed`` hook."""
        if entries < INDEX_MIN_ENTRIES:
            return
        with self._lock:
            if self._closed or ledger_id in self._queued:
                return
            self._queue.append(ledger_id)
            self._queued.add(ledger_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="key-index-builds", daemon=True)
                self._thread.start()
            self._wakeup.notify()

    def pending(self) -> int:
        """Ledgers queued or being indexed."""
        with self._lock:
            return len(self._queued)

    def pids(self) -> list[int]:
        """The child's process id while it runs (none before the first build)."""
        with self._lock:
            pool = self._pool
        return [] if pool is None else list(getattr(pool, "_processes", {}))

    def _run(self) -> None:
        """The thread: hand each queued ledger to the child, one at a time, until closed."""
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wakeup.wait()
                if self._closed:
                    return
                ledger_id = self._queue[0]
            try:
                self._build(ledger_id)
            finally:
                with self._lock:
                    self._queue.popleft()
                    self._queued.discard(ledger_id)

    def _build(self, ledger_id: int) -> None:
        with self._lock:
            if self._closed:
                return
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_child_initializer, initargs=(os.getpid(),))
            future = self._pool.submit(build_key_index, self.ledgers_root, ledger_id, self.bucket)
        try:
            rows = future.result()
        except BrokenProcessPool:
            self._forget_broken()
            if not self._closed:
                log.warning("ledger %d: the key index's worker process died; the next build starts another",
                            ledger_id)
            return
        except Exception as error:  # noqa: BLE001 - a failed build only costs the run a parse
            log.warning("ledger %d: building its key index failed: %s", ledger_id, error)
            return
        if rows >= 0:
            self.built += 1
            log.debug("ledger %d: key index of %d rows", ledger_id, rows)

    def _forget_broken(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop (idempotent): nothing more is queued, a build in flight is killed (its
        temporary file is removed at the next start), the child is gone when it returns."""
        with self._lock:
            self._closed = True
            self._wakeup.notify_all()
            pool, self._pool = self._pool, None
            thread = self._thread
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                with contextlib.suppress(OSError):
                    process.kill()
            pool.shutdown(wait=True, cancel_futures=True)
        if thread is not None:
            thread.join(timeout=10)
