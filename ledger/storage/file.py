"""File ledger store: one append-only file per ledger, with group-commit fsync.

The record format and the recovery scan live in ``ledger.storage.record``. This module owns
the files' lifecycle and durability:

* ``create`` bumps the id sequence file durably, then writes MAGIC and the META record and
  fsyncs the file and the directory. Ids are never reused.
* A ledger created ``durable_at_seal`` (a compacted ledger) never syncs before its seal:
  its appends gather in memory and are written in blocks of ``UNSYNCED_BLOCK_BYTES`` on
  the appending thread, so they never queue behind (nor delay) the flusher's syncs of
  live topics; the seal's fsync makes them durable.
* ``reserve_ids`` allocates several ids in one durable bump of the sequence, for ledgers
  written whole elsewhere (``ledger.storage.sealed_writer``); the store reads such a file,
  once it exists, as any sealed ledger.
* ``append`` frames the entry and, by ``SyncPolicy``: ALWAYS writes and fsyncs inline;
  GROUP queues it for the flusher thread, which writes every queued record of every ledger,
  fdatasyncs each file once, advances ``last_add_confirmed`` and resolves the futures in
  order (group commit: while one sync runs, the next batch accumulates); NONE writes inline
  without a sync.
* File descriptors are bounded (``max_open_files``, ``ledger.storage.handles``): the least
  recently used idle ones are closed and reopened on their next use, so a store can hold
  far more ledgers than the process may open files.
* A ledger is loaded lazily, on first use: its file is scanned, and in a writable store a
  torn or corrupt tail is truncated (and synced) before anything is served. The scan runs
  outside the store's lock (``_preload``): loading a large ledger holds up no other
  ledger's appends. ``adopt_sealed`` loads a ledger written whole elsewhere from the
  layout its writer recorded, with no scan at all (its META and SEAL records are checked).
* ``read`` checks every record it returns against its CRC32C again (a sealed ledger is
  read for years after its scan): a record whose bytes changed raises
  ``CorruptEntryError`` for that read and is never served.
* ``close`` flushes what is pending, then writes and syncs the SEAL record. A ledger fenced
  by a failed write is first cut back to its last durable entry (``last_add_confirmed``):
  what the failed appends left in the file is truncated, never sealed in.
* ``delete`` removes the ledger's sidecar files with it (``ledger.storage.sidecars``), and
  its objects in the bucket when one is configured.
* With a ``bucket`` (``ledger.storage.object_fs.BucketConfig``), a ledger whose local file
  is absent is read from its object ``ledgers/<id:020d>`` (``ledger.storage.bucket``),
  through a block cache of ``read_cache_bytes`` shared by the store's ledgers (ranged
  reads). Loading it checks its META and SEAL records and walks its records' lengths
  (``SealedFile.walk``); every read checks each record's CRC32C as for a local file. A
  missing object is ``LedgerNotFoundError``; a truncated or altered one is
  ``CorruptLedgerError`` (or ``CorruptEntryError`` for the read of an altered entry), and
  nothing of it is served. ``upload_sealed`` copies a sealed ledger and its sidecars to
  the bucket and verifies the copies; ``drop_local`` then removes the local files (reads
  go on from the bucket, even those of this process that had the ledger loaded).
  ``list`` names the ledgers whose file is local.
* ``read_only=True`` opens the directory without owning it (no lock, no truncation, no
  writes): another process can read sealed ledgers, and the intact prefix of open ones,
  while the owning broker keeps appending to other ledgers. Its ``root`` need not exist: a
  Spark executor with no data dir reads every ledger from the bucket.

It is over the project's 600 lines on purpose: every path that touches a ledger
file's bytes or its descriptor takes the store's ``_lock`` and the ledger's ``io_lock`` in
one order, which stays checkable only while they live in one module.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import threading
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ledger.errors import (
    CorruptLedgerError,
    LedgerError,
    LedgerFencedError,
    LedgerIOError,
    LedgerNotFoundError,
    LedgerSealedError,
    ObjectMismatchError,
)
from ledger.storage.base import LedgerInfo, LedgerState, SyncPolicy, completed
from ledger.storage.bucket import LedgerBucket, ledger_object_name
from ledger.storage.byte_source import BlockCache, ByteSource
from ledger.storage.file_io import create_file, fsync_dir, scan_fd, verified_entries, write_all
from ledger.storage.handles import FileHandle, FileHandles
from ledger.storage.memory import _check_range
from ledger.storage.object_fs import BucketConfig

if TYPE_CHECKING:  # pyarrow loads only where a sidecar is opened: the broker's start never imports it
    import pyarrow as pa
from ledger.storage.record import (
    HEADER,
    RECORD_BYTES_MAX,
    RecordKind,
    ScanResult,
    encode_meta,
    encode_record,
    encode_seal,
    sealed_layout,
)
from ledger.storage.sealed_file import SealedFile
from ledger.storage.sidecars import sidecar_paths

__all__ = ["MAX_OPEN_FILES_DEFAULT", "READ_CACHE_BYTES_DEFAULT", "FileLedgerStore"]

log = logging.getLogger(__name__)

# Ledger files kept open while idle (``FileHandles``): far under the usual limit of 1,024
# descriptors per process, which sockets, SQLite and the rest share; a file past it is
# reopened on its next use.
MAX_OPEN_FILES_DEFAULT = 256
# The block cache of ledgers read from the bucket (``ledger.storage.byte_source``).
READ_CACHE_BYTES_DEFAULT = 64 * 1024 * 1024
# A ``durable_at_seal`` ledger's appends are written once this many bytes gathered.
UNSYNCED_BLOCK_BYTES = 1024 * 1024

_SUFFIX = ".ledger"
# What ``adopt_sealed`` reads of a file: its first bytes (MAGIC and the META record, whose
# custom metadata is a few names) and its last (the SEAL record).
_ADOPT_HEAD_BYTES = 64 * 1024
_ADOPT_TAIL_BYTES = 64
_SEQUENCE_FILE = "LEDGER_ID_SEQUENCE"
_T = TypeVar("_T")


@dataclass
class _FileLedger:
    """One loaded ledger; every field is guarded by the store's ``_lock``."""

    ledger_id: int
    path: str
    scanned: ScanResult
    end: int  # logical end of file: where the next record goes (pending bytes included)
    last_add_confirmed: int
    io_lock: threading.Lock = field(default_factory=threading.Lock)
    pending: bytearray = field(default_factory=bytearray)
    pending_futures: list[tuple[int, Future[int]]] = field(default_factory=list)
    sealed: bool = False
    failed: bool = False
    durable_at_seal: bool = False  # appends are written unsynced, in blocks; the seal syncs
    source: ByteSource | None = None  # a sealed ledger read from the bucket (no local file)


