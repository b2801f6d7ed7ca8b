"""``compactd backup`` and ``compactd restore``: backups of a data dir, and their restore.

``compactd backup --admin-url URL --output DIR`` asks the running broker for a backup
(``POST /admin/v2/compactd/backup``, a tar stream; producers are not stopped), writes it
into ``DIR`` on this host and verifies every file against the manifest.
``compactd backup --data-dir PATH --output DIR`` backs up a stopped broker's data dir.
``compactd restore DIR --data-dir NEW`` checks every file of the backup against its
manifest, then writes a new data dir that ``compactd serve --data-dir NEW`` opens.

``--to URL`` (instead of ``--output``) writes the backup into object storage,
``s3://bucket/prefix`` or ``file:///dir`` (``ledger.backup_bucket``: the manifest object is
written last, once every object is verified), and ``compactd restore --from URL`` restores
from there. ``--endpoint``, ``--region`` and ``--tls-ca-file`` locate an S3-compatible store
(else the broker's ``COMPACTD_S3_MANAGED_LEDGER_OFFLOAD_*`` environment names them);
credentials come only from the AWS default chain, never from a flag.

Each prints one line of JSON on stdout when done; a failure prints ``compactd: <reason>``
on stderr and exits 1 (exit 2: a usage error), never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Annotated, Any, NoReturn

import httpx
import typer

from ledger.backup import (
    BackupError,
    extract_backup,
    opened_offline,
    remove_staged,
    restore_backup,
    stage_backup,
    take_backup,
    tar_chunks,
    verify_backup,
)
from ledger.backup_bucket import restore_from_bucket, upload_backup
from ledger.errors import CompactionServiceError, DataDirLockedError
from ledger.storage.object_fs import BucketConfig, BucketConfigError

__all__ = ["backup_command", "restore_command"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
BACKUP_PATH = "/admin/v2/compactd/backup"
# A backup reads every byte once to checksum it: allow far more than an admin request.
BACKUP_TIMEOUT_S = 3600.0


_ENDPOINT_ENV = "COMPACTD_S3_MANAGED_LEDGER_OFFLOAD_SERVICE_ENDPOINT"
_REGION_ENV = "COMPACTD_S3_MANAGED_LEDGER_OFFLOAD_REGION"
_TLS_CA_ENV = "COMPACTD_S3_MANAGED_LEDGER_OFFLOAD_TLS_CA_FILE"

Endpoint = Annotated[str | None, typer.Option(
    "--endpoint", metavar="URL", envvar=_ENDPOINT_ENV, show_default=False,
    help="The S3 endpoint of an s3:// URL (an S3-compatible store: http(s)://HOST:PORT).")]
Region = Annotated[str | None, typer.Option(
    "--region", metavar="REGION", envvar=_REGION_ENV, show_default=False, help="The S3 region of an s3:// URL.")]
TlsCaFile = Annotated[str | None, typer.Option(
    "--tls-ca-file", metavar="FILE", envvar=_TLS_CA_ENV, show_default=False,
    help="A PEM CA bundle that verifies an https endpoint's certificate.")]


def backup_command(
    output: Annotated[str | None, typer.Option("--output", "-o", metavar="DIR", show_default=False,
                                               help="New or empty directory for the backup.")] = None,
    to: Annotated[str | None, typer.Option(
        "--to", metavar="URL", show_default=False,
        help="Write the backup into object storage instead: s3://BUCKET/PREFIX or file:///DIR (new or empty).")] = None,
    admin_url: Annotated[str | None, typer.Option(
        "--admin-url", metavar="URL", show_default=False,
        help="Back up the running broker at this admin URL (online).")] = None,
    data_dir: Annotated[str | None, typer.Option(
        "--data-dir", metavar="PATH", show_default=False,
        help="Back up this data dir of a stopped broker (offline).")] = None,
    endpoint: Endpoint = None,
    region: Region = None,
    tls_ca_file: TlsCaFile = None,
) -> None:
    """Back up a data dir: online through a running broker (--admin-url), or offline (--data-dir).

    The backup holds the metadata database, the sealed ledgers, the open ledgers up to their confirmed entry and a
    manifest of SHA-256 checksums: every message acknowledged before the backup began. It goes into a directory
    (--output) or object storage (--to).
    """
    if (admin_url is None) == (data_dir is None):
        _fail("give either --admin-url (a running broker) or --data-dir (a stopped one)", EXIT_USAGE)
    if (output is None) == (to is None):
        _fail("give either --output (a directory) or --to (s3://BUCKET/PREFIX or file:///DIR)", EXIT_USAGE)
    bucket = None if to is None else _bucket(to, endpoint, region, tls_ca_file)
    target = to if output is None else output
    try:
        if bucket is not None:
            result = _to_bucket(bucket, admin_url, data_dir)
        elif admin_url is not None:
            assert output is not None
            result = _online(admin_url, os.path.abspath(output))
        else:
            assert data_dir is not None and output is not None
            with opened_offline(data_dir) as opened:
                take_backup(opened, output)
            result = _summary("path", os.path.abspath(output), verify_backup(output))
    except DataDirLockedError as error:
        _fail(f"{error}; back a running broker up with --admin-url", EXIT_FAILURE)
    except CompactionServiceError as error:
        _fail(str(error), EXIT_FAILURE)
    except OSError as error:
        _fail(f"backup into {target} failed: {error}", EXIT_FAILURE)
    typer.echo(json.dumps(result))


def _bucket(url: str, endpoint: str | None, region: str | None, tls_ca_file: str | None) -> BucketConfig:
    try:
        return BucketConfig.from_url(url, endpoint=endpoint or None, region=region or None,
                                     tls_ca_file=tls_ca_file or None)
    except BucketConfigError as error:
        _fail(str(error), EXIT_USAGE)


def _to_bucket(bucket: BucketConfig, admin_url: str | None, data_dir: str | None) -> dict[str, object]:
    """Stream the backup (the running broker's, or a stopped data dir's staged one) into
    ``bucket``; its summary."""
    if admin_url is not None:
        with _backup_stream(admin_url) as chunks:
            manifest = upload_backup(chunks, bucket)
    else:
        assert data_dir is not None
        with opened_offline(data_dir) as opened:
            staged = stage_backup(opened)
            try:
                manifest = upload_backup(tar_chunks(staged), bucket)
            finally:
                remove_staged(staged)
    return _summary("url", bucket.to_url(), manifest)


@contextlib.contextmanager
def _backup_stream(admin_url: str) -> Iterator[Iterator[bytes]]:
    """The running broker's backup as a tar stream (``POST /admin/v2/compactd/backup``)."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    url = admin_url.rstrip("/") + BACKUP_PATH
    try:
        with httpx.stream("POST", url, timeout=BACKUP_TIMEOUT_S) as response:
            if response.status_code != 200:
                response.read()
                raise BackupError(f"{_reason(response)} (HTTP {response.status_code})")
            yield response.iter_bytes()
    except httpx.HTTPError as error:
        raise BackupError(f"the backup from the admin API at {admin_url} failed: {error}") from None


