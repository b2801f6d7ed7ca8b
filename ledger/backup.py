"""Backups of a data dir, taken while its broker runs, and their restore into a new one.

A backup is a directory::

    BACKUP/metadata.db             a copy of the metadata database (SQLite's online backup API)
    BACKUP/ledgers/<id>.ledger     the ledgers that copy can reference
    BACKUP/ledgers/LEDGER_ID_SEQUENCE
    BACKUP/manifest.json           written last: every file with its size and SHA-256

``take_backup`` copies the database while holding every metadata write of the broker off
(``Database.backed_up_to``), and while still holding it links each ledger file into the
backup (a hard link, or a copy across file systems). A ledger leaves the metadata before
its file is deleted (``ledger.metadata``'s ordering rule), so every ledger the copy
references is linked. Appends go on meanwhile: producers are never stopped, only the
metadata writes wait for the copy and the links (milliseconds for a small database).

A sealed ledger never changes, so its link is its copy. An *open* ledger (``closed_at_ms``
0 in the copy) keeps growing through its link: its confirmed prefix (the entries up to
``last_add_confirmed`` when the copy was taken, ``LedgerFiles.confirmed_length``) is
copied instead, and the manifest records that position. Every message acknowledged before
the backup began is durable, hence inside that prefix. Ledger files the copy cannot
reference and that are not sealed (a compaction run's ledger being written) are left out;
sealed ones it does not reference are kept and collected as orphans at the restored
broker's start. The restored broker seals each open ledger at its recorded prefix, as it
does after a crash.

Cursor positions are those persisted when the copy was taken (acknowledgements are
persisted at ``managed_ledger_mark_delete_rate_limit``): a restored subscription may get
redelivered what was acknowledged just before, never loses an unacknowledged message.

**Streamed.** A running broker stages the backup inside its data dir (``stage_backup``:
``DATA_DIR/backup-staging``, so sealed ledgers are hard links and cost no space) and
streams it as a tar (``tar_chunks``); ``compactd backup --admin-url`` writes the stream
into a directory on its own host (``extract_backup``), which then holds the same files
and is verified against the manifest. The broker never writes outside its data dir on a
request's behalf.

**Offloaded ledgers** (in the bucket only) are pinned while the metadata writes are held
and downloaded into the backup (``ledger.backup_offloaded``); the backup's database marks
every ledger local. **In a bucket**: ``ledger.backup_bucket`` writes a backup's tar stream
as objects and restores from them, with the same checks.

``verify_backup`` checks the manifest and every file against it; ``restore_backup``
verifies, then copies the files into a new data dir (never over an existing one) and syncs
them. A damaged, incomplete or foreign backup is refused with ``BackupError`` naming the
file and what is wrong.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import sqlite3
import tarfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ledger.backup_offloaded import (
    PinnedLedgers,
    bucket_ledger_ids,
    bucket_only_ledger_ids,
    forget_offload,
)
from ledger.data_dir import DataDir
from ledger.errors import CompactionServiceError
from ledger.storage.file_io import (
    FILE_MODE,
    copy_private,
    fsync_dir,
    make_private_dirs,
    open_private,
)
from ledger.storage.object_fs import BucketConfig
from ledger.storage.record import HEADER, RecordKind, encode_record

__all__ = [
    "MANIFEST",
    "STAGING",
    "BackupError",
    "BackupSummary",
    "check_manifest",
    "extract_backup",
    "open_tar_stream",
    "opened_offline",
    "remove_staged",
    "restore_backup",
    "stage_backup",
    "take_backup",
    "tar_chunks",
    "verify_backup",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STAGING = "backup-staging"  # in the data dir: where the running broker stages a streamed backup
FORMAT = "compactd-backup"
FORMAT_VERSION = 1
_DATABASE = "metadata.db"
_LEDGERS = "ledgers"
_SEQUENCE = "LEDGER_ID_SEQUENCE"
_SUFFIX = ".ledger"
_SEAL_RECORD_BYTES = HEADER.size + 16  # a SEAL record: header, entries:u64, size_bytes:u64
_CHUNK = 1024 * 1024


class BackupError(CompactionServiceError):
    """A backup cannot be taken, or a backup directory is damaged or not a backup."""


@dataclass(frozen=True, slots=True)
class BackupSummary:
    """What a backup holds: its directory, file count, bytes, open ledgers' positions."""

    path: str
    files: int
    size_bytes: int
    open_ledgers: dict[int, int]  # ledger id -> entries kept (up to last_add_confirmed)
    created_at_ms: int

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "files": self.files, "sizeBytes": self.size_bytes,
                "openLedgers": {str(k): v for k, v in self.open_ledgers.items()},
                "createdAtMs": self.created_at_ms}