class FileLedgerStore:
    """A ``LedgerStore`` over files in ``root``; see the module docstring."""

    def __init__(
        self, root: str, *, sync: SyncPolicy = SyncPolicy.GROUP, read_only: bool = False,
        max_open_files: int = MAX_OPEN_FILES_DEFAULT, bucket: BucketConfig | None = None,
        read_cache_bytes: int = READ_CACHE_BYTES_DEFAULT,
    ) -> None:
        self.root = os.path.abspath(root)
        self.sync = sync
        self.read_only = read_only
        self.bucket = bucket
        self._bucket = None if bucket is None else LedgerBucket(bucket, BlockCache(read_cache_bytes))
        if not read_only:
            os.makedirs(self.root, mode=0o700, exist_ok=True)  # owner-only, as every ledger file
        self._lock = threading.Lock()
        self._handles = FileHandles(max_open_files, flags=os.O_RDONLY if read_only else os.O_RDWR)
        self._next_id: int | None = None  # the next ledger id, once the first create read it
        self._ledgers: dict[int, _FileLedger] = {}
        self._dirty: dict[int, _FileLedger] = {}
        self._wakeup = threading.Condition(self._lock)
        self._stopping = False
        self._flusher: threading.Thread | None = None
        if sync is SyncPolicy.GROUP and not read_only:
            self._flusher = threading.Thread(target=self._flush_loop, name="ledger-flusher")
            self._flusher.daemon = True
            self._flusher.start()

    # -- the LedgerStore contract -------------------------------------------------------

    def create(self, metadata: Mapping[str, str] | None = None, *, durable_at_seal: bool = False) -> int:
        self._check_writable()
        with self._lock:
            try:
                ledger_id = self._next_ledger_id()
            except OSError as error:
                raise LedgerIOError(f"ledger store {self.root}: cannot allocate a ledger id: {error}") from error
            path = self._path(ledger_id)
            created_at_ms = int(time.time() * 1000)
            header = encode_meta(ledger_id, created_at_ms, dict(metadata or {}))
            self._handles.adopt(ledger_id, create_file(path, header, ledger_id))
            scanned = ScanResult(
                ledger_id=ledger_id,
                created_at_ms=created_at_ms,
                metadata=dict(metadata or {}),
                intact_end=len(header),
                file_size=len(header),
            )
            self._ledgers[ledger_id] = _FileLedger(ledger_id, path, scanned, len(header), -1,
                                                   durable_at_seal=durable_at_seal)
            return ledger_id

    def append(self, ledger_id: int, data: bytes) -> Future[int]:
        self._check_writable()
        if len(data) > RECORD_BYTES_MAX:
            raise LedgerError(
                f"entry of {len(data)} bytes exceeds {RECORD_BYTES_MAX}", ledger_id=ledger_id
            )
        record = encode_record(RecordKind.ENTRY, data)
        with self._lock:
            ledger = self._load(ledger_id)
            self._check_appendable(ledger)
            entry_id = len(ledger.scanned.entry_offsets)
            ledger.scanned.entry_offsets.append(ledger.end)
            ledger.scanned.entry_lengths.append(len(data))
            ledger.scanned.size_bytes += len(data)
            ledger.end += len(record)
            if ledger.durable_at_seal:
                ledger.pending += record
                if len(ledger.pending) < UNSYNCED_BLOCK_BYTES:
                    return completed(entry_id)
            elif self.sync is SyncPolicy.GROUP:
                future: Future[int] = Future()
                ledger.pending += record
                ledger.pending_futures.append((entry_id, future))
                self._dirty[ledger_id] = ledger
                self._wakeup.notify()
                return future
            handle = self._pin(ledger)
        try:
            with ledger.io_lock:
                if ledger.durable_at_seal:
                    self._write_unsynced(ledger, handle.fd)
                else:
                    self._write_inline(ledger, handle.fd, record, entry_id)
        finally:
            self._unpin(handle)
        return completed(entry_id)

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self._with_loaded(ledger_id, lambda ledger: ledger.last_add_confirmed)

    def _with_loaded(self, ledger_id: int, answer: Callable[[_FileLedger], _T]) -> _T:
        """``answer(ledger)`` under ``_lock``, the ledger loaded (from the bucket when its
        file is gone: once more, when another process dropped it meanwhile)."""
        for retry in (False, True):
            self._preload(ledger_id)
            try:
                with self._lock:
                    return answer(self._load(ledger_id, refresh=self.read_only))
            except LedgerNotFoundError:
                if retry or not self._forget_gone(ledger_id):
                    raise
        raise AssertionError("unreachable")

    def confirmed_length(self, ledger_id: int) -> tuple[int, int]:
        """``(entries, bytes)``: the ledger's durable entries and the length of the file
        prefix that holds them (header included). Those bytes never change again: a
        copy of them is the ledger up to ``last_add_confirmed`` (backups)."""
        return self._with_loaded(ledger_id, _confirmed_length)

    def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> Sequence[bytes]:
        for retry in (False, True):
            self._preload(ledger_id)
            try:
                with self._lock:
                    ledger = self._load(ledger_id, refresh=self.read_only)
                    _check_range(ledger_id, first_entry_id, last_entry_id, ledger.last_add_confirmed)
                    offsets = ledger.scanned.entry_offsets[first_entry_id : last_entry_id + 1]
                    lengths = ledger.scanned.entry_lengths[first_entry_id : last_entry_id + 1]
                    source = ledger.source
                    handle = None if source is not None else self._pin(ledger)
                break
            except LedgerNotFoundError:
                if retry or not self._forget_gone(ledger_id):
                    raise
        start = offsets[0]
        stop = offsets[-1] + HEADER.size + lengths[-1]
        if source is not None:
            block = source.pread(start, stop - start)
        else:
            assert handle is not None
            try:
                block = os.pread(handle.fd, stop - start, start)
            finally:
                self._unpin(handle)
        if len(block) != stop - start:
            raise LedgerIOError(f"ledger {ledger_id}: short read", ledger_id=ledger_id)
        try:
            return verified_entries(ledger_id, first_entry_id, block, start, offsets, lengths)
        except CorruptLedgerError:
            if source is not None:
                source.discard_cached()  # fetched afresh by the next read; never served
            raise

    def _forget_gone(self, ledger_id: int) -> bool:
        """A loaded ledger's local file is gone (its copy was dropped by another process)
        and a bucket is configured: forget it, so that the next load reads the bucket.
        False when there is nothing to retry."""
        if self._bucket is None or os.path.exists(self._path(ledger_id)):
            return False
        with self._lock:
            ledger = self._ledgers.get(ledger_id)
            if ledger is not None and (ledger.source is not None or not ledger.sealed):
                return False
            self._ledgers.pop(ledger_id, None)
            self._handles.discard(ledger_id)
        return True

    def close(self, ledger_id: int) -> None:
        self._check_writable()
        self._preload(ledger_id)
        with self._lock:
            ledger = self._load(ledger_id)
            if ledger.sealed:
                return
            handle = self._pin(ledger)
        try:
            with ledger.io_lock:
                if ledger.durable_at_seal:
                    self._write_unsynced(ledger, handle.fd)
                self._flush_pending(ledger, handle.fd)
                self._write_seal(ledger, handle.fd)
        finally:
            self._unpin(handle)

    def _write_seal(self, ledger: _FileLedger, fd: int) -> None:
        """Seal ``ledger`` after its last confirmed entry; the caller holds ``io_lock`` and
        has flushed. A failed ledger is cut back to its last durable entry first (what its
        failed appends left is never kept). If the seal cannot be written the ledger stays
        failed and open, and a later ``close`` tries again."""
        with self._lock:
            if ledger.sealed:
                return
            ledger.sealed = True  # no append slips in between the flush and the seal
            cut = ledger.failed
            if cut:
                self._drop_unconfirmed(ledger)
            seal = encode_seal(len(ledger.scanned.entry_offsets), ledger.scanned.size_bytes)
        try:
            if cut:
                os.ftruncate(fd, ledger.end)
            write_all(fd, seal, ledger.end)
            os.fsync(fd)
        except OSError as error:
            with self._lock:
                ledger.sealed = False
            self._fail(ledger, [], error)
            raise LedgerIOError(f"ledger {ledger.ledger_id}: seal failed: {error}",
                                ledger_id=ledger.ledger_id) from error
        with self._lock:
            ledger.end += len(seal)
            ledger.failed = False
            ledger.scanned.sealed = True

    @staticmethod
    def _drop_unconfirmed(ledger: _FileLedger) -> None:
        """Forget the entries after ``last_add_confirmed``; the caller holds ``_lock``."""
        keep = ledger.last_add_confirmed + 1
        offsets, lengths = ledger.scanned.entry_offsets, ledger.scanned.entry_lengths
        if len(offsets) > keep:
            ledger.end = offsets[keep]
            del offsets[keep:]
            del lengths[keep:]
            ledger.scanned.size_bytes = sum(lengths)

    def delete(self, ledger_id: int) -> None:
        self._check_writable()
        with self._lock:
            ledger = self._ledgers.pop(ledger_id, None)
            self._dirty.pop(ledger_id, None)
            self._handles.discard(ledger_id)
            if ledger is not None:
                futures = ledger.pending_futures
                ledger.pending_futures = []
                ledger.pending = bytearray()
            else:
                futures = []
        for _, future in futures:
            future.set_exception(LedgerNotFoundError(f"ledger {ledger_id} was deleted"))
        removed = False
        for path in [*sidecar_paths(self._path(ledger_id)), self._path(ledger_id)]:  # sidecars first
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed = True
        if removed:
            fsync_dir(self.root)
        never_uploaded = ledger is not None and ledger.source is None and not (
            ledger.sealed and ledger.scanned.entry_offsets)  # open or empty: never offloaded
        if self._bucket is not None and not never_uploaded:
            self._bucket.delete_ledger(ledger_id)

    def list(self) -> list[int]:
        """The ids of the ledgers whose file is in ``root`` (a ledger only in the bucket
        is not listed: ``ledger.offload`` collects the bucket's orphans)."""
        ids = []
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:  # a read-only store on a root that does not exist
            return []
        for name in names:
            if name.endswith(_SUFFIX) and name[: -len(_SUFFIX)].isdigit():
                ids.append(int(name[: -len(_SUFFIX)]))
        return sorted(ids)

    def info(self, ledger_id: int) -> LedgerInfo:
        return self._with_loaded(ledger_id, _info)

    def adopt_sealed(self, ledger_id: int, entry_offsets: array[int], entry_lengths: array[int]) -> bool:
        """Load the sealed ledger ``ledger_id``, just written whole elsewhere
        (``ledger.storage.sealed_writer``), from the record offsets and payload lengths its
        writer recorded, instead of scanning it; each entry is still checked against its
        CRC32C when read. False (the file is scanned on first use, as any) when it is
        loaded already, not there, or its META and SEAL records do not agree with the
        layout (``ledger.storage.record.sealed_layout``). With a bucket, a ledger with no
        local file is adopted from its object (written there by a Spark executor)."""
        if self._bucket is not None and ledger_id not in self._ledgers and not os.path.exists(self._path(ledger_id)):
            return self._adopt_remote(ledger_id, entry_offsets, entry_lengths)
        with self._lock:
            if ledger_id in self._ledgers:
                return False
            path = self._path(ledger_id)
            try:
                handle = self._handles.pin(ledger_id, path)
            except OSError:
                return False
            try:
                size = os.fstat(handle.fd).st_size
                head = os.pread(handle.fd, min(size, _ADOPT_HEAD_BYTES), 0)
                tail = os.pread(handle.fd, _ADOPT_TAIL_BYTES, max(0, size - _ADOPT_TAIL_BYTES))
            except OSError:
                return False
            finally:
                self._handles.unpin(handle)
            scanned = sealed_layout(head, tail, size, entry_offsets, entry_lengths, path)
            if scanned is None or scanned.ledger_id != ledger_id:
                log.warning("ledger %d: its writer's layout does not match the file; it will be scanned", ledger_id)
                return False
            self._install(ledger_id, path, scanned)
            return True

    # -- the bucket (``LedgerFiles``) ------------------------------------------------------

    def open_sealed(self, ledger_id: int) -> SealedFile | None:
        """Sealed ledger ``ledger_id`` for direct reads: its local file, else (a bucket
        configured) its object through the cache. None when the local file is not sealed
        (an open ledger) or the ledger is nowhere; ``CorruptLedgerError`` for an object
        that is not a whole sealed ledger."""
        sealed = SealedFile.open(self._path(ledger_id), ledger_id)
        if sealed is not None or self._bucket is None or os.path.exists(self._path(ledger_id)):
            return sealed
        return self._bucket.open_sealed(ledger_id)

    def open_sidecar(self, ledger_id: int, suffix: str) -> pa.NativeFile | None:
        """Ledger ``ledger_id``'s sidecar ``suffix`` as a random-access file
        (``pyarrow.parquet`` reads it): the local one, else the bucket's; None if neither."""
        import pyarrow as pa

        path = self._path(ledger_id) + suffix
        try:
            return pa.OSFile(path, mode="r")
        except FileNotFoundError:
            pass
        return None if self._bucket is None else self._bucket.open_native(ledger_object_name(ledger_id, suffix))

    def upload_sealed(self, ledger_id: int) -> tuple[int, int]:
        """Copy sealed ledger ``ledger_id``'s local file and its sidecars to the bucket,
        then read each copy back: ``(size, crc32c)`` of the ledger's file when every copy
        matches its local file. ``ObjectMismatchError`` when one does not (the copies stay
        for the caller to delete or upload again), ``LedgerIOError`` when the bucket
        fails, ``LedgerNotFoundError`` / ``LedgerError`` when there is no sealed local file.
        Works on a read-only store (it writes only to the bucket): an executor uploads a
        ledger it wrote whole in a scratch directory so."""
        return self._need_bucket(ledger_id).upload_sealed(self._path(ledger_id), ledger_id)

    def upload_sidecar(self, ledger_id: int, suffix: str, local_path: str) -> None:
        """Copy the sidecar file ``local_path`` to ledger ``ledger_id``'s object of
        ``suffix`` (a key index built for a ledger that lives only in the bucket) and read
        it back; ``ObjectMismatchError`` when the copy differs, ``LedgerIOError`` when the
        bucket fails. Works on a read-only store (it writes only to the bucket)."""
        self._need_bucket(ledger_id).upload_sidecar(ledger_id, suffix, local_path)

    def _need_bucket(self, ledger_id: int) -> LedgerBucket:
        if self._bucket is None:
            raise LedgerError(f"ledger store {self.root} has no bucket", ledger_id=ledger_id)
        return self._bucket

    def drop_local(self, ledger_id: int) -> bool:
        """Remove ledger ``ledger_id``'s local file and sidecars; its bucket copy stays and
        serves every read from now on (a reader of this store that had it loaded goes on
        from the bucket). False (a no-op) when there is no local file. ``ObjectMismatchError``
        (nothing removed) when the bucket holds no object of the local file's size."""
        self._check_writable()
        bucket = self._need_bucket(ledger_id)
        path = self._path(ledger_id)
        if not os.path.exists(path):
            return False
        source = bucket.open(ledger_object_name(ledger_id))
        local_size = os.path.getsize(path)
        if source is None or source.size != local_size:
            raise ObjectMismatchError(
                f"ledger {ledger_id}: the bucket holds {'no copy' if source is None else f'{source.size} bytes'} "
                f"of its {local_size}-byte file; the local file is kept", ledger_id=ledger_id)
        with self._lock:
            ledger = self._ledgers.get(ledger_id)
            if ledger is not None and not ledger.sealed:
                raise LedgerError(f"ledger {ledger_id} is open; only a sealed ledger's file is dropped",
                                  ledger_id=ledger_id)
            if ledger is not None and ledger.source is None:  # same bytes: the same layout
                remote = _FileLedger(ledger_id, ledger.path, ledger.scanned, ledger.end, ledger.last_add_confirmed)
                remote.sealed, remote.source = True, source
                self._ledgers[ledger_id] = remote
            self._handles.discard(ledger_id)
        for local in [*sidecar_paths(path), path]:  # sidecars first
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
        fsync_dir(self.root)
        return True

    def _adopt_remote(self, ledger_id: int, entry_offsets: array[int], entry_lengths: array[int]) -> bool:
        assert self._bucket is not None
        adopted = self._bucket.adopt(ledger_id, entry_offsets, entry_lengths)
        if adopted is None:
            log.warning("ledger %d: no object, or its writer's layout does not match it; it will be walked", ledger_id)
            return False
        scanned, source = adopted
        with self._lock:
            if ledger_id in self._ledgers:
                return False
            self._install(ledger_id, self._path(ledger_id), scanned).source = source
        return True

    def file_powers(self) -> FileLedgerStore:
        """The store is its own ``LedgerFiles`` (``ledger.storage.powers``)."""
        return self

    def shutdown(self) -> None:
        """Make every pending append durable, stop the flusher, close every file."""
        with self._lock:
            self._stopping = True
            self._wakeup.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        with self._lock:
            ledgers = [ledger for ledger in self._ledgers.values() if ledger.pending_futures]
        for ledger in ledgers:
            self._flush_one(ledger)
        with self._lock:
            self._ledgers.clear()
            self._handles.close_all()  # a descriptor a reader still holds closes after it

    # -- group commit -------------------------------------------------------------------

    def _flush_loop(self) -> None:
        """The flusher thread: sync whatever is pending, until ``shutdown``."""
        while True:
            with self._lock:
                while not self._dirty and not self._stopping:
                    self._wakeup.wait()
                if not self._dirty and self._stopping:
                    return
                batch = list(self._dirty.values())
                self._dirty.clear()
            for ledger in batch:
                self._flush_one(ledger)

    def _flush_one(self, ledger: _FileLedger) -> None:
        """Write and sync ``ledger``'s pending records on its (pinned) descriptor; one
        ledger at a time, so that a batch of thousands never opens thousands of files."""
        try:
            with self._lock:
                if self._ledgers.get(ledger.ledger_id) is not ledger:
                    return  # deleted: its appends were failed back already
                handle = self._pin(ledger)
        except LedgerError as error:
            self._fail(ledger, [], error)
            return
        try:
            with ledger.io_lock:
                self._flush_pending(ledger, handle.fd)
        finally:
            self._unpin(handle)

    def _flush_pending(self, ledger: _FileLedger, fd: int) -> None:
        """Write and sync ``ledger``'s pending records; the caller holds ``io_lock``."""
        with self._lock:
            if not ledger.pending_futures:
                return
            data, futures = ledger.pending, ledger.pending_futures  # taken whole: no copy
            _assert_appendable(ledger, futures[0][0], futures[-1][0])
            ledger.pending, ledger.pending_futures = bytearray(), []
            self._dirty.pop(ledger.ledger_id, None)
            write_at = ledger.scanned.entry_offsets[futures[0][0]]
        try:
            write_all(fd, data, write_at)
            os.fdatasync(fd)
        except OSError as error:
            self._fail(ledger, futures, error)
            return
        with self._lock:
            ledger.last_add_confirmed = futures[-1][0]
        for entry_id, future in futures:
            future.set_result(entry_id)

    def _write_unsynced(self, ledger: _FileLedger, fd: int) -> None:
        """Write a ``durable_at_seal`` ledger's gathered records without a sync; the
        caller holds ``io_lock``. A failure fences the ledger and raises."""
        with self._lock:
            if ledger.failed:
                raise LedgerFencedError(f"ledger {ledger.ledger_id} failed a write and is fenced",
                                        ledger_id=ledger.ledger_id)
            data, ledger.pending = bytes(ledger.pending), bytearray()
            first = ledger.last_add_confirmed + 1
            last = len(ledger.scanned.entry_offsets) - 1
            if not data:
                return
            write_at = ledger.scanned.entry_offsets[first]
        try:
            write_all(fd, data, write_at)
        except OSError as error:
            self._fail(ledger, [], error)
            raise LedgerIOError(f"ledger {ledger.ledger_id}: {error}", ledger_id=ledger.ledger_id) from error
        with self._lock:
            ledger.last_add_confirmed = last

    def _write_inline(self, ledger: _FileLedger, fd: int, record: bytes, entry_id: int) -> None:
        """ALWAYS/NONE: write (and for ALWAYS sync) one record; the caller holds io_lock."""
        with self._lock:
            _assert_appendable(ledger, entry_id, entry_id)
            if ledger.failed:  # an earlier append failed while this one waited for io_lock
                raise LedgerFencedError(f"ledger {ledger.ledger_id} failed a write and is fenced",
                                        ledger_id=ledger.ledger_id)
        try:
            write_all(fd, record, ledger.scanned.entry_offsets[entry_id])
            if self.sync is SyncPolicy.ALWAYS:
                os.fdatasync(fd)
        except OSError as error:
            self._fail(ledger, [], error)
            raise LedgerIOError(f"ledger {ledger.ledger_id}: {error}", ledger_id=ledger.ledger_id) from error
        with self._lock:
            ledger.last_add_confirmed = entry_id

    def _fail(
        self, ledger: _FileLedger, futures: builtins.list[tuple[int, Future[int]]], error: Exception
    ) -> None:
        """A write or sync failed: fence the ledger and fail every unconfirmed append."""
        log.error("ledger %d: write failed, fencing it: %s", ledger.ledger_id, error)
        with self._lock:
            ledger.failed = True
            futures = futures + ledger.pending_futures
            ledger.pending, ledger.pending_futures = bytearray(), []
        failure = LedgerIOError(f"ledger {ledger.ledger_id}: {error}", ledger_id=ledger.ledger_id)
        for _, future in futures:
            future.set_exception(failure)

    # -- loading and helpers ------------------------------------------------------------

    def _load(self, ledger_id: int, *, refresh: bool = False) -> _FileLedger:
        """The loaded ledger; scans (and in a writable store repairs) it on first use."""
        ledger = self._ledgers.get(ledger_id)
        if ledger is not None and not (refresh and not ledger.sealed):
            return ledger
        path = self._path(ledger_id)
        handle = self._pin_path(ledger_id, path)
        try:
            scanned = self._scan(ledger_id, path, handle.fd)
        except BaseException:
            self._handles.unpin(handle)
            self._handles.discard(ledger_id)
            raise
        self._handles.unpin(handle)
        if ledger is not None:  # refresh of a read-only view: swap in the new scan
            self._ledgers.pop(ledger_id)
        return self._install(ledger_id, path, scanned)

    def _preload(self, ledger_id: int) -> None:
        """Scan ledger ``ledger_id``'s file if it is not loaded yet, without holding the
        store's ``_lock`` (the scan of a large file would hold up every other ledger's
        appends and reads meanwhile); the ``_load`` that follows finds it loaded. Only a
        writable store's ledgers: nothing writes to a ledger this store has not loaded.
        What goes wrong is left for ``_load`` to raise. A ledger whose file is absent is
        loaded from the bucket here (in any store), or not at all."""
        if ledger_id in self._ledgers:  # loaded: no lock taken (reads' hot path)
            return
        if self._bucket is not None and not os.path.exists(self._path(ledger_id)):
            self._preload_remote(ledger_id)
            return
        if self.read_only:
            return
        with self._lock:
            if ledger_id in self._ledgers:
                return
            path = self._path(ledger_id)
            try:
                handle = self._handles.pin(ledger_id, path)
            except OSError:
                return
        try:
            scanned = scan_fd(handle.fd, path)
        except Exception:  # noqa: BLE001 - _load scans again and raises it
            scanned = None
        with self._lock:
            self._handles.unpin(handle)
            if scanned is None or ledger_id in self._ledgers or handle.discarded:  # loaded or deleted meanwhile
                return
            handle = self._pin_path(ledger_id, path)
            try:
                self._check_scan(ledger_id, path, handle.fd, scanned)
            finally:
                self._handles.unpin(handle)
            self._install(ledger_id, path, scanned)

    def _preload_remote(self, ledger_id: int) -> None:
        """Load ledger ``ledger_id`` from its bucket object, outside the lock; a missing
        object leaves it unloaded (``_load`` then raises ``LedgerNotFoundError``)."""
        assert self._bucket is not None
        opened = self._bucket.load(ledger_id)
        if opened is None:
            return
        scanned, source = opened
        with self._lock:
            if ledger_id not in self._ledgers:
                self._install(ledger_id, self._path(ledger_id), scanned).source = source

    def _pin_path(self, ledger_id: int, path: str) -> FileHandle:
        try:
            return self._handles.pin(ledger_id, path)
        except FileNotFoundError:
            raise LedgerNotFoundError(f"no ledger {ledger_id}", ledger_id=ledger_id) from None
        except OSError as error:
            raise LedgerIOError(f"ledger {ledger_id}: cannot open {path}: {error}", ledger_id=ledger_id) from error

    def _install(self, ledger_id: int, path: str, scanned: ScanResult) -> _FileLedger:
        ledger = _FileLedger(ledger_id, path, scanned, scanned.intact_end, len(scanned.entry_offsets) - 1)
        ledger.sealed = scanned.sealed
        self._ledgers[ledger_id] = ledger
        return ledger

    def _scan(self, ledger_id: int, path: str, fd: int) -> ScanResult:
        """Scan ledger ``ledger_id``'s file; in a writable store, cut its torn tail."""
        scanned = scan_fd(fd, path)
        self._check_scan(ledger_id, path, fd, scanned)
        return scanned

    def _check_scan(self, ledger_id: int, path: str, fd: int, scanned: ScanResult) -> None:
        """Refuse a file holding no intact ledger ``ledger_id``; in a writable store, cut
        the torn tail ``scanned`` found. The caller holds ``_lock``."""
        if not scanned.valid or scanned.ledger_id != ledger_id:
            raise LedgerNotFoundError(f"{path} holds no intact ledger", ledger_id=ledger_id)
        if scanned.damaged_entries:
            log.error("ledger %d: entries %s fail their CRC32C check; reads of them will fail",
                      ledger_id, scanned.damaged_entries)
        if scanned.has_tail and not self.read_only:
            log.warning(
                "ledger %d: truncating %d bytes of torn or corrupt tail at offset %d",
                ledger_id, scanned.file_size - scanned.intact_end, scanned.intact_end,
            )
            os.ftruncate(fd, scanned.intact_end)
            os.fsync(fd)

    def _check_appendable(self, ledger: _FileLedger) -> None:
        if ledger.sealed:
            raise LedgerSealedError(f"ledger {ledger.ledger_id} is sealed", ledger_id=ledger.ledger_id)
        if ledger.failed:
            raise LedgerFencedError(
                f"ledger {ledger.ledger_id} failed a write and is fenced", ledger_id=ledger.ledger_id
            )

    def _check_writable(self) -> None:
        if self.read_only:
            raise LedgerError(f"ledger store {self.root} is open read-only")
        if self._stopping:
            raise LedgerFencedError(f"ledger store {self.root} is shut down")

    def _pin(self, ledger: _FileLedger) -> FileHandle:
        """``ledger``'s file descriptor, pinned for use outside the lock; holds ``_lock``."""
        try:
            return self._handles.pin(ledger.ledger_id, ledger.path)
        except FileNotFoundError:
            raise LedgerNotFoundError(f"ledger {ledger.ledger_id}'s file is gone",
                                      ledger_id=ledger.ledger_id) from None
        except OSError as error:
            raise LedgerIOError(f"ledger {ledger.ledger_id}: cannot open its file: {error}",
                                ledger_id=ledger.ledger_id) from error

    def _unpin(self, handle: FileHandle) -> None:
        with self._lock:
            self._handles.unpin(handle)

    def reserve_ids(self, count: int) -> builtins.list[int]:
        """Allocate ``count`` ledger ids durably at once (one sequence-file write) without
        creating their files: a writer elsewhere (``ledger.storage.sealed_writer``, on a
        Spark executor) writes each as a whole sealed ledger. An id never comes out again;
        one whose file is never written, or never referenced, is an orphan like any other."""
        self._check_writable()
        if count <= 0:
            return []
        with self._lock:
            try:
                first = self._next_ledger_id(count)
                fsync_dir(self.root)  # the new sequence file's name survives a crash
            except OSError as error:
                raise LedgerIOError(f"ledger store {self.root}: cannot reserve ledger ids: {error}") from error
        return builtins.list(range(first, first + count))

    def _next_ledger_id(self, count: int = 1) -> int:
        """Allocate ``count`` consecutive ids durably (sequence file, then the directory);
        the first of them. The caller holds _lock."""
        sequence_path = os.path.join(self.root, _SEQUENCE_FILE)
        if self._next_id is None:  # once: this store owns the directory from then on
            try:
                with open(sequence_path, encoding="ascii") as sequence:
                    self._next_id = int(sequence.read().strip() or "1")
            except FileNotFoundError:
                self._next_id = 1
            existing = self.list()
            self._next_id = max(self._next_id, existing[-1] + 1 if existing else 1)
        next_id = self._next_id
        temporary = sequence_path + ".tmp"
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="ascii") as sequence:
            sequence.write(str(next_id + count))
            sequence.flush()
            os.fsync(sequence.fileno())
        os.replace(temporary, sequence_path)
        self._next_id = next_id + count
        return next_id

    def _path(self, ledger_id: int) -> str:
        return os.path.join(self.root, f"{ledger_id:020d}{_SUFFIX}")