def _online(admin_url: str, output: str) -> dict[str, object]:
    """Stream the running broker's backup into ``output`` and verify it; its summary."""
    with _backup_stream(admin_url) as chunks:
        manifest = extract_backup(chunks, output)
    return _summary("path", output, manifest)


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json().get("reason", response.text))
    except (ValueError, AttributeError):
        return response.text


def _summary(key: str, location: str, manifest: dict[str, Any]) -> dict[str, object]:
    return {key: location, "files": len(manifest["files"]),
            "sizeBytes": sum(entry["size"] for entry in manifest["files"]),
            "openLedgers": manifest["open_ledgers"], "createdAtMs": manifest["created_at_ms"]}


def restore_command(
    data_dir: Annotated[str, typer.Option("--data-dir", metavar="NEW",
                                          help="The new data dir to write (absent or empty).")],
    backup: Annotated[str | None, typer.Argument(
        metavar="[DIR]", show_default=False, help="A backup directory (compactd backup --output).")] = None,
    source: Annotated[str | None, typer.Option(
        "--from", metavar="URL", show_default=False,
        help="Restore from object storage instead: s3://BUCKET/PREFIX or file:///DIR (compactd backup --to).")] = None,
    endpoint: Endpoint = None,
    region: Region = None,
    tls_ca_file: TlsCaFile = None,
) -> None:
    """Restore a backup into a new data dir, after checking every file against its manifest."""
    if (backup is None) == (source is None):
        _fail("give either a backup directory DIR or --from (s3://BUCKET/PREFIX or file:///DIR)", EXIT_USAGE)
    try:
        if source is not None:
            manifest = restore_from_bucket(_bucket(source, endpoint, region, tls_ca_file), data_dir)
        else:
            assert backup is not None
            manifest = restore_backup(backup, data_dir)
    except CompactionServiceError as error:
        _fail(str(error), EXIT_FAILURE)
    except OSError as error:
        _fail(f"restore into {data_dir} failed: {error}", EXIT_FAILURE)
    typer.echo(json.dumps({"dataDir": os.path.abspath(data_dir), "files": len(manifest["files"]),
                           "createdAtMs": manifest["created_at_ms"]}))


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"compactd: {message}", err=True)
    raise typer.Exit(code)