# -- taking a backup ---------------------------------------------------------------------


def take_backup(data_dir: DataDir, output: str, *, _staged: bool = False) -> BackupSummary:
    """Write a backup of ``data_dir`` (open, possibly serving) into ``output``, which must
    not exist or be an empty directory outside the data dir; see the module docstring."""
    store = data_dir.ledgers
    files = store.file_powers()
    if files is None:
        raise BackupError(f"the ledgers of {data_dir.path} are not files: nothing to back up")
    output = os.path.abspath(output)
    _prepare_output(output, inside=None if _staged else data_dir.path)
    ledgers_out = os.path.join(output, _LEDGERS)
    make_private_dirs(ledgers_out)
    started_ms = int(time.time() * 1000)
    pending: dict[int, tuple[str, int, int]] = {}  # open ledger: (temporary link, entries, bytes)
    database = os.path.join(output, _DATABASE)
    pinned: PinnedLedgers | None = None
    try:
        with data_dir.database.backed_up_to(database):
            open_ids = _open_ledger_ids(database)
            linked = set()
            for ledger_id in store.list():
                source = os.path.join(files.root, f"{ledger_id:020d}{_SUFFIX}")
                if ledger_id in open_ids:
                    entries, length = files.confirmed_length(ledger_id)
                    temporary = os.path.join(output, f"{ledger_id}.partial")
                    if _link_or_copy(source, temporary):
                        pending[ledger_id] = (temporary, entries, length)
                elif _link_or_copy(source, os.path.join(ledgers_out, os.path.basename(source))):
                    linked.add(ledger_id)
            _link_or_copy(os.path.join(files.root, _SEQUENCE), os.path.join(ledgers_out, _SEQUENCE), copy=True)
            required = bucket_only_ledger_ids(database) - linked
            optional = set() if files.bucket is None else _listed(files.bucket) - linked - required
            pinned = _pin_offloaded(required, optional, files.bucket, data_dir.path)
        for ledger_id, (temporary, _, length) in pending.items():
            _copy_prefix(temporary, os.path.join(ledgers_out, f"{ledger_id:020d}{_SUFFIX}"), length)
            os.unlink(temporary)
        _drop_unsealed(ledgers_out, kept=set(pending))
        if pinned is not None:
            for path in pinned.download(ledgers_out, _SUFFIX, BackupError):
                if not _ends_sealed(path) and int(os.path.basename(path).split(".")[0]) in optional:
                    os.unlink(path)  # an orphan of a failed upload: no part of the data dir
                elif not _ends_sealed(path):
                    raise BackupError(f"the offloaded copy of {os.path.basename(path)} in the bucket is not a "
                                      "whole sealed ledger")
    finally:
        if pinned is not None:
            pinned.release()
    forget_offload(database)
    summary = _write_manifest(output, started_ms, {k: v[1] for k, v in pending.items()})
    log.info("backup of %s written to %s: %d files, %d bytes", data_dir.path, output, summary.files,
             summary.size_bytes)
    return summary


def _listed(bucket: BucketConfig) -> set[int]:
    """The ledgers with an object in ``bucket`` (``ledger.backup_offloaded.bucket_ledger_ids``)."""
    try:
        return bucket_ledger_ids(bucket)
    except OSError as failure:
        raise BackupError(f"cannot list the ledgers in {bucket.to_url()}: {failure}") from None


