"""Partitioned topics, tenants, namespaces and the HTTP lookup over the admin REST API.

Each test runs against a real ``BrokerService`` on a tmp data dir and the real application
(``tests/unit/api/test_rest.py``'s ``run``); every refusal is checked for its status and a
reason naming the bad value.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from api.broker.dedup import ProducerSession
from api.broker.service import BrokerService
from tests.unit.api.test_rest import assert_reason, entry, run

PARENT = "persistent://public/default/orders"
PARENT_URL = "/admin/v2/persistent/public/default/orders"


def test_create_get_grow_list_and_delete_a_partitioned_topic(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.put(f"{PARENT_URL}/partitions", json=4)).status_code == 204
        assert (await client.get(f"{PARENT_URL}/partitions")).json() == {"partitions": 4}
        assert broker.partitioned.partitions(broker.topic_name(PARENT)) == 4
        topics = (await client.get("/admin/v2/persistent/public/default")).json()
        assert topics == [f"{PARENT}-partition-{i}" for i in range(4)]
        assert (await client.get("/admin/v2/persistent/public/default/partitioned")).json() == [PARENT]

        assert (await client.post(f"{PARENT_URL}/partitions", json=6)).status_code == 204
        assert (await client.get(f"{PARENT_URL}/partitions")).json() == {"partitions": 6}
        assert f"{PARENT}-partition-5" in (await client.get("/admin/v2/persistent/public/default")).json()

        assert (await client.delete(f"{PARENT_URL}/partitions")).status_code == 204
        assert (await client.get(f"{PARENT_URL}/partitions")).json() == {"partitions": 0}
        assert (await client.get("/admin/v2/persistent/public/default")).json() == []
        assert (await client.get("/admin/v2/persistent/public/default/partitioned")).json() == []

    run(tmp_path, body)


@pytest.mark.parametrize(("url", "count", "status", "names"), [
    (f"{PARENT_URL}/partitions", 0, 406, ("0",)),
    (f"{PARENT_URL}/partitions", -3, 406, ("-3",)),
    (f"{PARENT_URL}/partitions", 100_000, 406, ("100000", "1024")),
    ("/admin/v2/persistent/public/default/x-partition-1/partitions", 2, 412, ("-partition-",)),
    ("/admin/v2/persistent/missing/ns/t/partitions", 2, 404, ("missing/ns",)),
])
def test_bad_creates_are_refused_with_a_reason(tmp_path: Path, url: str, count: int, status: int,
                                               names: tuple[str, ...]) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert_reason(await client.put(url, json=count), status, *names)
        assert broker.partitioned.in_namespace("public/default") == []

    run(tmp_path, body)


def test_a_body_that_is_not_an_integer_is_a_400(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        for bad in ('"4"', "4.5", "true", "[4]"):
            response = await client.put(f"{PARENT_URL}/partitions", content=bad,
                                        headers={"Content-Type": "application/json"})
            assert_reason(response, 400)

    run(tmp_path, body)


def test_existing_topics_conflict_and_counts_only_grow(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.put(f"{PARENT_URL}/partitions", json=3)).status_code == 204
        assert_reason(await client.put(f"{PARENT_URL}/partitions", json=3), 409, PARENT)
        assert_reason(await client.put(PARENT_URL), 409, PARENT)  # no non-partitioned twin
        assert (await client.put("/admin/v2/persistent/public/default/plain")).status_code == 204
        assert_reason(await client.put("/admin/v2/persistent/public/default/plain/partitions", json=2),
                      409, "non-partitioned")
        assert_reason(await client.post(f"{PARENT_URL}/partitions", json=2), 409, "3", "2")
        assert_reason(await client.post(f"{PARENT_URL}/partitions", json=3), 409, "3")
        assert_reason(await client.post("/admin/v2/persistent/public/default/nope/partitions", json=3), 404, "nope")
        assert_reason(await client.delete("/admin/v2/persistent/public/default/nope/partitions"), 404, "nope")
        assert broker.partitioned.partitions(broker.topic_name(PARENT)) == 3

    run(tmp_path, body)


def test_compaction_of_the_parent_runs_every_partition_and_reports_one_status(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.put(f"{PARENT_URL}/partitions", json=3)).status_code == 204
        assert (await client.get(f"{PARENT_URL}/compaction")).json()["status"] == "NOT_RUN"
        for i in range(3):  # through the topic: msgInCounter counts published messages
            partition, session = broker.get_topic(f"{PARENT}-partition-{i}"), ProducerSession()
            for sequence_id, value in enumerate((b"1", b"2")):
                await asyncio.wrap_future(partition.publish(session, "p", sequence_id, sequence_id, entry("k", value)))

        assert (await client.put(f"{PARENT_URL}/compaction")).status_code == 204
        await broker.admin.wait_for_runs()

        for i in range(3):
            status = (await client.get(f"{PARENT_URL}-partition-{i}/compaction")).json()
            assert status == {"status": "SUCCESS", "lastError": ""}
        assert (await client.get(f"{PARENT_URL}/compaction")).json() == {"status": "SUCCESS", "lastError": ""}
        stats = (await client.get(f"{PARENT_URL}/partitioned-stats")).json()
        assert stats["metadata"] == {"partitions": 3}
        assert stats["msgInCounter"] == 6
        assert set(stats["partitions"]) == {f"{PARENT}-partition-{i}" for i in range(3)}
        assert "partitions" not in (await client.get(f"{PARENT_URL}/partitioned-stats?perPartition=false")).json()

    run(tmp_path, body, compaction_max_concurrent_runs=1)


def test_a_policy_set_on_the_parent_applies_to_its_partitions_and_goes_with_it(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.put(f"{PARENT_URL}/partitions", json=2)).status_code == 204
        assert (await client.post(f"{PARENT_URL}/compactionThreshold", json=1234)).status_code == 204
        partition = broker.get_topic(f"{PARENT}-partition-1")
        assert broker.policies.get_policy(str(partition.name), "compactionThreshold") == 1234
        assert (await client.post(f"{PARENT_URL}/deleteRetentionMs", json=77)).status_code == 204
        assert broker.delete_retention_ms(partition) == 77

        assert (await client.delete(f"{PARENT_URL}/partitions")).status_code == 204
        assert broker.policies.get_policy(PARENT, "compactionThreshold") is None

    run(tmp_path, body)


def test_tenants_and_namespaces_as_pulsar_has_them(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.get("/admin/v2/clusters")).json() == ["standalone"]
        assert (await client.get("/admin/v2/tenants")).json() == ["public"]
        assert (await client.get("/admin/v2/namespaces/public")).json() == ["public/default"]

        assert (await client.put("/admin/v2/tenants/acme", json={"adminRoles": ["ops"]})).status_code == 204
        assert (await client.get("/admin/v2/tenants/acme")).json() == {
            "adminRoles": ["ops"], "allowedClusters": ["standalone"]}
        assert_reason(await client.put("/admin/v2/tenants/acme"), 409, "acme")
        assert_reason(await client.put("/admin/v2/namespaces/ghost/ns"), 404, "ghost")
        assert (await client.put("/admin/v2/namespaces/acme/orders")).status_code == 204
        assert_reason(await client.put("/admin/v2/namespaces/acme/orders"), 409, "acme/orders")
        assert (await client.get("/admin/v2/namespaces/acme")).json() == ["acme/orders"]

        assert (await client.put("/admin/v2/persistent/acme/orders/o/partitions", json=2)).status_code == 204
        assert_reason(await client.delete("/admin/v2/tenants/acme"), 409, "acme/orders")
        assert_reason(await client.delete("/admin/v2/namespaces/acme/orders"), 409, "acme/orders")
        assert (await client.delete("/admin/v2/persistent/acme/orders/o/partitions")).status_code == 204
        assert (await client.post("/admin/v2/namespaces/acme/orders/compactionThreshold", json=5)).status_code == 204
        assert (await client.delete("/admin/v2/namespaces/acme/orders")).status_code == 204
        assert broker.policies.get_policy("acme/orders", "compactionThreshold") is None
        assert_reason(await client.delete("/admin/v2/namespaces/acme/orders"), 404, "acme/orders")
        assert (await client.delete("/admin/v2/tenants/acme")).status_code == 204
        assert_reason(await client.get("/admin/v2/namespaces/acme"), 404, "acme")
        assert_reason(await client.put("/admin/v2/tenants/bad%20name"), 412, "bad name")

    run(tmp_path, body)


def test_a_topic_is_created_only_in_an_existing_namespace(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert_reason(await client.put("/admin/v2/persistent/acme/orders/t"), 404, "acme/orders")
        assert_reason(await client.get("/admin/v2/persistent/acme/orders/t/partitions"), 404, "acme/orders")
        assert (await client.put("/admin/v2/tenants/acme")).status_code == 204
        assert (await client.put("/admin/v2/namespaces/acme/orders")).status_code == 204
        assert (await client.put("/admin/v2/persistent/acme/orders/t")).status_code == 204
        assert (await client.get("/admin/v2/persistent/acme/orders")).json() == ["persistent://acme/orders/t"]

    run(tmp_path, body)


def test_the_http_lookup_answers_this_brokers_pulsar_url(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        found = (await client.get("/lookup/v2/topic/persistent/public/default/t")).json()
        # The address the request reached (httpx's ASGI transport: the URL's host), the Pulsar port.
        assert found["brokerUrl"] == f"pulsar://compactd:{broker.settings.broker_port}"
        assert found["httpUrl"] == "http://compactd"
        assert_reason(await client.get("/lookup/v2/topic/persistent/acme/orders/t"), 404, "acme/orders")
        assert_reason(await client.get("/lookup/v2/topic/non-persistent/public/default/t"), 405, "non-persistent")

    run(tmp_path, body)
