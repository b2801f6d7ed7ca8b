"""Backups of the running broker's data dir (compactd's own path; Pulsar has none).

``POST /admin/v2/compactd/backup`` with ``{"output": "/path"}`` writes a backup
(``ledger.backup.take_backup``) into a directory on the broker's host, while producers
and consumers go on. It runs in a worker thread; one backup at a time (409 otherwise).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from api.routers.common import AdminDependency, errors
from ledger.backup import BackupError, take_backup

__all__ = ["BACKUP_PATH", "router"]

BACKUP_PATH = "/admin/v2/compactd/backup"

router = APIRouter(tags=["backup"])
_running = asyncio.Lock()


class BackupRequest(BaseModel):
    """Where the backup goes: a new or empty directory on the broker's host."""

    model_config = ConfigDict(extra="forbid")
    output: str = Field(min_length=1, description="Absolute path of a new or empty directory.")


@router.post(
    BACKUP_PATH, summary="Back up the data dir",
    responses={200: {"description": "The backup is complete: its path, files, bytes and the "
                                    "confirmed position of each open ledger."},
               **errors(409, 412, c409="Another backup is running.",
                        c412="The output directory is not usable (exists and not empty, inside the data dir).")},
)
async def backup(request: Request, _admin: AdminDependency, body: BackupRequest) -> dict[str, Any]:
    """Take a consistent backup of the data dir without stopping producers: the metadata
    database (SQLite's online backup), sealed ledgers (hard links), open ledgers up to
    their confirmed entry, and a manifest of checksums."""
    if _running.locked():
        raise HTTPException(409, "Another backup is running")
    async with _running:
        try:
            summary = await asyncio.to_thread(take_backup, request.app.state.broker.data_dir, body.output)
        except BackupError as error:
            raise HTTPException(412, str(error)) from None
        except OSError as error:
            raise HTTPException(412, f"backup into {body.output} failed: {error}") from None
    return summary.as_json()