def _confirmed_length(ledger: _FileLedger) -> tuple[int, int]:
    lac = ledger.last_add_confirmed
    if lac < 0:
        return 0, ledger.scanned.entry_offsets[0] if ledger.scanned.entry_offsets else ledger.scanned.intact_end
    return lac + 1, ledger.scanned.entry_offsets[lac] + HEADER.size + ledger.scanned.entry_lengths[lac]


def _info(ledger: _FileLedger) -> LedgerInfo:
    lac = ledger.last_add_confirmed
    scanned = ledger.scanned
    confirmed = len(scanned.entry_offsets) == lac + 1  # nothing pending: the total counts
    size_bytes = scanned.size_bytes if confirmed else sum(scanned.entry_lengths[: lac + 1])
    return LedgerInfo(
        ledger_id=ledger.ledger_id,
        state=LedgerState.CLOSED if ledger.sealed else LedgerState.OPEN,
        last_add_confirmed=lac,
        size_bytes=size_bytes,
        created_at_ms=scanned.created_at_ms,
        metadata=dict(scanned.metadata),
    )


def _assert_appendable(ledger: _FileLedger, first: int, last: int) -> None:
    """P5, checked before entries ``first..last`` are written (the caller holds ``_lock``):
    nothing is written to a sealed ledger, and entry ids only grow, right after the last
    confirmed one (appends to one ledger come from one thread at a time: the managed
    ledger's lock, a compactor's single writer)."""
    assert not ledger.sealed, f"an append written to sealed ledger {ledger.ledger_id}"
    assert first == ledger.last_add_confirmed + 1 and last >= first, (
        f"ledger {ledger.ledger_id}: entries {first}..{last} written after {ledger.last_add_confirmed}")
