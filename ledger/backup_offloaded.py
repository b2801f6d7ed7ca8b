"""Offloaded ledgers in a backup: the ledgers whose only copy is in the bucket.

A backup is self-contained: a ledger offloaded and let go locally (``ledger.offload``:
``local_deleted_at_ms``) is copied into it like any sealed ledger, as
``ledgers/<id:020d>.ledger`` (the object is the local file's bytes). ``take_backup`` pins
each such object while it holds the broker's metadata writes, exactly as it hard-links a
local file: a copy inside the bucket (``pafs.FileSystem.copy_file``: S3's server-side
CopyObject, no download) under ``backup-staging/<uuid>/``, so a trim that deletes the
ledger right after cannot take it from the backup. After the hold it downloads the pinned
copies into the backup (each must end in a SEAL record) and deletes them.

Ledgers the layers above keep only in the bucket without a ledger-layer record (a compacted
view a Spark run wrote there: its manifest is the compactor's) are found by listing the
bucket (``bucket_ledger_ids``): every ledger object with no local file is pinned too, as
optional — one that vanished meanwhile (an orphan collected) or is not a whole sealed
ledger (an orphan of a failed upload) is left out; the restored broker's start removes
any such ledger nobody references, as it does local orphans.

``forget_offload`` then clears both offload columns in the backup's copy of the database:
every ledger of a restored data dir is local, and the restored broker neither reads nor
deletes the original cluster's objects; its own offload policy starts over.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Iterable

import pyarrow.fs as pafs

from ledger.errors import CompactionServiceError
from ledger.storage.bucket import ledger_object_name
from ledger.storage.file_io import open_private
from ledger.storage.object_fs import BucketConfig

__all__ = ["PinnedLedgers", "bucket_ledger_ids", "bucket_only_ledger_ids", "forget_offload"]

STAGING = "backup-staging"  # in the bucket, beside ledgers/: the pinned copies of one backup
_CHUNK = 1024 * 1024


def bucket_only_ledger_ids(database_copy: str) -> set[int]:
    """The ledgers of the copied database whose local copy was let go (in the bucket only)."""
    connection = sqlite3.connect(f"file:{database_copy}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT ledger_id FROM ledgers WHERE local_deleted_at_ms != 0").fetchall()
    except sqlite3.Error:  # no ledgers table yet, or a database from before offload
        rows = []
    finally:
        connection.close()
    return {int(row[0]) for row in rows}


def bucket_ledger_ids(bucket: BucketConfig) -> set[int]:
    """Every ledger with an object under ``ledgers/`` in ``bucket`` (sidecars aside)."""
    fs = bucket.open()
    infos = fs.get_file_info(pafs.FileSelector(f"{bucket.base}/ledgers", allow_not_found=True))
    return {int(info.base_name) for info in infos if info.type == pafs.FileType.File and info.base_name.isdigit()}


def forget_offload(database_copy: str) -> None:
    """Mark every ledger of the backup's database local and not offloaded."""
    connection = sqlite3.connect(database_copy)
    try:
        with connection:
            connection.execute("UPDATE ledgers SET offloaded_at_ms = 0, local_deleted_at_ms = 0")
    except sqlite3.OperationalError:  # no ledgers table, or no offload columns: nothing to forget
        pass
    finally:
        connection.close()


class PinnedLedgers:
    """Server-side copies of offloaded ledgers, taken for one backup (see the module docstring)."""

    def __init__(self, bucket: BucketConfig) -> None:
        self._bucket = bucket
        self._fs: pafs.FileSystem | None = None
        self._root = f"{bucket.base}/{STAGING}/{uuid.uuid4().hex}"
        self._pinned: dict[int, str] = {}

    def pin(self, ledger_ids: Iterable[int], error: type[CompactionServiceError], *, optional: bool = False) -> None:
        """Copy each ledger's object under this backup's staging name (while the caller holds
        the metadata writes); ``error`` when one is missing (``optional``: it is skipped) or
        the bucket fails."""
        try:
            self._fs = self._fs or self._bucket.open()
            if self._bucket.driver == "filesystem":  # a directory for the copies; S3 needs none
                self._fs.create_dir(self._root, recursive=True)
            for ledger_id in sorted(ledger_ids):
                source = f"{self._bucket.base}/{ledger_object_name(ledger_id)}"
                target = f"{self._root}/{ledger_id:020d}"
                try:
                    self._fs.copy_file(source, target)
                except FileNotFoundError:
                    if optional:
                        continue
                    raise error(f"offloaded ledger {ledger_id} is missing from {self._bucket.to_url()}: "
                                "the backup cannot hold it") from None
                self._pinned[ledger_id] = target
        except OSError as failure:
            raise error(f"cannot copy the offloaded ledgers in {self._bucket.to_url()}: {failure}") from None

    def download(self, directory: str, suffix: str, error: type[CompactionServiceError]) -> list[str]:
        """Write each pinned ledger to ``directory/<id:020d><suffix>``; the paths written."""
        written = []
        assert self._fs is not None or not self._pinned
        try:
            for ledger_id, pinned in sorted(self._pinned.items()):
                path = os.path.join(directory, f"{ledger_id:020d}{suffix}")
                assert self._fs is not None
                with self._fs.open_input_stream(pinned) as source, open_private(path) as sink:
                    while chunk := source.read(_CHUNK):
                        sink.write(chunk)
                written.append(path)
        except OSError as failure:
            raise error(f"cannot download the offloaded ledgers from {self._bucket.to_url()}: {failure}") from None
        return written

    def release(self) -> None:
        """Delete this backup's pinned copies (best effort: the bucket may be failing)."""
        if self._fs is None:
            return
        with contextlib.suppress(OSError):
            self._fs.delete_dir(self._root)
        self._pinned.clear()
