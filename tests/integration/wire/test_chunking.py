"""Chunked messages end to end with the real client (issue 10, acceptance point 5).

A producer with ``chunking_enabled=True`` splits a message larger than the 5 MB compactd
announces in CONNECTED into chunks, one SEND and one entry each, all with the same
sequence id, uuid, key and properties. Readers and consumers get every chunk and the
client puts the value back together; a consumer's ack of the whole message acknowledges
every chunk. Compaction keeps or drops a chunked value whole (``compactor.local.chunks``): a
key whose latest value is chunked reads back whole through ``is_read_compacted=True``,
and a chunked value superseded by a small one disappears with all its chunks.

The 12 MB cases run with de-duplication off and on (broker setting
``broker_deduplication_enabled``): the chunks of one message share a sequence id, and a
de-duplication that is not chunk-aware answers chunks 2+ as duplicates without storing
them. A chunked message straddling a compaction's stop marker and the 50 MB case (one
slow test) run with the broker's default, de-duplication off.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from api.config import Settings
from ledger.position import Position
from message.entry import chunk_of, parse_entry
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import RECEIVE_MS, drain, read_available, unique_topic

pytestmark = pytest.mark.integration

MB = 1024 * 1024
ACK_WAIT_S = 10.0  # acks travel grouped (the client flushes them every 100 ms)

DEDUP = [pytest.param(False, id="dedup-off"), pytest.param(True, id="dedup-on")]


def dedup_settings(dedup: bool) -> Settings:
    """Broker settings with de-duplication on or off."""
    return dataclasses.replace(Settings(), broker_deduplication_enabled=dedup)


@pytest.fixture(params=DEDUP)
def dedup(request: pytest.FixtureRequest) -> bool:
    enabled: bool = request.param
    return enabled


@pytest.fixture
def chunk_broker(dedup: bool, tmp_path: Path) -> Iterator[BrokerHarness]:
    harness = BrokerHarness(tmp_path / "data", dedup_settings(dedup))
    yield harness
    harness.close()


@pytest.fixture
def chunk_client(chunk_broker: BrokerHarness) -> Iterator[Any]:
    instance = pulsar.Client(chunk_broker.url, operation_timeout_seconds=30,
                             logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield instance
    instance.close()


def chunking_producer(client: Any, topic: str) -> Any:
    return client.create_producer(topic, chunking_enabled=True, batching_enabled=False, send_timeout_millis=60_000)


def big_value(size: int, seed: int) -> bytes:
    """``size`` bytes that do not compress, so that the message really is split."""
    return seed.to_bytes(4, "big") + os.urandom(size - 4)


def stored_chunks(broker: BrokerHarness, topic: str) -> dict[str, list[Position]]:
    """uuid → the positions of its chunk entries in the raw topic, as stored."""

    async def read() -> dict[str, list[Position]]:
        ledger = broker.service.get_topic(topic).ledger  # type: ignore[union-attr]
        found: dict[str, list[Position]] = {}
        end = ledger.last_confirmed_position()
        position = ledger.next_valid_position(Position(-1, -1))
        while position <= end:
            entries = ledger.read_entries(position, 100, end=end)
            for entry in entries:
                chunk = chunk_of(parse_entry(entry.data).metadata)
                if chunk is not None:
                    found.setdefault(chunk.uuid, []).append(entry.position)
            position = ledger.next_valid_position(entries[-1].position)
        return found

    result: dict[str, list[Position]] = broker.call(read())
    return result


def deduplicating(broker: BrokerHarness, topic: str) -> bool:
    async def read() -> bool:
        return broker.service.get_topic(topic).dedup is not None  # type: ignore[union-attr]

    enabled: bool = broker.call(read())
    return enabled


def compacted_positions(broker: BrokerHarness, topic: str) -> list[Position]:
    async def read() -> list[Position]:
        view = broker.service.get_topic(topic).compacted.view  # type: ignore[union-attr]
        return [] if view is None else [entry.position for entry in view.iter_all()]

    positions: list[Position] = broker.call(read())
    return positions


def mark_delete(broker: BrokerHarness, topic: str, subscription: str) -> Position:
    async def read() -> Position:
        return broker.service.get_topic(topic).subscriptions[subscription].cursor.mark_delete_position  # type: ignore[union-attr]

    position: Position = broker.call(read())
    return position


def wait_mark_delete(broker: BrokerHarness, topic: str, subscription: str, at_least: Position) -> Position:
    deadline = time.monotonic() + ACK_WAIT_S
    while (position := mark_delete(broker, topic, subscription)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return position


def test_a_12_mb_chunked_message_round_trips_through_a_reader_and_a_consumer(
    chunk_broker: BrokerHarness, chunk_client: Any, dedup: bool,
) -> None:
    topic = unique_topic("chunks")
    consumer = chunk_client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = chunking_producer(chunk_client, topic)
    value = big_value(12 * MB, 1)
    producer.send(value, partition_key="big", properties={"kind": "chunked"})
    producer.send(b"small", partition_key="small")
    assert deduplicating(chunk_broker, topic) == dedup
    [positions] = stored_chunks(chunk_broker, topic).values()
    assert len(positions) == 3  # 12 MB in chunks of at most 5 MB

    reader = chunk_client.create_reader(topic, pulsar.MessageId.earliest)
    got = read_available(reader)
    assert [(m.partition_key(), m.properties(), m.data()) for m in got] == [
        ("big", {"kind": "chunked"}, value), ("small", {}, b"small")]

    whole = consumer.receive(RECEIVE_MS)
    assert whole.data() == value
    consumer.acknowledge(whole)  # the whole chunked message: every chunk's entry
    assert wait_mark_delete(chunk_broker, topic, "sub", positions[-1]) == positions[-1]
    assert consumer.receive(RECEIVE_MS).data() == b"small"  # not acknowledged
    consumer.close()
    again = chunk_client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in drain(again)] == [b"small"]  # the chunked message is not redelivered


def test_compaction_keeps_a_chunked_latest_value_whole_and_drops_a_superseded_one_whole(
    chunk_broker: BrokerHarness, chunk_client: Any, dedup: bool,
) -> None:
    topic = unique_topic("chunks-compacted")
    producer = chunking_producer(chunk_client, topic)
    kept, superseded = big_value(12 * MB, 2), big_value(12 * MB, 3)
    producer.send(b"old", partition_key="kept")
    producer.send(kept, partition_key="kept")
    producer.send(superseded, partition_key="replaced")
    producer.send(b"small", partition_key="other")
    producer.send(b"new", partition_key="replaced")
    assert deduplicating(chunk_broker, topic) == dedup
    chunks = list(stored_chunks(chunk_broker, topic).values())
    assert [len(positions) for positions in chunks] == [3, 3]

    chunk_broker.compact(topic)
    last = chunk_client.create_producer(topic).send(b"tail", partition_key="tail")
    assert compacted_positions(chunk_broker, topic)[:3] == chunks[0]  # every chunk of the kept value
    assert not set(chunks[1]) & set(compacted_positions(chunk_broker, topic))  # none of the superseded one
    reader = chunk_client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    got = read_available(reader)
    assert [(m.partition_key(), m.data()) for m in got] == [
        ("kept", kept), ("other", b"small"), ("replaced", b"new"), ("tail", b"tail")]
    assert str(got[-1].message_id()) == str(last)


def stored_entries(broker: BrokerHarness, topic: str, positions: list[Position]) -> list[bytes]:
    async def read() -> list[bytes]:
        ledger = broker.service.get_topic(topic).ledger  # type: ignore[union-attr]
        return [ledger.read_entries(position, 1, end=position)[0].data for position in positions]

    entries: list[bytes] = broker.call(read())
    return entries


def append_raw(broker: BrokerHarness, topic: str, entries: list[bytes]) -> None:
    """Store ``entries`` as they are, as the broker stores a SEND's: to hold a chunked
    message half written while a compaction takes its stop marker."""

    async def append() -> list[Any]:
        ledger = broker.service.get_topic(topic).ledger  # type: ignore[union-attr]
        return [ledger.append(data) for data in entries]

    for appended in broker.call(append()):
        appended.result(timeout=10)


def test_a_chunked_message_straddling_a_compaction_reaches_a_read_compacted_reader_whole(
    broker: BrokerHarness, client: Any,
) -> None:
    """The first chunk is in the compacted view, the others in the raw tail after it."""
    source, topic = unique_topic("chunks-source"), unique_topic("chunks-straddle")
    value = big_value(12 * MB, 5)
    chunking_producer(client, source).send(value, partition_key="k")
    [positions] = stored_chunks(broker, source).values()
    chunks = stored_entries(broker, source, positions)  # the client's own chunk entries
    client.create_producer(topic).send(b"old", partition_key="k")
    append_raw(broker, topic, chunks[:1])
    broker.compact(topic)
    [first] = stored_chunks(broker, topic).values()
    assert len(compacted_positions(broker, topic)) == 2  # the old value, still k's, and the pending chunk
    assert compacted_positions(broker, topic)[1:] == first
    append_raw(broker, topic, chunks[1:])

    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    got = [m.data() for m in read_available(reader)]
    assert got[0] == b"old"
    assert got[1:] == [value]  # the first chunk from the view, the others from the raw tail
    broker.compact(topic)  # now complete, and k's latest value: kept whole
    [compacted] = stored_chunks(broker, topic).values()
    assert compacted_positions(broker, topic) == compacted
    again = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert [m.data() == value for m in read_available(again)] == [True]


@pytest.mark.slow
def test_a_50_mb_chunked_message_round_trips_and_survives_compaction_whole(
    broker: BrokerHarness, client: Any,
) -> None:
    assert not Settings().broker_deduplication_enabled  # the broker's default: de-duplication off
    topic = unique_topic("chunks-50mb")
    producer = chunking_producer(client, topic)
    value = big_value(50 * MB, 4)
    producer.send(value, partition_key="big")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [m.data() == value for m in read_available(reader)] == [True]
    broker.compact(topic)
    compacted = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert [m.data() == value for m in read_available(compacted)] == [True]
    [positions] = stored_chunks(broker, topic).values()
    assert len(positions) == 11  # 50 MB in chunks of at most 5 MB
    assert compacted_positions(broker, topic) == positions
