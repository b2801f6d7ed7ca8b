"""The embedded default storage under one ``--data-dir``: lock, metadata, ledger files.

Layout::

    DATA_DIR/LOCK           the data-dir lock (``ledger.lock``)
    DATA_DIR/metadata.db    the shared SQLite metadata database (``ledger.database``; WAL,
                            ``-wal``/``-shm`` beside it): every layer's tables in one file
    DATA_DIR/ledgers/       one file per ledger (``ledger.storage.file``), but for the
                            sealed ledgers offloaded to the bucket (``ledger.offload``)
                            whose local copy is gone: those are read from the bucket

Everything is created owner-only: directories 0700, files 0600 (message data is private).
``DataDir.open`` takes the lock first and touches nothing else when it cannot; ``close``
makes pending appends durable, closes the database and releases the lock.

``metadata`` is the ledger layer's store; the layers above build theirs on ``database``
(``CursorStore(data_dir.database)``, ...), so that one transaction can span them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from ledger.database import Database
from ledger.lock import DataDirLock
from ledger.metadata import MetadataStore
from ledger.storage.base import LedgerStore, SyncPolicy
from ledger.storage.file import MAX_OPEN_FILES_DEFAULT, READ_CACHE_BYTES_DEFAULT, FileLedgerStore
from ledger.storage.object_fs import BucketConfig
from ledger.storage.sealed_writer import remove_temp_files
from ledger.storage.sidecars import remove_stale_sidecars

__all__ = ["DataDir"]

log = logging.getLogger(__name__)


@dataclass
class DataDir:
    """An opened, locked data dir."""

    path: str
    lock: DataDirLock
    metadata: MetadataStore
    ledgers: LedgerStore

    @property
    def database(self) -> Database:
        """The shared metadata database, on which each layer keeps its own tables."""
        return self.metadata.database

    @classmethod
    def open(
        cls, path: str, *, sync: SyncPolicy = SyncPolicy.GROUP, max_open_files: int = MAX_OPEN_FILES_DEFAULT,
        bucket: BucketConfig | None = None, read_cache_bytes: int = READ_CACHE_BYTES_DEFAULT,
    ) -> DataDir:
        """Lock ``path`` and open its stores; ``DataDirLockedError`` if another process has it.
        ``max_open_files`` bounds the ledger files kept open while idle; ``bucket`` is where
        sealed ledgers are offloaded (read through a cache of ``read_cache_bytes``)."""
        lock = DataDirLock.acquire(path)
        try:
            metadata = MetadataStore(os.path.join(lock.data_dir, "metadata.db"))
            ledgers = FileLedgerStore(os.path.join(lock.data_dir, "ledgers"), sync=sync,
                                      max_open_files=max_open_files, bucket=bucket,
                                      read_cache_bytes=read_cache_bytes)
        except BaseException:
            lock.release()
            raise
        return cls(lock.data_dir, lock, metadata, ledgers)

    def collect_orphans(self, also_live: Iterable[int] = ()) -> list[int]:
        """Delete every ledger neither a topic nor ``also_live`` references; return their ids.

        Call it at start, before any ledger is created: a ledger created by a run that
        crashed before referencing it is garbage (Pulsar leaks these). So are the
        temporary files of ledgers written whole elsewhere (``ledger.storage.sealed_writer``)
        by a writer that died: they are deleted too, and so are the temporary sidecar files
        and the sidecars of ledgers that are gone (``ledger.storage.sidecars``).
        """
        files = self.ledgers.file_powers()
        if files is not None:
            stale = remove_temp_files(files.root)
            if stale:
                log.info("removed temporary ledger files %s", stale)
        live = self.metadata.referenced_ledger_ids() | set(also_live)
        orphans = [ledger_id for ledger_id in self.ledgers.list() if ledger_id not in live]
        for ledger_id in orphans:
            self.ledgers.delete(ledger_id)
        if orphans:
            log.info("collected orphan ledgers %s", orphans)
        if files is not None:
            sidecars = remove_stale_sidecars(files.root)
            if sidecars:
                log.info("removed stale sidecar files %s", sidecars)
        return orphans

    def close(self) -> None:
        """Sync and close everything, then release the lock."""
        try:
            self.ledgers.shutdown()
            self.metadata.close()
        finally:
            self.lock.release()