def _pin_offloaded(ledger_ids: set[int], optional: set[int], bucket: BucketConfig | None,
                   path: str) -> PinnedLedgers | None:
    """Pin the ledgers that live only in the bucket (``ledger.backup_offloaded``): each of
    ``ledger_ids`` must be there; ``optional`` ones are pinned when they still are."""
    if not ledger_ids and not optional:
        return None
    if bucket is None:
        raise BackupError(f"ledger {min(ledger_ids)} of {path} lives only in its offload bucket, and the data dir "
                          "was opened without one: back up the running broker with --admin-url")
    pinned = PinnedLedgers(bucket)
    try:
        pinned.pin(ledger_ids, BackupError)
        pinned.pin(optional, BackupError, optional=True)
    except BaseException:
        pinned.release()
        raise
    return pinned


def _prepare_output(output: str, *, inside: str | None) -> None:
    real = os.path.realpath(output)
    if inside is not None and (real == os.path.realpath(inside) or real.startswith(os.path.realpath(inside) + os.sep)):
        raise BackupError(f"the backup directory {output} lies inside the data dir {inside}")
    if os.path.exists(output):
        if not os.path.isdir(output) or os.listdir(output):
            raise BackupError(f"the backup directory {output} exists and is not empty")
        return
    try:
        make_private_dirs(output)
    except OSError as error:
        raise BackupError(f"cannot create the backup directory {output}: {error.strerror}") from None


def _open_ledger_ids(database_copy: str) -> set[int]:
    """The ledgers still open in the copied database: their files keep growing."""
    connection = sqlite3.connect(f"file:{database_copy}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT ledger_id FROM ledgers WHERE closed_at_ms = 0").fetchall()
    except sqlite3.Error:  # a data dir with no topic yet has no ledgers table
        rows = []
    finally:
        connection.close()
    return {int(row[0]) for row in rows}


def _link_or_copy(source: str, target: str, *, copy: bool = False) -> bool:
    """Hard-link (or copy) ``source`` to ``target``; False when ``source`` is gone."""
    try:
        if copy:
            copy_private(source, target)
            return True
        try:
            os.link(source, target)
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            copy_private(source, target)
    except FileNotFoundError:
        return False
    return True


def _copy_prefix(source: str, target: str, length: int) -> None:
    with open(source, "rb") as reader, open_private(target) as writer:
        remaining = length
        while remaining:
            chunk = reader.read(min(_CHUNK, remaining))
            if not chunk:
                raise BackupError(f"{source} ended before its confirmed length {length}")
            writer.write(chunk)
            remaining -= len(chunk)


def _drop_unsealed(ledgers_out: str, *, kept: set[int]) -> None:
    """Remove linked files that are not sealed and not an open ledger's prefix: a ledger
    being written that the copied database does not reference."""
    for name in os.listdir(ledgers_out):
        if not name.endswith(_SUFFIX) or int(name[: -len(_SUFFIX)]) in kept:
            continue
        path = os.path.join(ledgers_out, name)
        if not _ends_sealed(path):
            os.unlink(path)


def _ends_sealed(path: str) -> bool:
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        if size < _SEAL_RECORD_BYTES:
            return False
        file.seek(size - _SEAL_RECORD_BYTES)
        tail = file.read(_SEAL_RECORD_BYTES)
    return tail[HEADER.size - 1] == RecordKind.SEAL and tail == encode_record(RecordKind.SEAL, tail[HEADER.size:])


def _write_manifest(output: str, started_ms: int, open_ledgers: dict[int, int]) -> BackupSummary:
    files: list[dict[str, Any]] = []
    for relative in _files_of(output):
        path = os.path.join(output, relative)
        files.append({"path": relative, "size": os.path.getsize(path), "sha256": _sha256(path)})
        _fsync(path)
    manifest = {
        "format": FORMAT, "version": FORMAT_VERSION, "created_at_ms": started_ms,
        "open_ledgers": {str(k): v for k, v in sorted(open_ledgers.items())}, "files": files,
    }
    temporary = os.path.join(output, MANIFEST + ".tmp")
    with open_private(temporary) as file:
        file.write(json.dumps(manifest, indent=1).encode())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, os.path.join(output, MANIFEST))
    fsync_dir(os.path.join(output, _LEDGERS))
    fsync_dir(output)
    return BackupSummary(output, len(files), sum(int(f["size"]) for f in files), open_ledgers, started_ms)


