"""Partitioned topics and namespaces with the real pulsar-client (issue 14, points 1 and 4).

A partitioned parent is created through the admin core on the broker's loop (the REST
routes are ``tests/unit/api/test_partitions_rest.py``); the client does the rest: it asks
PARTITIONED_METADATA, then opens one producer or consumer per partition. Tests never assert
which partition a key lands on (the client hashes with Boost), only that it stays on one.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pulsar
import pytest

from api.config import Settings
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import (
    RECEIVE_MS,
    drain,
    read_available,
    unique_topic,
    wait_until,
)

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 60.0


def create_partitioned(broker: BrokerHarness, topic: str, partitions: int) -> None:
    async def create() -> None:
        assert broker.service is not None
        broker.service.partitioned.create(broker.service.admin, topic, partitions)
    broker.call(create())


def admin_call(broker: BrokerHarness, method: str, *args: Any) -> Any:
    async def call() -> Any:
        assert broker.service is not None
        return getattr(broker.service.admin, method)(*args)
    return broker.call(call())


def wait_for_runs(broker: BrokerHarness) -> None:
    assert broker.service is not None
    broker.call(broker.service.admin.wait_for_runs(), timeout_s=RUN_TIMEOUT_S)


def partition_of(message: Any) -> int:
    return int(message.topic_name().rsplit("-partition-", 1)[1])


def test_partitioned_metadata_answers_n_for_the_parent_and_each_partition_is_a_topic(
        broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("meta")
    create_partitioned(broker, topic, 4)

    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(4)]
    assert client.get_topic_partitions(f"{topic}-partition-2") == [f"{topic}-partition-2"]
    assert {f"{topic}-partition-{i}" for i in range(4)} <= set(admin_call(broker, "list_topics", "public/default"))


def test_keyed_messages_stay_on_one_partition_in_order(broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("keyed")
    create_partitioned(broker, topic, 4)
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic)
    for i in range(400):
        producer.send_async(f"{i}".encode(), None, partition_key=f"k{i % 40}")
    producer.flush()

    received = [consumer.receive(RECEIVE_MS) for _ in range(400)]

    by_key: dict[str, list[Any]] = defaultdict(list)
    for message in received:
        by_key[message.partition_key()].append(message)
        assert message.message_id().partition() == partition_of(message)
        assert pulsar.MessageId.deserialize(message.message_id().serialize()) == message.message_id()
    assert len(by_key) == 40
    for key, messages in by_key.items():
        assert len({m.topic_name() for m in messages}) == 1, key
        values = [int(m.data()) for m in messages]
        assert values == sorted(values) and len(values) == 10, key
    assert {m.topic_name() for m in received} <= {f"{topic}-partition-{i}" for i in range(4)}


def test_key_less_messages_go_round_robin_over_the_partitions(broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("robin")
    create_partitioned(broker, topic, 4)
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(100):
        producer.send(f"{i}".encode())

    received = [consumer.receive(RECEIVE_MS) for _ in range(100)]

    counts: dict[str, int] = defaultdict(int)
    for message in received:
        counts[message.topic_name()] += 1
    assert sorted(counts.values()) == [25, 25, 25, 25]


def test_a_reader_on_the_parent_reads_every_partition_and_one_on_a_partition_reads_its_share(
        broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("reader")
    create_partitioned(broker, topic, 4)
    producer = client.create_producer(topic)
    for i in range(80):
        producer.send(f"{i}".encode(), partition_key=f"k{i % 16}")

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    every = read_available(reader)
    assert sorted(int(m.data()) for m in every) == list(range(80))
    assert not reader.has_message_available()

    one = client.create_reader(f"{topic}-partition-2", pulsar.MessageId.earliest)
    share = read_available(one)
    assert {m.data() for m in share} == {m.data() for m in every if partition_of(m) == 2}


def test_a_durable_subscription_on_the_parent_resumes_after_its_acknowledgements(
        broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("resume")
    create_partitioned(broker, topic, 3)
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(60):
        producer.send(f"{i}".encode(), partition_key=f"k{i % 12}")
    received = [consumer.receive(RECEIVE_MS) for _ in range(60)]
    acked = {m.data() for m in received if int(m.data()) % 2 == 0}
    for message in received:
        if message.data() in acked:
            consumer.acknowledge(message)
    consumer.close()  # the client sends its grouped acknowledgements before it closes

    again = client.subscribe(topic, "sub")
    rest = drain(again)

    assert sorted(int(m.data()) for m in rest) == [i for i in range(60) if i % 2 == 1]
    assert {partition_of(m) for m in rest} == {0, 1, 2}


def test_compaction_of_the_parent_fans_out_and_compacted_readers_see_the_latest_value_per_key(
        broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("compact")
    create_partitioned(broker, topic, 4)
    producer = client.create_producer(topic)
    for round_ in range(2):
        for k in range(20):
            producer.send(f"k{k}-v{round_}".encode(), partition_key=f"k{k}")
    for k in range(0, 20, 5):
        producer.send(None, partition_key=f"k{k}")  # tombstones

    admin_call(broker, "trigger_compaction", topic)
    wait_for_runs(broker)

    for i in range(4):
        assert admin_call(broker, "compaction_status", f"{topic}-partition-{i}")["status"] == "SUCCESS"
    assert admin_call(broker, "compaction_status", topic) == {"status": "SUCCESS", "lastError": ""}
    expected = {f"k{k}": f"k{k}-v1".encode() for k in range(20) if k % 5}
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    compacted = read_available(reader)
    assert {m.partition_key(): m.data() for m in compacted} == expected
    assert len(compacted) == len(expected)  # one message per live key, tombstoned keys gone
    compacted_reads = sum(len(read_available(client.create_reader(
        f"{topic}-partition-{i}", pulsar.MessageId.earliest, is_read_compacted=True))) for i in range(4))
    assert compacted_reads == 16

    producer.send(b"tail", partition_key="k1")  # after every horizon
    view = client.create_table_view(topic)
    try:
        wait_until(lambda: view.get("k1") == b"tail", "the table view sees the raw tail")
        seen: dict[str, bytes] = {}
        view.for_each(lambda key, value: seen.__setitem__(key, value))
        assert seen == {**expected, "k1": b"tail"}
    finally:
        view.close()


@pytest.fixture
def limited(tmp_path: Path) -> Any:
    harness = BrokerHarness(tmp_path / "data", Settings(compaction_max_concurrent_runs=2,
                                                        compaction_monitor_interval_seconds=0))
    yield harness
    harness.close()


def test_a_parent_policy_applies_to_every_partition_and_the_scheduler_keeps_the_run_limit(limited: Any) -> None:
    topic = unique_topic("sched")
    create_partitioned(limited, topic, 6)
    client = pulsar.Client(limited.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(240):
            producer.send(b"x" * 200, partition_key=f"k{i}")
    finally:
        client.close()
    service = limited.service
    assert service is not None

    async def tick() -> tuple[list[str], int]:
        await service.admin.set_policy(service.admin.topic_scope(topic), "compactionThreshold", 1)
        plan = service.scheduler_tick(int(time.time() * 1000))
        return list(plan.start), service.runs.running_count + service.runs.queued_count

    started, in_flight = limited.call(tick())

    assert len(started) == 2 and in_flight <= 2  # six partitions over the threshold, two slots
    assert all(name.startswith(f"{topic}-partition-") for name in started)
    wait_for_runs(limited)
    for _ in range(3):  # the next ticks take the rest, never more than the limit at once
        started, in_flight = limited.call(tick())
        assert in_flight <= 2
        wait_for_runs(limited)
    statuses = [admin_call(limited, "compaction_status", f"{topic}-partition-{i}")["status"] for i in range(6)]
    assert statuses == ["SUCCESS"] * 6


def test_a_grown_partitioned_topic_gets_producers_on_its_new_partitions(broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("grow")
    create_partitioned(broker, topic, 2)

    async def grow() -> None:
        assert broker.service is not None
        broker.service.partitioned.update(broker.service.admin, topic, 4)
    broker.call(grow())

    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(8):
        producer.send(f"{i}".encode())
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    assert {partition_of(m) for m in drain(consumer)} == {0, 1, 2, 3}


def test_a_producer_in_a_missing_namespace_is_refused_at_once_with_topic_not_found(
        broker: BrokerHarness, client: Any) -> None:
    started = time.monotonic()
    with pytest.raises(pulsar.exceptions.TopicNotFound):
        client.create_producer("persistent://nobody/nothing/t")
    with pytest.raises(pulsar.exceptions.TopicNotFound):
        client.subscribe("persistent://public/missing/t", "sub")
    assert time.monotonic() - started < 2.0

    async def make() -> None:
        assert broker.service is not None
        broker.service.tenants.create_tenant("nobody", {})
        broker.service.tenants.create_namespace("nobody/nothing")
    broker.call(make())
    client.create_producer("persistent://nobody/nothing/t").send(b"now it exists")


def test_namespaces_survive_a_restart_and_public_default_is_there_from_the_start(broker: BrokerHarness) -> None:
    assert broker.service is not None
    assert broker.service.tenants.list_namespaces("public") == ["public/default"]

    async def make() -> None:
        assert broker.service is not None
        broker.service.tenants.create_tenant("acme", {})
        broker.service.tenants.create_namespace("acme/orders")
    broker.call(make())
    create_partitioned(broker, "persistent://acme/orders/o", 2)
    broker.restart()

    assert broker.service.tenants.list_namespaces("acme") == ["acme/orders"]
    assert broker.service.partitioned.in_namespace("acme/orders") == ["persistent://acme/orders/o"]
