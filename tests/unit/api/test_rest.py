"""The admin REST API over a real ``BrokerService`` (tmp data dir), every route and error.

Each test runs one coroutine on a fresh event loop that is also the broker's loop; requests
go through ``httpx.ASGITransport`` to the real application, as uvicorn would deliver them
(``api.server`` runs both on one loop). Every 4xx is checked for Pulsar's ``{"reason"}``
naming the bad value; the OpenAPI document is checked to describe every route.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.broker.dedup import ProducerSession
from api.broker.service import BrokerService
from api.config import Settings, offload_bucket
from api.http import HEALTH_PATH, create_app
from api.schemas import POLICIES
from compactor.record import RunFigures
from cursor.cursor import InitialPosition, ManagedCursor
from ledger import DataDir
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/rest"
TOPIC_URL = "/admin/v2/persistent/public/default/rest"
NAMESPACE_URL = "/admin/v2/namespaces/public/default"
WAIT_S = 30.0
HOLD_S = 2.0  # how long a held run lasts at most in the 409 test
Body = Callable[[BrokerService, httpx.AsyncClient], Awaitable[None]]
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
PARTITION_AND_TENANT_ROUTES = {
    (f"{_TOPIC}/partitions", method) for method in ("put", "get", "post", "delete")
} | {
    (f"{_TOPIC}/createMissedPartitions", "post"), (f"{_TOPIC}/partitioned-stats", "get"),
    ("/admin/v2/persistent/{tenant}/{namespace}/partitioned", "get"),
    ("/admin/v2/clusters", "get"), ("/admin/v2/tenants", "get"),
    ("/admin/v2/tenants/{tenant}", "get"), ("/admin/v2/tenants/{tenant}", "put"),
    ("/admin/v2/tenants/{tenant}", "delete"), ("/admin/v2/namespaces/{tenant}", "get"),
    ("/admin/v2/namespaces/{tenant}/{namespace}", "put"), ("/admin/v2/namespaces/{tenant}/{namespace}", "delete"),
    ("/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}", "get"),
}


def entry(key: str, value: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def publish(broker: BrokerService, topic: str, *pairs: tuple[str, bytes]) -> None:
    for key, value in pairs:
        broker.get_topic(topic).ledger.append(entry(key, value)).result(timeout=10)


def run(tmp_path: Path, body: Body, **settings: Any) -> None:
    """Run ``body(broker, client)`` against a real broker and the real application, both
    built from the same settings."""
    async def main() -> None:
        chosen = Settings(compaction_monitor_interval_seconds=0, **settings)
        data_dir = DataDir.open(str(tmp_path / "data"), bucket=offload_bucket(chosen))  # as api.server opens it
        broker = BrokerService(data_dir, chosen)
        broker.loop = asyncio.get_running_loop()
        transport = httpx.ASGITransport(app=create_app(chosen, broker=broker))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as client:
                await body(broker, client)
        finally:
            await broker.stop()
            data_dir.close()

    asyncio.run(main())


def assert_reason(response: httpx.Response, status: int, *names: str) -> str:
    """``response`` is Pulsar's error answer with ``status``, its reason naming ``names``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"reason"}, body
    for name in names:
        assert name in body["reason"], (name, body)
    assert "Traceback" not in body["reason"]
    return str(body["reason"])


async def wait_for_status(client: httpx.AsyncClient, url: str, wanted: str) -> dict[str, Any]:
    async with asyncio.timeout(WAIT_S):
        while True:
            status: dict[str, Any] = (await client.get(url)).json()
            if status["status"] == wanted:
                return status
            await asyncio.sleep(0.01)


# -- health, documentation, generic errors ----------------------------------------------------

SUBSCRIPTION = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}"