def _files_of(root: str) -> list[str]:
    found = [_DATABASE]
    found.extend(os.path.join(_LEDGERS, name) for name in sorted(os.listdir(os.path.join(root, _LEDGERS))))
    return found


# -- a backup as a stream --------------------------------------------------------------------


def stage_backup(data_dir: DataDir) -> str:
    """Take a backup into a staging directory of the data dir (``DATA_DIR/backup-staging``,
    same file system: every sealed ledger is a hard link) and return its path; the caller
    streams it (``tar_chunks``) and removes it (``remove_staged``). A staging directory
    left by a backup cut short is removed first."""
    root = os.path.join(data_dir.path, STAGING)
    shutil.rmtree(root, ignore_errors=True)
    make_private_dirs(root)
    output = os.path.join(root, uuid.uuid4().hex)
    take_backup(data_dir, output, _staged=True)
    return output


def remove_staged(path: str) -> None:
    """Remove a staged backup (its links cost nothing once gone), and the staging directory
    with it once it is empty: no backup leaves a trace in the data dir."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty (another backup's), or gone already
        os.rmdir(os.path.dirname(path))


def tar_chunks(backup: str) -> Iterator[bytes]:
    """The backup at ``backup`` as an uncompressed tar stream (POSIX pax), manifest first,
    in chunks of at most 1 MiB; ``extract_backup`` reads it back."""
    manifest = _read_manifest(backup)
    for relative in [MANIFEST, *(entry["path"] for entry in manifest["files"])]:
        path = os.path.join(backup, relative)
        info = tarfile.TarInfo(relative)
        info.size, info.mode, info.mtime = os.path.getsize(path), FILE_MODE, int(time.time())
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        with open(path, "rb") as file:
            remaining = info.size
            while remaining:
                chunk = file.read(min(_CHUNK, remaining))
                if not chunk:
                    raise BackupError(f"{path} shrank while it was streamed")
                remaining -= len(chunk)
                yield chunk
        if info.size % tarfile.BLOCKSIZE:
            yield bytes(tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
    yield bytes(2 * tarfile.BLOCKSIZE)


def extract_backup(chunks: Iterable[bytes], output: str) -> dict[str, Any]:
    """Write the tar stream ``chunks`` (``tar_chunks``) into the new or empty directory
    ``output`` and verify it; returns its manifest. ``BackupError`` when the stream is
    cut short, is not a tar of a backup, or a file does not match the manifest."""
    output = os.path.abspath(output)
    _prepare_output(output, inside=None)
    make_private_dirs(os.path.join(output, _LEDGERS))  # else the extraction creates it with the umask's mode
    try:
        with open_tar_stream(chunks) as archive:
            archive.extractall(output, filter="data")
    except (tarfile.TarError, EOFError) as error:
        raise BackupError(f"the backup stream into {output} is damaged or cut short: {error}") from None
    return verify_backup(output)


def open_tar_stream(chunks: Iterable[bytes]) -> tarfile.TarFile:
    """The tar stream ``chunks`` (``tar_chunks``) opened for reading, member after member."""
    return tarfile.open(fileobj=_ChunkReader(chunks), mode="r|")


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterable of byte chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            chunk = next(self._chunks, b"")
            if not chunk:
                return 0
            self._buffer = memoryview(chunk)
        count = min(len(target), len(self._buffer))
        target[:count] = self._buffer[:count]
        self._buffer = self._buffer[count:]
        return count


# -- verifying and restoring -------------------------------------------------------------


def verify_backup(backup: str) -> dict[str, Any]:
    """The manifest of the backup at ``backup`` once every file matches it; ``BackupError``
    naming the first file that is missing, extra, of the wrong size or checksum."""
    manifest = _read_manifest(backup)
    listed = {entry["path"] for entry in manifest["files"]}
    if os.path.isdir(os.path.join(backup, _LEDGERS)):
        extra = sorted(set(_files_of(backup)) - listed - {_DATABASE})
        if extra:
            raise BackupError(f"backup {backup} is damaged: {extra[0]} is not in its manifest")
    for entry in manifest["files"]:
        path = os.path.join(backup, entry["path"])
        if not os.path.isfile(path):
            raise BackupError(f"backup {backup} is incomplete: {entry['path']} is missing")
        size = os.path.getsize(path)
        if size != entry["size"]:
            raise BackupError(f"backup {backup} is damaged: {entry['path']} has {size} bytes, "
                              f"its manifest says {entry['size']}")
        if _sha256(path) != entry["sha256"]:
            raise BackupError(f"backup {backup} is damaged: {entry['path']} does not match its "
                              "SHA-256 checksum in the manifest")
    return manifest


def _read_manifest(backup: str) -> dict[str, Any]:
    path = os.path.join(backup, MANIFEST)
    try:
        with open(path, encoding="utf-8") as file:
            manifest = json.load(file)
    except FileNotFoundError:
        raise BackupError(f"{backup} is not a complete compactd backup: it has no {MANIFEST}") from None
    except (OSError, ValueError) as error:
        raise BackupError(f"backup {backup} is damaged: {MANIFEST} cannot be read: {error}") from None
    return check_manifest(manifest, backup, path)


def check_manifest(manifest: object, backup: str, path: str) -> dict[str, Any]:
    """``manifest`` (parsed JSON) when it is a backup manifest this compactd reads, with a
    valid file list naming the database; ``BackupError`` naming ``backup``/``path`` otherwise."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{path} is not a compactd backup manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise BackupError(f"{path} has backup format version {manifest.get('version')!r}; this compactd "
                          f"reads version {FORMAT_VERSION}")
    files = manifest.get("files")
    if not isinstance(files, list) or not all(_is_entry(entry) for entry in files):
        raise BackupError(f"backup {backup} is damaged: {MANIFEST} has no valid file list")
    if _DATABASE not in {entry["path"] for entry in files}:
        raise BackupError(f"backup {backup} is damaged: its manifest lists no {_DATABASE}")
    return manifest


