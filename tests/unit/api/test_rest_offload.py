"""``PUT``/``GET …/offload`` over a real ``BrokerService`` and the real application (as
``tests.unit.api.test_rest``): Pulsar's answers and shapes, bad bodies named, 405 without a
driver, 409 while an admin offload of the topic runs, and the status of a finished one."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.broker.service import BrokerService
from tests.unit.api.test_rest import TOPIC, TOPIC_URL, assert_reason, publish, run, wait_for_status

OFFLOAD_URL = TOPIC_URL + "/offload"
EARLIEST = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}


def offload_settings(tmp_path: Path) -> dict[str, Any]:
    return {"managed_ledger_offload_driver": "filesystem", "file_system_uri": f"file://{tmp_path}/bucket",
            "managed_ledger_max_entries_per_ledger": 2}


def test_without_a_driver_a_trigger_is_405_and_the_status_not_run(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        response = await client.put(OFFLOAD_URL, json={"ledgerId": 1, "entryId": 0})
        assert_reason(response, 405, "--managed-ledger-offload-driver")
        status = (await client.get(OFFLOAD_URL)).json()
        assert status == {"status": "NOT_RUN", "lastError": "", "firstUnoffloadedMessage": EARLIEST}

    run(tmp_path, body)


@pytest.mark.parametrize(("raw", "status", "named"), [
    ('{"ledgerId": "x", "entryId": 0}', 400, "ledgerId"),
    ('{"ledgerId": 1.5, "entryId": 0}', 400, "1.5"),
    ('{"ledgerId": 3}', 400, "entryId"),
    ('{"ledgerId": -7, "entryId": 0}', 412, "-7"),
    ('{"ledgerId": 1, "entryId": 9223372036854775808}', 412, "9223372036854775808"),
    ("[1, 0]", 400, "[1, 0]"),
    ("not json", 400, "JSON"),
])
def test_a_bad_message_id_answers_4xx_naming_it(tmp_path: Path, raw: str, status: int, named: str) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        response = await client.put(OFFLOAD_URL, content=raw, headers={"content-type": "application/json"})
        assert_reason(response, status, named)
        assert (await client.get(OFFLOAD_URL)).json()["status"] == "NOT_RUN"  # nothing started

    run(tmp_path, body, **offload_settings(tmp_path))


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_a_missing_topic_is_404(tmp_path: Path, method: str) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        response = await client.request(method, OFFLOAD_URL, json={"ledgerId": 1, "entryId": 0})
        assert_reason(response, 404, TOPIC)

    run(tmp_path, body, **offload_settings(tmp_path))


def test_an_offload_reports_success_and_the_first_ledger_kept(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        publish(broker, TOPIC, *[(f"k{index}", b"v") for index in range(7)])  # ledgers of 2, 2, 2, 1
        ledgers = (await client.get(TOPIC_URL + "/internalStats")).json()["ledgers"]
        keep = ledgers[2]["ledgerId"]
        assert (await client.put(OFFLOAD_URL, json={"ledgerId": keep, "entryId": 1})).status_code == 204
        status = await wait_for_status(client, OFFLOAD_URL, "SUCCESS")
        assert status == {"status": "SUCCESS", "lastError": "",
                          "firstUnoffloadedMessage": {"ledgerId": keep, "entryId": 0, "partitionIndex": -1}}
        flags = [(ledger["ledgerId"], ledger["offloaded"])
                 for ledger in (await client.get(TOPIC_URL + "/internalStats")).json()["ledgers"]]
        assert flags == [(ledger["ledgerId"], ledger["ledgerId"] < keep) for ledger in ledgers]
        stats = (await client.get(TOPIC_URL + "/stats")).json()
        assert stats["offloadedStorageSize"] == ledgers[0]["size"] + ledgers[1]["size"]

    run(tmp_path, body, **offload_settings(tmp_path))


def test_an_invalid_position_is_accepted_then_reads_error(tmp_path: Path) -> None:
    """Pulsar finds the position invalid asynchronously: 204, then ERROR naming it."""
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        publish(broker, TOPIC, ("k", b"v"), ("k", b"w"), ("k", b"x"))
        assert (await client.put(OFFLOAD_URL, json={"ledgerId": 999_999, "entryId": 5})).status_code == 204
        status = await wait_for_status(client, OFFLOAD_URL, "ERROR")
        assert "999999:5" in status["lastError"] and status["firstUnoffloadedMessage"] == EARLIEST

    run(tmp_path, body, **offload_settings(tmp_path))


def test_a_second_trigger_while_one_runs_is_409(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload is held (a bucket that does not answer yet) so that the first job is still running."""
    release = threading.Event()

    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        files = broker.data_dir.ledgers.file_powers()
        assert files is not None
        upload = files.upload_sealed

        def held_upload(ledger_id: int) -> Any:
            release.wait(10)
            return upload(ledger_id)

        monkeypatch.setattr(files, "upload_sealed", held_upload)
        await client.put(TOPIC_URL)
        publish(broker, TOPIC, *[(f"k{index}", b"v") for index in range(5)])
        last = (await client.get(TOPIC_URL + "/internalStats")).json()["ledgers"][-1]["ledgerId"]
        message_id = {"ledgerId": last, "entryId": 0}
        try:
            assert (await client.put(OFFLOAD_URL, json=message_id)).status_code == 204
            assert (await client.get(OFFLOAD_URL)).json()["status"] == "RUNNING"
            assert_reason(await client.put(OFFLOAD_URL, json=message_id), 409, "already running")
        finally:
            release.set()
        await wait_for_status(client, OFFLOAD_URL, "SUCCESS")
        assert (await client.put(OFFLOAD_URL, json=message_id)).status_code == 204  # over: accepted again
        await asyncio.sleep(0)

    run(tmp_path, body, **offload_settings(tmp_path))


def test_a_partitioned_parent_is_405_naming_its_partitions(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.put(TOPIC_URL + "/partitions", json=2)).status_code == 204
        assert_reason(await client.put(OFFLOAD_URL, json={"ledgerId": 1, "entryId": 0}), 405, "partition")
        assert_reason(await client.get(OFFLOAD_URL), 405, "partition")

    run(tmp_path, body, **offload_settings(tmp_path))
