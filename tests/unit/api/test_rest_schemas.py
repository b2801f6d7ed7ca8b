"""The schema REST paths and the schema compatibility strategy policies, on a real broker core.

Upload, get (latest and by version), delete; an upload is checked as a producer's schema
(409 when refused, 400 for a definition that is not an Avro schema); a partition's path
reads its base topic's entry; the strategy is set per namespace and per topic, by Pulsar's
names only, and decides what an upload may register.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastavro")  # a dependency of compactd: AVRO and JSON schema checks

from api.broker.service import BrokerService
from tests.unit.api.test_rest import assert_reason, run

SCHEMA_URL = "/admin/v2/schemas/public/default/orders/schema"
RECORD = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": ["null", "string"]}]}
EVOLVED = {**RECORD, "fields": [*RECORD["fields"], {"name": "qty", "type": ["null", "int"]}]}
EVOLVED_WITH_DEFAULT = {**RECORD, "fields": [*RECORD["fields"],
                                              {"name": "qty", "type": ["null", "int"], "default": None}]}


def upload(definition: object, kind: str = "JSON") -> dict[str, object]:
    return {"type": kind, "schema": json.dumps(definition, indent=1), "properties": {"k": "v"}}


def test_an_uploaded_schema_is_read_back_by_version_and_an_equal_one_reuses_it(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert_reason(await client.get(SCHEMA_URL), 404, "orders")
        assert (await client.post(SCHEMA_URL, json=upload(RECORD))).json() == {"version": 0}
        compact = {"type": "JSON", "schema": json.dumps(RECORD), "properties": {}}  # whitespace aside
        assert (await client.post(SCHEMA_URL, json=compact)).json() == {"version": 0}
        latest = (await client.get(SCHEMA_URL)).json()
        assert (latest["version"], latest["type"], json.loads(latest["data"]), latest["properties"]) == \
            (0, "JSON", RECORD, {"k": "v"})
        assert (await client.get(SCHEMA_URL + "/0")).json() == latest
        assert_reason(await client.get(SCHEMA_URL + "/1"), 404, "version 1")
        partition = (await client.get("/admin/v2/schemas/public/default/orders-partition-3/schema")).json()
        assert partition == latest

    run(tmp_path, body)


def test_an_incompatible_upload_answers_409_and_the_strategy_decides(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.post(SCHEMA_URL, json=upload(RECORD))
        assert_reason(await client.post(SCHEMA_URL, json=upload(EVOLVED)), 409, "compatib")
        assert_reason(await client.post(SCHEMA_URL, json=upload(RECORD, "STRING")), 409, "STRING", "JSON")
        assert (await client.post(SCHEMA_URL, json=upload(EVOLVED_WITH_DEFAULT))).json() == {"version": 1}
        strategy = "/admin/v2/persistent/public/default/orders/schemaCompatibilityStrategy"
        assert (await client.get(strategy)).status_code == 204
        assert (await client.put(strategy, json="ALWAYS_INCOMPATIBLE")).status_code == 204
        assert (await client.get(strategy)).json() == "ALWAYS_INCOMPATIBLE"
        assert_reason(await client.post(SCHEMA_URL, json=upload({**RECORD, "doc": "x"})), 409, "ALWAYS_INCOMPATIBLE")
        assert (await client.delete(strategy)).status_code == 204
        namespace = "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy"
        assert (await client.post(namespace, json="ALWAYS_COMPATIBLE")).status_code == 204
        assert (await client.get(namespace)).json() == "ALWAYS_COMPATIBLE"
        assert (await client.post(SCHEMA_URL, json=upload(RECORD, "STRING"))).json() == {"version": 2}
        assert broker.schemas.strategy_of(broker.topic_name("orders-partition-1")) == "ALWAYS_COMPATIBLE"

    run(tmp_path, body)


def test_bad_strategies_and_definitions_are_refused_naming_the_value(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        namespace = "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy"
        assert_reason(await client.put(namespace, json="SIDEWAYS"), 400, "SIDEWAYS")
        assert_reason(await client.put(namespace, json=3), 400, "3")
        assert_reason(await client.post(SCHEMA_URL, json={"type": "AVRO", "schema": "{not json"}), 400, "not JSON")
        bad = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "nosuchtype"}]}
        assert_reason(await client.post(SCHEMA_URL, json=upload(bad, "AVRO")), 400, "Avro")
        assert_reason(await client.post(SCHEMA_URL, json={"type": "SOMETHING", "schema": ""}), 400, "SOMETHING")
        assert_reason(await client.get("/admin/v2/schemas/public/default/bad%0A/schema"), 412)
        assert (await client.get(namespace)).status_code == 204

    run(tmp_path, body)


def test_a_deleted_schema_is_gone_and_the_next_one_starts_after_it(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert_reason(await client.delete(SCHEMA_URL), 404, "orders")
        await client.post(SCHEMA_URL, json=upload(RECORD))
        assert (await client.delete(SCHEMA_URL)).json() == {"version": 0}
        assert_reason(await client.get(SCHEMA_URL), 404)
        assert_reason(await client.get(SCHEMA_URL + "/0"), 404)
        assert (await client.post(SCHEMA_URL, json=upload(RECORD, "STRING"))).json() == {"version": 1}

    run(tmp_path, body)


def test_deleting_a_topic_deletes_its_schema_and_strategy(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        topic = "/admin/v2/persistent/public/default/orders"
        assert (await client.put(topic)).status_code == 204
        await client.post(SCHEMA_URL, json=upload(RECORD))
        assert (await client.put(topic + "/schemaCompatibilityStrategy", json="BACKWARD")).status_code == 204
        assert (await client.delete(topic)).status_code == 204
        assert_reason(await client.get(SCHEMA_URL), 404)
        assert (await client.get(topic + "/schemaCompatibilityStrategy")).status_code == 204
        assert (await client.post(SCHEMA_URL, json=upload(RECORD, "STRING"))).json() == {"version": 0}

    run(tmp_path, body)
