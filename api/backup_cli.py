"""``compactd backup`` and ``compactd restore``: backups of a data dir, and their restore.

``compactd backup --admin-url URL --output DIR`` asks the running broker for a backup
(``POST /admin/v2/compactd/backup``, a tar stream; producers are not stopped), writes it
into ``DIR`` on this host and verifies every file against the manifest.
``compactd backup --data-dir PATH --output DIR`` backs up a stopped broker's data dir.
``compactd restore DIR --data-dir NEW`` checks every file of the backup against its
manifest, then writes a new data dir that ``compactd serve --data-dir NEW`` opens.

Each prints one line of JSON on stdout when done; a failure prints ``compactd: <reason>``
on stderr and exits 1 (exit 2: a usage error), never a traceback.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Annotated, Any, NoReturn

import httpx
import typer

from ledger.backup import (
    BackupError,
    extract_backup,
    opened_offline,
    restore_backup,
    take_backup,
    verify_backup,
)
from ledger.errors import CompactionServiceError, DataDirLockedError

__all__ = ["backup_command", "restore_command"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
BACKUP_PATH = "/admin/v2/compactd/backup"
# A backup reads every byte once to checksum it: allow far more than an admin request.
BACKUP_TIMEOUT_S = 3600.0


def backup_command(
    output: Annotated[str, typer.Option("--output", "-o", metavar="DIR",
                                        help="New or empty directory for the backup.")],
    admin_url: Annotated[str | None, typer.Option(
        "--admin-url", metavar="URL", show_default=False,
        help="Back up the running broker at this admin URL (online).")] = None,
    data_dir: Annotated[str | None, typer.Option(
        "--data-dir", metavar="PATH", show_default=False,
        help="Back up this data dir of a stopped broker (offline).")] = None,
) -> None:
    """Back up a data dir: online through a running broker (--admin-url), or offline (--data-dir).

    The backup holds the metadata database, the sealed ledgers, the open ledgers up to their confirmed entry and a
    manifest of SHA-256 checksums: every message acknowledged before the backup began.
    """
    if (admin_url is None) == (data_dir is None):
        _fail("give either --admin-url (a running broker) or --data-dir (a stopped one)", EXIT_USAGE)
    try:
        if admin_url is not None:
            result = _online(admin_url, os.path.abspath(output))
        else:
            assert data_dir is not None
            with opened_offline(data_dir) as opened:
                take_backup(opened, output)
            result = _summary(output, verify_backup(output))
    except DataDirLockedError as error:
        _fail(f"{error}; back a running broker up with --admin-url", EXIT_FAILURE)
    except CompactionServiceError as error:
        _fail(str(error), EXIT_FAILURE)
    except OSError as error:
        _fail(f"backup into {output} failed: {error}", EXIT_FAILURE)
    typer.echo(json.dumps(result))


def _online(admin_url: str, output: str) -> dict[str, object]:
    """Stream the running broker's backup into ``output`` and verify it; its summary."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    url = admin_url.rstrip("/") + BACKUP_PATH
    try:
        with httpx.stream("POST", url, timeout=BACKUP_TIMEOUT_S) as response:
            if response.status_code != 200:
                response.read()
                raise BackupError(f"{_reason(response)} (HTTP {response.status_code})")
            manifest = extract_backup(response.iter_bytes(), output)
    except httpx.HTTPError as error:
        raise BackupError(f"the backup from the admin API at {admin_url} failed: {error}") from None
    return _summary(output, manifest)


def _reason(response: httpx.Response) -> str:
    try:
        return str(response.json().get("reason", response.text))
    except (ValueError, AttributeError):
        return response.text


def _summary(output: str, manifest: dict[str, Any]) -> dict[str, object]:
    return {"path": os.path.abspath(output), "files": len(manifest["files"]),
            "sizeBytes": sum(entry["size"] for entry in manifest["files"]),
            "openLedgers": manifest["open_ledgers"], "createdAtMs": manifest["created_at_ms"]}


def restore_command(
    backup: Annotated[str, typer.Argument(metavar="DIR", help="A backup directory (compactd backup --output).")],
    data_dir: Annotated[str, typer.Option("--data-dir", metavar="NEW",
                                          help="The new data dir to write (absent or empty).")],
) -> None:
    """Restore a backup into a new data dir, after checking every file against its manifest."""
    try:
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