def _is_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    path = entry.get("path")
    return (isinstance(path, str) and not os.path.isabs(path) and ".." not in path.split(os.sep)
            and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str))


def restore_backup(backup: str, data_dir: str) -> dict[str, Any]:
    """Verify the backup at ``backup``, then copy it into the new data dir ``data_dir``
    (absent or empty); returns the manifest. The data dir is complete once this returns:
    ``compactd serve --data-dir`` opens it."""
    manifest = verify_backup(backup)
    data_dir = os.path.abspath(data_dir)
    if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or os.listdir(data_dir)):
        raise BackupError(f"the data dir {data_dir} exists and is not empty: restore into a new one")
    make_private_dirs(os.path.join(data_dir, _LEDGERS), exist_ok=True)
    for entry in manifest["files"]:
        target = os.path.join(data_dir, entry["path"])
        copy_private(os.path.join(backup, entry["path"]), target)
        if _sha256(target) != entry["sha256"]:
            raise BackupError(f"restore into {data_dir}: {entry['path']} changed while it was copied")
        _fsync(target)
    fsync_dir(os.path.join(data_dir, _LEDGERS))
    fsync_dir(data_dir)
    log.info("backup %s restored into %s", backup, data_dir)
    return manifest


# -- helpers ------------------------------------------------------------------------------


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: str) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


@contextlib.contextmanager
def opened_offline(path: str) -> Iterator[DataDir]:
    """The data dir at ``path`` opened for an offline backup (no broker may hold it)."""
    if not os.path.isdir(path):
        raise BackupError(f"no data dir at {path}")
    data_dir = DataDir.open(path)
    try:
        yield data_dir
    finally:
        data_dir.close()