def test_health_and_openapi_document_every_route(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.get(HEALTH_PATH)).text == "ok"
        assert (await client.get("/docs")).status_code == 200
        document = (await client.get("/openapi.json")).json()
        operations = [(path, method, operation) for path, item in document["paths"].items()
                      for method, operation in item.items()]
        expected = {
            ("/admin/v2/persistent/{tenant}/{namespace}", "get"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}", "put"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}", "delete"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/compaction", "put"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/compaction", "get"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats", "get"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/internalStats", "get"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}", "delete"),
            ("/metrics", "get"), (HEALTH_PATH, "get"),
            # issue 16: subscriptions, peek, reset, clear the backlog, unload, last message id
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscriptions", "get"),
            (SUBSCRIPTION + "/position/{messagePosition}", "get"),
            (SUBSCRIPTION + "/resetcursor/{timestamp}", "post"),
            (SUBSCRIPTION + "/resetcursor", "post"),
            (SUBSCRIPTION + "/skip_all", "post"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/unload", "put"),
            ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/lastMessageId", "get"),
            ("/admin/v2/compactd/backup", "post"),  # issue 16: backups of the running broker
            ("/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema", "get"),
            ("/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema", "post"),
            ("/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema", "delete"),
            ("/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema/{version}", "get"),
        } | {(f"{prefix}/permissions{tail}", method)  # issue 15: grants
             for prefix in ("/admin/v2/persistent/{tenant}/{namespace}/{topic}",
                            "/admin/v2/namespaces/{tenant}/{namespace}")
             for tail, method in (("", "get"), ("/{role}", "post"), ("/{role}", "delete"))} | {(f"{prefix}/schemaCompatibilityStrategy", method)
             for method in ("get", "put", "post", "delete")
             for prefix in ("/admin/v2/persistent/{tenant}/{namespace}/{topic}",
                            "/admin/v2/namespaces/{tenant}/{namespace}")} | {(f"{prefix}/{spec.name}", method)
             for spec in POLICIES for method in ("get", "post", "delete")
             for prefix in ("/admin/v2/persistent/{tenant}/{namespace}/{topic}",
                            "/admin/v2/namespaces/{tenant}/{namespace}")}
        expected |= PARTITION_AND_TENANT_ROUTES  # issue 14
        expected |= {(f"{prefix}/{spec.name}", "put")  # issue 29: Pulsar's PUT of the offload policies
                     for spec in POLICIES if spec.kind == "signed"
                     for prefix in ("/admin/v2/persistent/{tenant}/{namespace}/{topic}",
                                    "/admin/v2/namespaces/{tenant}/{namespace}")}
        expected |= {("/admin/v2/persistent/{tenant}/{namespace}/{topic}/offload", method)  # issue 29
                     for method in ("get", "put")}
        assert {(path, method) for path, method, _ in operations} == expected
        for path, method, operation in operations:
            assert operation.get("summary") and operation.get("description"), (path, method)
            for code, response in operation["responses"].items():
                assert response.get("description"), (path, method, code)
            if path != HEALTH_PATH:
                assert "500" in operation["responses"], (path, method)
        ids = [operation["operationId"] for _, _, operation in operations]
        assert len(ids) == len(set(ids))

    run(tmp_path, body)


