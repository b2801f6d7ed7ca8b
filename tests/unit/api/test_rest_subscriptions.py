"""The subscription and load routes (issue 16) over the real application and broker core:
answers, what they move, and the errors they name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from api.broker.dedup import ProducerSession
from api.broker.service import BrokerService
from cursor.cursor import InitialPosition, ManagedCursor
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.test_rest import assert_reason, run

TOPIC = "persistent://public/default/subs"
URL = "/admin/v2/persistent/public/default/subs"


def message(key: str, value: bytes, publish_ms: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=publish_ms, partition_key=key,
                                  properties=[pb.KeyValue(key="colour", value="blue")])
    return encode_entry(metadata, value, with_checksum=False)


def batch(publish_ms: int, *values: bytes) -> bytes:
    template = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=publish_ms)
    slots = [(pb.SingleMessageMetadata(partition_key=f"b{i}"), value) for i, value in enumerate(values)]
    return encode_batch(template, slots, pb.NONE, with_checksum=False)


async def store(broker: BrokerService, *entries: tuple[bytes, int]) -> None:
    """Publish (entry, messages) through the topic and wait until each is counted."""
    topic, session = broker.get_topic(TOPIC), ProducerSession()
    for sequence_id, (data, messages) in enumerate(entries):
        await asyncio.wrap_future(topic.publish(session, "p", sequence_id, sequence_id, data, messages=messages))


def subscribe(broker: BrokerService, name: str) -> None:
    """A durable subscription at the earliest entry, with no consumer (as a closed one leaves it)."""
    topic = broker.get_topic(TOPIC)
    ManagedCursor.open_durable(topic.ledger, name, InitialPosition.EARLIEST, store=topic.cursors)


async def backlog(client: httpx.AsyncClient, name: str) -> int:
    stats = (await client.get(URL + "/stats")).json()
    return int(stats["subscriptions"][name]["msgBacklog"])


def test_peek_reset_skip_all_and_last_message_id(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await store(broker, (message("k0", b"v0", 1000), 1), (message("k1", b"v1", 2000), 1),
                    (batch(3000, b"x", b"y", b"z"), 3))
        subscribe(broker, "s")
        assert (await client.get(URL + "/subscriptions")).json() == ["__compaction", "s"]
        stats = (await client.get(URL + "/stats")).json()
        assert stats["msgInCounter"] == 5 and stats["publishers"] == []  # messages, not the 3 entries

        first = await client.get(URL + "/subscription/s/position/1")
        assert first.status_code == 200 and first.content == b"v0"
        assert first.headers["x-pulsar-partition-key"] == "k0"
        assert first.headers["x-pulsar-publish-time"] == "1000"
        assert first.headers["x-pulsar-property-colour"] == "blue"
        third = await client.get(URL + "/subscription/s/position/3")
        assert third.headers["x-pulsar-num-batch-message"] == "3" and b"y" in third.content
        ids = [first.headers["x-pulsar-message-id"], third.headers["x-pulsar-message-id"]]
        assert_reason(await client.get(URL + "/subscription/s/position/4"), 404, "4")
        assert_reason(await client.get(URL + "/subscription/nope/position/1"), 404, "nope")
        assert (await client.get(URL + "/subscription/s/position/0")).status_code == 412

        last = (await client.get(URL + "/lastMessageId")).json()
        assert f"{last['ledgerId']}:{last['entryId']}" == ids[1] and last["batchIndex"] == 2

        assert (await client.post(URL + "/subscription/s/skip_all")).status_code == 204
        assert await backlog(client, "s") == 0
        ledger, entry = (int(part) for part in ids[0].split(":"))
        reset = await client.post(URL + "/subscription/s/resetcursor", json={"ledgerId": ledger, "entryId": entry + 1})
        assert reset.status_code == 204 and await backlog(client, "s") == 2
        assert (await client.post(URL + "/subscription/s/resetcursor",
                                  json={"ledgerId": ledger, "entryId": entry, "isExcluded": True})).status_code == 204
        assert await backlog(client, "s") == 2
        assert (await client.post(URL + "/subscription/s/resetcursor/1500")).status_code == 204
        assert await backlog(client, "s") == 2  # the first message published at or after 1500: v1
        assert (await client.post(URL + "/subscription/s/resetcursor/0")).status_code == 204
        assert await backlog(client, "s") == 3
        peeked = await client.get(URL + "/subscription/s/position/1")
        assert peeked.content == b"v0"  # a reset forgets what was skipped

    run(tmp_path, body)


def test_bad_values_are_refused_naming_them(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await store(broker, (message("k", b"v", 1), 1))
        subscribe(broker, "s")
        assert_reason(await client.post(URL + "/subscription/s/resetcursor", json={"ledgerId": "x", "entryId": 0}),
                      400, "ledgerId")
        assert_reason(await client.post(URL + "/subscription/s/resetcursor", json={"ledgerId": 2**63, "entryId": 0}),
                      412, "ledgerId")
        assert_reason(await client.post(URL + "/subscription/s/resetcursor/-1"), 412, "timestamp")
        assert_reason(await client.post(URL + "/subscription/nope/skip_all"), 404, "nope")
        assert_reason(await client.post("/admin/v2/persistent/public/default/none/subscription/s/skip_all"), 404,
                      "none")
        assert_reason(await client.put("/admin/v2/persistent/public/default/none/unload"), 404, "none")
        assert_reason(await client.get("/admin/v2/persistent/public/default/none/lastMessageId"), 404, "none")
        for odd in ({"ledgerId": -1, "entryId": 5}, {"ledgerId": 10**12, "entryId": 3}):
            answer = await client.post(URL + "/subscription/s/resetcursor", json=odd)
            assert answer.status_code == 204, answer.text  # before the start or past the end: clamped
        assert await backlog(client, "s") in (0, 1)

    run(tmp_path, body)


def test_unload_drops_the_topic_and_the_next_use_loads_it_again(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        await store(broker, (message("k", b"v", 1), 1))
        loaded = broker.registry.loaded[TOPIC]
        assert (await client.put(URL + "/unload")).status_code == 204
        assert TOPIC not in broker.registry.loaded and loaded.closed
        assert (await client.get(URL + "/stats")).json()["storageSize"] > 0  # loaded again, data kept
        assert broker.registry.loaded[TOPIC] is not loaded

    run(tmp_path, body)


def test_stats_name_a_producer_attached_by_a_door_that_does_not_describe_it(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        broker.get_topic(TOPIC).attach_producer("plain", object())
        stats = await client.get(URL + "/stats")
        assert stats.status_code == 200, stats.text
        assert [p["producerName"] for p in stats.json()["publishers"]] == ["plain"]

    run(tmp_path, body)
