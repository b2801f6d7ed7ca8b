"""Backups in object storage: a backup (``ledger.backup``) written as objects, and restored.

A backup under a ``BucketConfig`` (``s3://bucket/prefix`` or ``file:///dir``) holds the
same files as a backup directory, as objects named by their paths under ``base``::

    <base>/metadata.db, <base>/ledgers/..., <base>/manifest.json (written last)

``upload_backup`` reads a backup's tar stream (``ledger.backup.tar_chunks``: the manifest
first) and writes each file as one object (a PUT or a completed multipart upload is atomic:
an object is whole or absent), hashing the bytes as they go; each must match its size and
SHA-256 in the manifest. It then reads every object back and checks it again, and only then
writes ``manifest.json``. A backup is therefore complete exactly when its manifest object
exists: an upload cut short leaves objects without one, which ``restore_from_bucket`` refuses
as incomplete. The destination must hold no object (a backup is never written over anything).

``restore_from_bucket`` reads the manifest, refuses objects under the base it does not list,
downloads every file into a new directory beside the data dir while checking its size and
SHA-256, and renames that directory into place only when every file matched: a missing,
truncated or altered object is refused by name and no data dir is written.

Transient storage errors (5xx, resets, timeouts) are retried by the S3 client
(``BucketConfig.open``: the AWS SDK's standard strategy); one that outlasts the retries ends
the upload or restore with ``BackupError``. Credentials come only from the AWS default chain.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow.fs as pafs

from ledger.backup import MANIFEST, BackupError, check_manifest, open_tar_stream
from ledger.storage.file_io import fsync_dir, make_private_dirs, open_private
from ledger.storage.object_fs import BucketConfig

__all__ = ["restore_from_bucket", "upload_backup", "verify_bucket_backup"]

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024


def upload_backup(chunks: Iterable[bytes], bucket: BucketConfig) -> dict[str, Any]:
    """Write the backup tar stream ``chunks`` into ``bucket`` (no object may be there yet)
    and return its manifest, once every object is verified and the manifest written."""
    where = bucket.to_url()
    fs = _open(bucket)
    _require_empty(fs, bucket)
    written: set[str] = set()
    try:
        with open_tar_stream(chunks) as archive:
            manifest: dict[str, Any] | None = None
            for member in archive:
                if manifest is None:
                    if member.name != MANIFEST:
                        raise BackupError(f"the backup stream for {where} does not begin with {MANIFEST}")
                    manifest_bytes = _read_member(archive, member)
                    manifest = check_manifest(_parse(manifest_bytes, where), where, MANIFEST)
                    expected = {entry["path"]: entry for entry in manifest["files"]}
                    continue
                entry = expected.get(member.name)
                if entry is None or not member.isfile() or member.name in written:
                    raise BackupError(f"the backup stream for {where} holds {member.name}, not in its manifest")
                size, digest = _upload(fs, bucket, member.name, _chunks(archive.extractfile(member)))
                _check(entry, size, digest, f"the backup stream for {where}")
                written.add(member.name)
    except (EOFError, OSError) as error:
        raise BackupError(f"the upload of the backup to {where} failed, the backup there is incomplete "
                          f"(no {MANIFEST}): {error}") from None
    except tarfile.TarError as error:
        raise BackupError(f"the backup stream for {where} is damaged or cut short: {error}") from None
    if manifest is None:
        raise BackupError(f"the backup stream for {where} is empty")
    missing = sorted(set(expected) - written)
    if missing:
        raise BackupError(f"the backup stream for {where} ended without {missing[0]}")
    try:
        _verify_objects(fs, bucket, manifest, where)
        _upload(fs, bucket, MANIFEST, [manifest_bytes])
    except OSError as error:
        raise BackupError(f"the upload of the backup to {where} failed, the backup there is incomplete "
                          f"(no {MANIFEST}): {error}") from None
    log.info("backup written to %s: %d files", where, len(manifest["files"]))
    return manifest


def verify_bucket_backup(bucket: BucketConfig) -> dict[str, Any]:
    """The manifest of the backup in ``bucket`` once every object matches it; ``BackupError``
    naming the first object that is missing, extra, of the wrong size or checksum."""
    where = bucket.to_url()
    fs = _open(bucket)
    try:
        manifest = _read_manifest(fs, bucket)
        _verify_objects(fs, bucket, manifest, where)
    except OSError as error:
        raise BackupError(f"the backup at {where} cannot be read: {error}") from None
    return manifest


def restore_from_bucket(bucket: BucketConfig, data_dir: str) -> dict[str, Any]:
    """Download the backup in ``bucket`` into the new data dir ``data_dir`` (absent or
    empty), every file checked against the manifest on the way; returns the manifest."""
    where = bucket.to_url()
    data_dir = os.path.abspath(data_dir)
    if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or os.listdir(data_dir)):
        raise BackupError(f"the data dir {data_dir} exists and is not empty: restore into a new one")
    fs = _open(bucket)
    partial = f"{data_dir}.restoring-{uuid.uuid4().hex[:8]}"
    try:
        manifest = _read_manifest(fs, bucket)
        _refuse_extra(fs, bucket, manifest, where)
        for entry in manifest["files"]:
            target = os.path.join(partial, entry["path"])
            make_private_dirs(os.path.dirname(target), exist_ok=True)
            try:
                source = fs.open_input_stream(_name(bucket, entry["path"]))
            except FileNotFoundError:
                raise BackupError(f"backup {where} is incomplete: {entry['path']} is missing") from None
            with source, open_private(target) as sink:
                size, digest = _copy(_chunks(source), sink.write)
                sink.flush()
                os.fsync(sink.fileno())
            _check(entry, size, digest, f"backup {where}")
            fsync_dir(os.path.dirname(target))
        fsync_dir(partial)
        if os.path.isdir(data_dir):
            os.rmdir(data_dir)  # empty, checked above
        os.replace(partial, data_dir)
        fsync_dir(os.path.dirname(data_dir))
    except OSError as error:
        raise BackupError(f"the restore of {where} into {data_dir} failed: {error}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log.info("backup %s restored into %s", where, data_dir)
    return manifest


# -- helpers ------------------------------------------------------------------------------


def _open(bucket: BucketConfig) -> pafs.FileSystem:
    try:
        return bucket.open()
    except OSError as error:
        raise BackupError(f"cannot open {bucket.to_url()}: {error}") from None


def _name(bucket: BucketConfig, relative: str) -> str:
    return f"{bucket.base}/{relative}"


def _relative(bucket: BucketConfig, name: object) -> str:
    text = str(name or "")
    return text.removeprefix(bucket.base + "/") if text else "an object"


def _objects(fs: pafs.FileSystem, bucket: BucketConfig) -> list[str]:
    """Every object under the base, by its path relative to it."""
    selector = pafs.FileSelector(bucket.base, recursive=True, allow_not_found=True)
    return sorted(_relative(bucket, info.path) for info in fs.get_file_info(selector)
                  if info.type == pafs.FileType.File)


def _require_empty(fs: pafs.FileSystem, bucket: BucketConfig) -> None:
    where = bucket.to_url()
    try:
        found = _objects(fs, bucket)
    except OSError as error:
        raise BackupError(f"cannot list {where}: {error}") from None
    if MANIFEST in found:
        raise BackupError(f"{where} already holds a backup: back up to a new prefix")
    if found:
        raise BackupError(f"{where} is not empty (it holds {found[0]}, without a {MANIFEST}: an upload "
                          "cut short, or other data): back up to a new prefix")


def _upload(fs: pafs.FileSystem, bucket: BucketConfig, relative: str, chunks: Iterable[bytes]) -> tuple[int, str]:
    name = _name(bucket, relative)
    fs.create_dir(name.rsplit("/", 1)[0], recursive=True)  # a directory for filesystem; no-op on S3
    with fs.open_output_stream(name) as sink:
        return _copy(chunks, sink.write)


def _copy(chunks: Iterable[bytes], write: Any) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
        write(chunk)
    return size, digest.hexdigest()


def _check(entry: dict[str, Any], size: int, digest: str, where: str) -> None:
    if size != entry["size"]:
        raise BackupError(f"{where} is damaged: {entry['path']} has {size} bytes, its manifest says {entry['size']}")
    if digest != entry["sha256"]:
        raise BackupError(f"{where} is damaged: {entry['path']} does not match its SHA-256 checksum in the manifest")


def _read_member(archive: Any, member: Any) -> bytes:
    source = archive.extractfile(member)
    if source is None:
        raise BackupError(f"{member.name} in the backup stream is not a file")
    return bytes(source.read())


def _parse(data: bytes, where: str) -> object:
    try:
        return json.loads(data)
    except ValueError as error:
        raise BackupError(f"backup {where} is damaged: {MANIFEST} cannot be read: {error}") from None


def _read_manifest(fs: pafs.FileSystem, bucket: BucketConfig) -> dict[str, Any]:
    where = bucket.to_url()
    try:
        with fs.open_input_stream(_name(bucket, MANIFEST)) as source:
            data = source.read()
    except FileNotFoundError:
        raise BackupError(f"{where} is not a complete compactd backup: it has no {MANIFEST}") from None
    return check_manifest(_parse(data, where), where, MANIFEST)


def _refuse_extra(fs: pafs.FileSystem, bucket: BucketConfig, manifest: dict[str, Any], where: str) -> None:
    listed = {entry["path"] for entry in manifest["files"]} | {MANIFEST}
    extra = [name for name in _objects(fs, bucket) if name not in listed]
    if extra:
        raise BackupError(f"backup {where} is damaged: {extra[0]} is not in its manifest")


def _verify_objects(fs: pafs.FileSystem, bucket: BucketConfig, manifest: dict[str, Any], where: str) -> None:
    _refuse_extra(fs, bucket, manifest, where)
    for entry in manifest["files"]:
        try:
            with fs.open_input_stream(_name(bucket, entry["path"])) as source:
                size, digest = _copy(_chunks(source), lambda _chunk: None)
        except FileNotFoundError:
            raise BackupError(f"backup {where} is incomplete: {entry['path']} is missing") from None
        _check(entry, size, digest, f"backup {where}")


def _chunks(source: Any) -> Iterator[bytes]:
    """``source`` (a binary file) read to its end in chunks."""
    while chunk := source.read(_CHUNK):
        yield chunk
