"""``POST /admin/v2/compactd/backup`` in process: the answer is a tar of a verified backup,
the staged copy is removed, one backup runs at a time, and a failure is a reason."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from api.broker.service import BrokerService
from api.config import Settings
from api.http import create_app
from api.routers import backup as backup_router
from ledger import DataDir
from ledger.backup import extract_backup

BACKUP_URL = "/admin/v2/compactd/backup"
Body = Callable[[BrokerService, httpx.AsyncClient], Awaitable[None]]


def run(tmp_path: Path, body: Body) -> None:
    async def main() -> None:
        data_dir = DataDir.open(str(tmp_path / "data"))
        settings = Settings(compaction_monitor_interval_seconds=0)
        broker = BrokerService(data_dir, settings)
        broker.loop = asyncio.get_running_loop()
        transport = httpx.ASGITransport(app=create_app(settings, broker=broker))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://compactd", timeout=30) as client:
                await body(broker, client)
        finally:
            await broker.stop()
            data_dir.close()

    asyncio.run(main())


def test_a_backup_answers_a_tar_that_extracts_to_a_verified_backup(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        ledger = broker.get_topic("persistent://public/default/b").ledger
        for number in range(5):
            ledger.append(b"entry %d" % number).result(timeout=10)
        response = await client.post(BACKUP_URL)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/x-tar"
        manifest = extract_backup([response.content], str(tmp_path / "backup"))
        assert {entry["path"] for entry in manifest["files"]} >= {"metadata.db"}
        assert list(manifest["open_ledgers"].values()) == [5]
        assert not (tmp_path / "data" / "backup-staging").exists()  # no trace of the staging (issue 25)

    run(tmp_path, body)


def test_a_second_backup_while_one_runs_answers_409(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert backup_router._running.acquire(blocking=False)
        try:
            response = await client.post(BACKUP_URL)
        finally:
            backup_router._running.release()
        assert response.status_code == 409
        assert response.json() == {"reason": "Another backup is running"}

    run(tmp_path, body)


def test_a_backup_that_cannot_be_staged_answers_503_with_the_reason(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        (tmp_path / "data" / "backup-staging").write_text("a file where the staging directory goes")
        response = await client.post(BACKUP_URL)
        assert response.status_code == 503
        assert response.json()["reason"].startswith("the backup failed: ")
        assert not backup_router._running.locked()

    run(tmp_path, body)
