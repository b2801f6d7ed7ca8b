"""Backups of the running broker's data dir (compactd's own path; Pulsar has none).

``POST /admin/v2/compactd/backup`` takes a backup (``ledger.backup.stage_backup``, in a
worker thread; producers and consumers go on) and answers it as a tar stream
(``application/x-tar``) that ``compactd backup --admin-url URL --output DIR`` writes into
``DIR`` and verifies. The staged copy is removed once streamed. One backup at a time: a
second answers 409.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse

from api.routers.common import AdminDependency, errors
from ledger.backup import BackupError, remove_staged, stage_backup, tar_chunks

__all__ = ["BACKUP_PATH", "router"]

BACKUP_PATH = "/admin/v2/compactd/backup"
TAR = "application/x-tar"

router = APIRouter(tags=["backup"])
_running = threading.Lock()  # held from the staging until the stream ends


@router.post(
    BACKUP_PATH, response_class=StreamingResponse, summary="Back up the data dir",
    responses={200: {"description": "The backup as a tar stream: `manifest.json`, `metadata.db`, `ledgers/`.",
                     "content": {TAR: {"schema": {"type": "string", "format": "binary"}}}},
               **errors(409, 503, c409="Another backup is running.")},
)
async def backup(request: Request, _admin: AdminDependency) -> StreamingResponse:
    """Take a consistent backup of the data dir without stopping producers: the metadata
    database (SQLite's online backup), sealed ledgers, open ledgers up to their confirmed
    entry, and a manifest of SHA-256 checksums; answered as a tar stream."""
    if not _running.acquire(blocking=False):
        raise HTTPException(409, "Another backup is running")
    try:
        staged = await asyncio.to_thread(stage_backup, request.app.state.broker.data_dir)
    except (BackupError, OSError) as error:
        _running.release()
        raise HTTPException(503, f"the backup failed: {error}") from None
    except BaseException:
        _running.release()
        raise
    return StreamingResponse(_streamed(staged), media_type=TAR,
                             headers={"Content-Disposition": 'attachment; filename="compactd-backup.tar"'})


def _streamed(staged: str) -> Iterator[bytes]:
    try:
        yield from tar_chunks(staged)
    finally:
        remove_staged(staged)
        _running.release()
