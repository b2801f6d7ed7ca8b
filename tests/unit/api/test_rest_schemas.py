"""The schema REST paths and the schema compatibility strategy policies, on a real broker core.

Upload, get (latest and by version), delete; an upload is checked as a producer's schema
(409 when refused, 400 for a definition that is not an Avro schema); a partition's path
reads its base topic's entry; the strategy is set per namespace and per topic, by Pulsar's
names only, and decides what an upload may register. Hostile definitions (deep, huge, not
text, lone surrogates, not JSON, wrong types, duplicated names, ...) answer 4xx with a
reason, never 500 (``hostile_definitions``, shared with the wire's test).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastavro")  # a dependency of compactd: AVRO and JSON schema checks

from api.broker.schemas import SchemaData
from api.broker.service import BrokerService
from tests.unit.api.test_rest import assert_reason, run

STRING = 1
JSON_BODY = {"content-type": "application/json"}
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


# -- hostile schemas: a 4xx naming the problem, never a 500 -----------------------------------

SIZE_MAX = 4096  # the limit these tests run under (--schema-max-size-bytes)
_PRIMITIVES = st.sampled_from(["null", "boolean", "int", "long", "float", "double", "bytes", "string"])
_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)


def _avro(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    field = st.fixed_dictionaries({"name": _NAMES, "type": children})
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("record"), "name": _NAMES, "fields": st.lists(field, max_size=4)}),
        st.fixed_dictionaries({"type": st.just("array"), "items": children}),
        st.fixed_dictionaries({"type": st.just("map"), "values": children}),
        st.fixed_dictionaries({"type": st.just("enum"), "name": _NAMES, "symbols": st.lists(_NAMES, max_size=3)}),
        st.lists(children, min_size=1, max_size=3),  # a union
    )


AVRO_SCHEMAS = st.recursive(_PRIMITIVES, _avro, max_leaves=12)
"""Avro schemas, most valid (some with duplicated names, a union of unions, ...)."""
_WRONG = st.one_of(st.integers(), st.none(), st.booleans(), st.lists(st.integers(), max_size=2), st.text(max_size=5))


def _nested(depth: int, opener: str) -> bytes:
    inner = {"[": ("[", "]"), "{": ('{"type":"array","items":', "}")}[opener]
    return (inner[0] * depth + ('"int"' if opener == "{" else "") + inner[1] * depth).encode()


@st.composite
def hostile_definitions(draw: st.DrawFn) -> bytes:
    """Definition bytes: valid Avro, or hostile in one of many ways."""
    schema = draw(AVRO_SCHEMAS)
    text = json.dumps(schema)
    how = draw(st.sampled_from(["valid", "deep", "huge", "binary", "surrogate", "truncated", "wrong-type",
                                "duplicate", "recursive", "unknown", "no-fields", "constant"]))
    if how == "deep":
        return _nested(draw(st.integers(90, 5000)), draw(st.sampled_from(["[", "{"])))
    if how == "huge":
        return json.dumps({"type": "record", "name": "R", "doc": "x" * draw(st.integers(SIZE_MAX - 40, 3 * SIZE_MAX)),
                           "fields": []}).encode()
    if how == "binary":
        return draw(st.binary(max_size=64))
    if how == "surrogate":
        lone = draw(st.integers(0xD800, 0xDFFF))
        return json.dumps({"type": "record", "name": "R", "doc": f"\\u{lone:04x}", "fields": []}).replace(
            "\\\\u", "\\u").encode()
    if how == "truncated":
        return text[:draw(st.integers(0, max(len(text) - 1, 0)))].encode()
    if how == "wrong-type":
        key = draw(st.sampled_from(["type", "name", "fields", "symbols", "items", "aliases", "namespace", "size"]))
        wrong = {"type": "record", "name": "R", "fields": [], key: draw(_WRONG)}
        return json.dumps(wrong).encode()
    if how == "duplicate":
        field = {"name": "a", "type": schema}
        return json.dumps({"type": "record", "name": "R", "fields": [field, field]}).encode()
    if how == "recursive":
        return json.dumps({"type": "record", "name": "Node", "fields": [
            {"name": "next", "type": ["null", "Node"]}, {"name": "v", "type": schema}]}).encode()
    if how == "unknown":
        return json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": draw(_NAMES)}]}).encode()
    if how == "no-fields":
        return b'{"type": "record", "name": "R"}'
    if how == "constant":
        return b'{"type": "record", "name": "R", "doc": NaN, "fields": []}'
    return text.encode()


def _upload_body(kind: str, data: bytes) -> bytes:
    """The JSON body of an upload of ``data``; bytes that are no text go in as Latin-1 text
    (a REST body can only carry text), lone surrogates as JSON escapes."""
    text = data.decode("utf-8", "surrogatepass") if _decodes(data) else data.decode("latin-1")
    return json.dumps({"type": kind, "schema": text}).encode()


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


def _assert_no_500(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert_reason(response, response.status_code)


def test_hostile_definitions_are_refused_with_a_reason_naming_the_problem(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        deep = "[" * 2000 + "]" * 2000  # under the size limit, far past Python's recursion limit
        assert_reason(await client.post(SCHEMA_URL, json={"type": "AVRO", "schema": deep}), 400, "2000 deep", "100")
        surrogate = b'{"type": "AVRO", "schema": "{\\"type\\": \\"record\\", \\"name\\": \\"R\\", \\"doc\\": \\"\\\\udcff\\", \\"fields\\": []}"}'
        assert_reason(await client.post(SCHEMA_URL, content=surrogate, headers=JSON_BODY), 400, "lone surrogate", "\\udcff")
        raw = b'{"type": "STRING", "schema": "\\udcff"}'  # the definition itself is no text
        assert_reason(await client.post(SCHEMA_URL, content=raw, headers=JSON_BODY), 400, "lone surrogate", "schema")
        props = b'{"type": "STRING", "schema": "s", "properties": {"k": "\\ud800"}}'
        assert_reason(await client.post(SCHEMA_URL, content=props, headers=JSON_BODY), 400, "lone surrogate", "properties")
        huge = {"type": "STRING", "schema": "x" * (SIZE_MAX + 1)}
        assert_reason(await client.post(SCHEMA_URL, json=huge), 400, str(SIZE_MAX + 1), str(SIZE_MAX))
        assert_reason(await client.post(SCHEMA_URL, json=upload({"type": "record", "name": "R"})), 400, "fields")
        duplicated = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}] * 2}
        assert_reason(await client.post(SCHEMA_URL, json=upload(duplicated)), 400, "duplicate field 'a'")
        assert (await client.post(SCHEMA_URL, json=upload({"type": "record", "name": "R", "fields": []}))).json() \
            == {"version": 0}  # no fields is a valid record, as in Avro and Pulsar
        escaped = {"type": "STRING", "schema": "\x01" * SIZE_MAX}  # 6 bytes each in the body: still taken
        assert (await client.post("/admin/v2/schemas/public/default/other/schema", json=escaped)).json() == \
            {"version": 0}

    run(tmp_path, body, schema_max_size_bytes=SIZE_MAX)


@pytest.mark.slow
def test_no_generated_schema_gets_a_500_and_the_broker_stays_healthy(tmp_path: Path) -> None:
    """Property: any definition, valid or hostile, answers 2xx or 4xx with a reason; after
    all of them the registry still registers and reads a valid schema."""
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        seen: list[tuple[str, bytes]] = []

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(kind=st.sampled_from(["AVRO", "JSON", "STRING"]), first=hostile_definitions(),
               second=hostile_definitions())
        def one(kind: str, first: bytes, second: bytes) -> None:
            seen.append((kind, first))
            seen.append((kind, second))

        one()  # draw the examples here; the requests are async, so they run below
        for number, (kind, data) in enumerate(seen):
            url = f"/admin/v2/schemas/public/default/t{number // 2}/schema"
            response = await client.post(url, content=_upload_body(kind, data), headers=JSON_BODY)
            _assert_no_500(response)
            _assert_no_500(await client.get(url))
        assert (await client.post(SCHEMA_URL, json=upload(RECORD))).json() == {"version": 0}
        assert json.loads((await client.get(SCHEMA_URL)).json()["data"]) == RECORD
        assert (await client.get("/admin/v2/brokers/health")).text == "ok"

    run(tmp_path, body, schema_max_size_bytes=SIZE_MAX)


def test_a_non_utf8_definition_registered_on_the_wire_reads_back_over_rest(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        for number, data in enumerate([b"\xff\xfe", b"\xed\xb3\xbf", b"ok\x00"]):
            name = broker.topic_name(f"raw{number}")
            broker.schemas.put_if_absent(name, SchemaData(STRING, data, {"k": "v"}))
            answer = await client.get(f"/admin/v2/schemas/public/default/raw{number}/schema")
            assert answer.status_code == 200, answer.text
            assert answer.json()["data"] == data.decode("utf-8", "replace")

    run(tmp_path, body)