def test_unknown_path_and_method_answer_a_reason(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert_reason(await client.get("/admin/v2/nowhere"), 404, "Not Found")
        assert_reason(await client.post(TOPIC_URL), 405, "Method Not Allowed")

    run(tmp_path, body)


def test_without_a_broker_every_admin_route_answers_503() -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=create_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as client:
            assert (await client.get(HEALTH_PATH)).status_code == 200
            assert_reason(await client.get(TOPIC_URL + "/stats"), 503, "not available")
            assert_reason(await client.get("/metrics"), 503, "not available")

    asyncio.run(main())


def test_an_unexpected_error_answers_500_without_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        def broken(_text: str) -> dict[str, Any]:
            raise RuntimeError("secret internals")
        monkeypatch.setattr(broker.admin, "stats", broken)
        with caplog.at_level(logging.ERROR, logger="api.errors"):
            response = await client.get(TOPIC_URL + "/stats")
        reason = assert_reason(response, 500, "RuntimeError")
        assert "secret internals" not in reason
        assert "secret internals" in caplog.text  # logged, with its traceback, for the operator

    run(tmp_path, body)


# -- topics -----------------------------------------------------------------------------------

def test_topics_list_create_delete(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        assert (await client.get("/admin/v2/persistent/public/default")).json() == []
        response = await client.put(TOPIC_URL)
        assert response.status_code == 204 and response.content == b""
        assert_reason(await client.put(TOPIC_URL), 409, TOPIC)
        assert (await client.get("/admin/v2/persistent/public/default")).json() == [TOPIC]
        assert (await client.get("/admin/v2/persistent/other/ns")).json() == []
        publish(broker, TOPIC, ("a", b"1"))
        broker.registry.loaded[TOPIC].attach_producer("p", "owner")
        assert_reason(await client.delete(TOPIC_URL), 412, TOPIC, "active")
        broker.registry.loaded[TOPIC].detach_producer("p", "owner")
        assert (await client.delete(TOPIC_URL)).status_code == 204
        assert broker.data_dir.ledgers.list() == []
        assert_reason(await client.delete(TOPIC_URL), 404, TOPIC)
        assert (await client.get("/admin/v2/persistent/public/default")).json() == []

    run(tmp_path, body)


@pytest.mark.parametrize(("method", "url"), [
    ("PUT", "/admin/v2/persistent/public/default/bad name"),
    ("DELETE", "/admin/v2/persistent/public/default/bad name"),
    ("GET", "/admin/v2/persistent/public/default/bad name/stats"),
    ("GET", "/admin/v2/persistent/public/default/bad name/internalStats"),
    ("PUT", "/admin/v2/persistent/public/default/bad name/compaction"),
    ("GET", "/admin/v2/persistent/public/default/bad name/compaction"),
    ("GET", "/admin/v2/persistent/public/default/bad name/compactionThreshold"),
    ("DELETE", "/admin/v2/persistent/public/default/bad name/subscription/s"),
    ("GET", "/admin/v2/persistent/bad tenant/default"),
    ("GET", "/admin/v2/namespaces/public/bad ns/compactionThreshold"),
    ("POST", "/admin/v2/namespaces/public/bad ns/deleteRetentionMs"),
])
def test_a_malformed_name_answers_412_naming_it(tmp_path: Path, method: str, url: str) -> None:
    """Pulsar answers 412 "Topic name is not valid" (and the same for a namespace)."""
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        response = await client.request(method, url, json=1 if method == "POST" else None)
        assert_reason(response, 412, "bad ")

    run(tmp_path, body)


@pytest.mark.parametrize(("method", "suffix"), [
    ("DELETE", ""), ("GET", "/stats"), ("GET", "/internalStats"), ("PUT", "/compaction"),
    ("GET", "/compaction"), ("DELETE", "/subscription/s"),
    *((method, f"/{spec.name}") for spec in POLICIES for method in ("GET", "DELETE")),
    *(("POST", f"/{spec.name}") for spec in POLICIES),
])
def test_a_missing_topic_answers_404_naming_it(tmp_path: Path, method: str, suffix: str) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        response = await client.request(method, "/admin/v2/persistent/public/default/missing" + suffix,
                                        json=1 if method == "POST" else None)
        assert_reason(response, 404, "persistent://public/default/missing")

    run(tmp_path, body)


def test_delete_subscription(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        publish(broker, TOPIC, ("a", b"1"))
        ManagedCursor.open_durable(broker.get_topic(TOPIC).ledger, "sub", InitialPosition.EARLIEST,
                                   store=broker.cursors)
        assert "sub" in (await client.get(TOPIC_URL + "/stats")).json()["subscriptions"]
        assert (await client.delete(TOPIC_URL + "/subscription/sub")).status_code == 204
        assert "sub" not in (await client.get(TOPIC_URL + "/stats")).json()["subscriptions"]
        assert_reason(await client.delete(TOPIC_URL + "/subscription/sub"), 404, "sub")

    run(tmp_path, body)


# -- compaction -------------------------------------------------------------------------------

def test_compaction_trigger_status_and_compacted_view_deletion(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        assert (await client.get(TOPIC_URL + "/compaction")).json() == {"status": "NOT_RUN", "lastError": ""}
        publish(broker, TOPIC, ("a", b"1"), ("a", b"2"), ("b", b"1"))
        response = await client.put(TOPIC_URL + "/compaction")
        assert response.status_code == 204 and response.content == b""
        await wait_for_status(client, TOPIC_URL + "/compaction", "SUCCESS")
        stats = (await client.get(TOPIC_URL + "/stats")).json()
        assert stats["compaction"]["lastCompactionRemovedEventCount"] == 1
        assert stats["compaction"]["lastCompactionSucceedTimestamp"] > 0
        internal = (await client.get(TOPIC_URL + "/internalStats")).json()
        ledger_id = internal["compactedLedger"]["ledgerId"]
        assert internal["compactedLedger"]["entries"] == 2 and ledger_id in broker.data_dir.ledgers.list()
        assert internal["cursors"]["__compaction"]["properties"] == {"CompactedTopicLedger": ledger_id}
        assert internal["ledgers"][0]["entries"] == 3

        assert (await client.delete(TOPIC_URL + "/subscription/__compaction")).status_code == 204
        internal = (await client.get(TOPIC_URL + "/internalStats")).json()
        assert internal["compactedLedger"] == {
            "ledgerId": -1, "entries": -1, "size": -1, "offloaded": False, "underReplicated": False}
        assert "__compaction" not in internal["cursors"]
        assert ledger_id not in broker.data_dir.ledgers.list()
        # gone until the next run opens it again, as Pulsar: a second delete finds nothing
        assert_reason(await client.delete(TOPIC_URL + "/subscription/__compaction"), 404, "__compaction")
        assert "__compaction" not in (await client.get(TOPIC_URL + "/subscriptions")).json()
        assert (await client.put(TOPIC_URL + "/compaction")).status_code == 204
        await wait_for_status(client, TOPIC_URL + "/compaction", "SUCCESS")
        assert "__compaction" in (await client.get(TOPIC_URL + "/subscriptions")).json()
        assert (await client.delete(TOPIC_URL + "/subscription/__compaction")).status_code == 204

    run(tmp_path, body)


def _held_runs(broker: BrokerService, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make every run (in its worker thread) wait for the returned event, at most HOLD_S
    (bounded: a blocked loop would otherwise never set it), then succeed."""
    release = threading.Event()

    def held(*_args: Any, **_kwargs: Any) -> RunFigures:
        release.wait(HOLD_S)
        return RunFigures()
    monkeypatch.setattr(broker.compactor, "compact", held)
    return release


def test_compaction_in_progress_answers_409(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        release = _held_runs(broker, monkeypatch)
        await client.put(TOPIC_URL)
        assert (await client.put(TOPIC_URL + "/compaction")).status_code == 204
        assert (await client.get(TOPIC_URL + "/compaction")).json()["status"] == "RUNNING"
        reason = assert_reason(await client.put(TOPIC_URL + "/compaction"), 409)
        assert reason == "Compaction already in progress"
        release.set()
        await wait_for_status(client, TOPIC_URL + "/compaction", "SUCCESS")

    run(tmp_path, body)


def test_deleting_compaction_subscription_or_topic_while_a_run_holds_it_answers_409(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        release = _held_runs(broker, monkeypatch)
        await client.put(TOPIC_URL)
        assert (await client.put(TOPIC_URL + "/compaction")).status_code == 204
        try:
            async with asyncio.timeout(WAIT_S):
                while not broker.runs.running(TOPIC):
                    await asyncio.sleep(0.001)
            assert_reason(await client.delete(TOPIC_URL + "/subscription/__compaction"), 409, "in progress")
            assert_reason(await client.delete(TOPIC_URL), 409, "in progress")
            assert_reason(await client.put(TOPIC_URL + "/compaction"), 409, "in progress")
            assert broker.runs.running(TOPIC)
        finally:
            release.set()
        await wait_for_status(client, TOPIC_URL + "/compaction", "SUCCESS")
        assert (await client.delete(TOPIC_URL + "/subscription/__compaction")).status_code == 204

    run(tmp_path, body)


def test_a_failed_run_reads_error_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        def failing(*_args: Any, **_kwargs: Any) -> RunFigures:
            raise OSError("disk full")
        monkeypatch.setattr(broker.compactor, "compact", failing)
        await client.put(TOPIC_URL)
        await client.put(TOPIC_URL + "/compaction")
        status = await wait_for_status(client, TOPIC_URL + "/compaction", "ERROR")
        assert "disk full" in status["lastError"]

    run(tmp_path, body)


# -- policies ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", POLICIES, ids=[spec.name for spec in POLICIES])
@pytest.mark.parametrize("base", [TOPIC_URL, NAMESPACE_URL], ids=["topic", "namespace"])
def test_policy_get_set_remove(tmp_path: Path, spec: Any, base: str) -> None:
    good: Any = {"ratio": 0.25, "long": 1024, "signed": -1, "bool": True}[spec.kind]
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        url = f"{base}/{spec.name}"
        response = await client.get(url)
        assert response.status_code == 204 and response.content == b""
        assert (await client.post(url, json=good)).status_code == 204
        response = await client.get(url)
        assert response.status_code == 200 and response.json() == good
        assert (await client.delete(url)).status_code == 204
        assert (await client.get(url)).status_code == 204
        assert (await client.delete(url)).status_code == 204  # removing an unset policy is fine
        if spec.kind == "signed":  # Pulsar sets its offload policies with PUT
            assert (await client.put(url, json=2048)).status_code == 204
            assert (await client.get(url)).json() == 2048

    run(tmp_path, body)


def test_topic_and_namespace_policies_are_separate(tmp_path: Path) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        await client.post(NAMESPACE_URL + "/compactionThreshold", json=100)
        assert (await client.get(TOPIC_URL + "/compactionThreshold")).status_code == 204
        await client.post(TOPIC_URL + "/compactionThreshold", json=5)
        assert (await client.get(NAMESPACE_URL + "/compactionThreshold")).json() == 100
        assert (await client.get(TOPIC_URL + "/compactionThreshold")).json() == 5

    run(tmp_path, body)


OUT_OF_RANGE = [("long", "-1", "-1"), ("long", "9223372036854775808", "9223372036854775808"),
                ("ratio", "1.5", "1.5"), ("ratio", "-0.1", "-0.1"), ("ratio", "NaN", "NaN"),
                ("signed", "9223372036854775808", "9223372036854775808"),
                ("signed", "-9223372036854775809", "-9223372036854775809")]
WRONG_TYPE = [("long", "1.5", "1.5"), ("long", '"100M"', '"100M"'), ("long", "true", "true"),
              ("long", "null", "null"), ("long", "[1]", "[1]"), ("ratio", '"0.5"', '"0.5"'),
              ("ratio", "false", "false"), ("long", "{}", "{}"), ("bool", "1", "1"), ("bool", '"true"', '"true"'),
              ("bool", "null", "null"), ("signed", "1.5", "1.5"), ("signed", '"10M"', '"10M"'),
              ("signed", "false", "false")]


@pytest.mark.parametrize(("kind", "raw", "named"), OUT_OF_RANGE)
@pytest.mark.parametrize("base", [TOPIC_URL, NAMESPACE_URL], ids=["topic", "namespace"])
def test_policy_out_of_range_answers_412_naming_the_value(
        tmp_path: Path, base: str, kind: str, raw: str, named: str) -> None:
    """Pulsar: 412 "compactionThreshold must be 0 or more"."""
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        for spec in (spec for spec in POLICIES if spec.kind == kind):
            response = await client.post(f"{base}/{spec.name}", content=raw,
                                         headers={"content-type": "application/json"})
            assert_reason(response, 412, named, spec.name)
            assert (await client.get(f"{base}/{spec.name}")).status_code == 204  # nothing stored

    run(tmp_path, body)


@pytest.mark.parametrize(("kind", "raw", "named"), WRONG_TYPE)
def test_policy_of_the_wrong_type_answers_400_naming_the_value(
        tmp_path: Path, kind: str, raw: str, named: str) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        for base in (TOPIC_URL, NAMESPACE_URL):
            for spec in (spec for spec in POLICIES if spec.kind == kind):
                response = await client.post(f"{base}/{spec.name}", content=raw,
                                             headers={"content-type": "application/json"})
                assert_reason(response, 400, named, spec.name)

    run(tmp_path, body)


@pytest.mark.parametrize("raw", [b"", b"not json", b"{", b"\xff"])
def test_policy_body_missing_or_not_json_answers_400(tmp_path: Path, raw: bytes) -> None:
    async def body(_broker: BrokerService, client: httpx.AsyncClient) -> None:
        response = await client.post(NAMESPACE_URL + "/compactionThreshold", content=raw,
                                     headers={"content-type": "application/json"})
        reason = assert_reason(response, 400)
        assert "required" in reason or "JSON" in reason, reason

    run(tmp_path, body)


# -- stats and metrics ------------------------------------------------------------------------

def test_stats_and_internal_stats_shapes(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        # issue 16: msgInCounter counts messages published through the topic (not entries
        # appended to its ledger), so they go through Topic.publish here
        topic, session = broker.get_topic(TOPIC), ProducerSession()
        for sequence_id, (key, value) in enumerate((("a", b"1"), ("b", b"22"))):
            # awaited through a callback: the topic's counting callback, registered first, ran
            await asyncio.wrap_future(topic.publish(session, "p", sequence_id, sequence_id, entry(key, value)))
        stats = (await client.get(TOPIC_URL + "/stats")).json()
        assert stats["msgInCounter"] == 2 and stats["storageSize"] > 0
        assert stats["compaction"] == {
            "lastCompactionRemovedEventCount": 0, "lastCompactionSucceedTimestamp": 0,
            "lastCompactionFailedTimestamp": 0, "lastCompactionDurationTimeInMills": 0}
        internal = (await client.get(TOPIC_URL + "/internalStats")).json()
        assert internal["entriesAddedCounter"] == 2 and internal["numberOfEntries"] == 2
        assert internal["ledgers"][0]["entries"] == 2 and internal["compactedLedger"]["ledgerId"] == -1

    run(tmp_path, body)


def test_metrics_serve_prometheus_text_with_the_compaction_family(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await client.put(TOPIC_URL)
        publish(broker, TOPIC, ("a", b"1"), ("a", b"2"))
        await client.put(TOPIC_URL + "/compaction")
        await wait_for_status(client, TOPIC_URL + "/compaction", "SUCCESS")
        response = await client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        assert "pulsar_compaction_removed_event_count" in response.text
        assert TOPIC in response.text

    run(tmp_path, body)
