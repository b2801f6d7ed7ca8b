"""A full metadata database behind the admin REST API: 503 with the reason, never a 500,
and the same requests work once there is room again.

SQLite's own ``PRAGMA max_page_count`` makes the real database answer SQLITE_FULL, the
error a full disk gives.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from api.broker.service import BrokerService
from tests.unit.api.test_rest import TOPIC_URL, assert_reason, publish, run, wait_for_status

TOPIC = "persistent://public/default/rest"


def _fill(broker: BrokerService) -> None:
    """No page may be added to the metadata database from now on."""
    metadata = broker.data_dir.metadata
    pages = int(metadata._query("PRAGMA page_count")[0][0])
    metadata._query(f"PRAGMA max_page_count = {pages}")


def test_a_full_database_answers_503_and_the_same_requests_work_once_room_frees(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        publish(broker, TOPIC, ("a", b"1"), ("a", b"2"))
        _fill(broker)
        answers = []
        for i in range(5000):  # each topic adds rows until a page is needed and refused
            answers.append(await client.put(f"/admin/v2/persistent/public/default/full-{i}"))
            if answers[-1].status_code != 204:
                break
        assert_reason(answers[-1], 503, "full")
        trigger = await client.put(f"{TOPIC_URL}/compaction")
        assert trigger.status_code in (204, 503), trigger.text  # never a 500
        broker.data_dir.metadata._query("PRAGMA max_page_count = 1000000")  # room again
        assert (await client.put(f"/admin/v2/persistent/public/default/full-{len(answers)}")).status_code == 204
        if trigger.status_code == 503:
            assert (await client.put(f"{TOPIC_URL}/compaction")).status_code == 204
        await wait_for_status(client, f"{TOPIC_URL}/compaction", "SUCCESS")

    run(tmp_path, body)
