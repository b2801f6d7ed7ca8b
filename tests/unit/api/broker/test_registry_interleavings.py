"""Random interleavings of a topic's lifecycle against the real broker core.

Hypothesis draws a batch of operations — load, unload, delete, partitioned delete (and the
parent's re-creation), producer attach with an append, consumer attach, de-duplication
start/stop — on a plain topic and on a partitioned topic's two partitions, each started
after a drawn number of loop turns, all in flight together on a real ``BrokerService`` over
a real data dir. Refusals (the broker's errors) are answers; anything else fails. Checked:

* nothing attaches to a closed or deleted topic: at the attach, the topic is open and is
  the registry's loaded topic;
* nothing waits forever: each operation ends within ``OP_BOUND_S``;
* no acknowledged append is forgotten: after the stop and a restart, every append
  acknowledged on a topic not deleted afterwards reads back at its position;
* a deleted topic leaves no cursor behind (the de-duplication start racing a delete).
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.broker.consumer import Consumer, Delivery
from api.broker.dedup import ProducerSession
from api.broker.dispatch import SubType
from api.broker.service import BrokerService
from api.config import Settings
from ledger import DataDir
from ledger.errors import CompactionServiceError
from ledger.position import Position
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

PARENT = "persistent://public/default/parted"
PARTITIONS = (PARENT + "-partition-0", PARENT + "-partition-1")
PLAIN = "persistent://public/default/plain"
TOPICS = (PLAIN, *PARTITIONS)
OP_BOUND_S = 10.0

OPS = ("load", "unload", "delete", "delete_parent", "create_parent", "produce", "consume", "dedup_on", "dedup_off")


class _Consumer(Consumer):
    def send(self, delivery: Delivery) -> None:
        pass


@dataclass
class _World:
    broker: BrokerService
    acked: list[tuple[str, Position, bytes]] = field(default_factory=list)
    turns: int = 0

    def forget_deleted(self, topics: tuple[str, ...]) -> None:
        """A delete that ended drops what was acknowledged on ``topics`` before it."""
        self.acked = [a for a in self.acked if a[0] not in topics or self.broker.data_dir.metadata.topic_exists(a[0])
                      and a[1].ledger_id in {r.ledger_id for r in
                                             self.broker.data_dir.metadata.topic_ledgers(a[0])}]


def _entry(value: bytes) -> bytes:
    return encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), value,
                        with_checksum=False)


async def _attached_topic(world: _World, name: str):  # type: ignore[no-untyped-def]
    """The loaded topic, as the wire takes it: loaded off the loop, then taken on the loop
    in the same turn as the attach."""
    broker = world.broker
    await broker.load_topic(name)
    topic = broker.get_topic(name)
    assert not topic.closed, f"{name}: attached to a closed topic"
    assert broker.registry.get(name) is topic, f"{name}: attached to a topic the registry does not serve"
    return topic


async def _op(world: _World, op: str, name: str, index: int) -> None:
    broker = world.broker
    if op == "load":
        await broker.load_topic(name)
    elif op == "unload":
        loaded = broker.registry.get(name)
        if loaded is not None:
            await broker.unload_topic(loaded)
    elif op == "delete":
        await broker.admin.delete_topic(name)
        world.forget_deleted((name,))
    elif op == "delete_parent":
        try:
            await broker.partitioned.delete(broker.admin, PARENT)
        finally:
            world.forget_deleted(PARTITIONS)
    elif op == "create_parent":
        broker.partitioned.create(broker.admin, PARENT, 2)
    elif op == "produce":
        topic = await _attached_topic(world, name)
        owner = object()
        topic.attach_producer(f"p{index}", owner)
        try:
            value = f"{name}-{index}".encode()
            position = await asyncio.wrap_future(topic.publish(ProducerSession(), f"p{index}", index, index,
                                                               _entry(value)))
            world.acked.append((name, position, value))
        finally:
            topic.detach_producer(f"p{index}", owner)
    elif op == "consume":
        topic = await _attached_topic(world, name)
        consumer = _Consumer(index, f"c{index}")
        subscription = topic.subscribe(f"s{index}", consumer, SubType.EXCLUSIVE, durable=False)
        await asyncio.sleep(0)
        topic.remove_consumer(subscription, consumer)
    elif op in ("dedup_on", "dedup_off"):
        await broker.admin.set_policy("public/default", "deduplicationEnabled", op == "dedup_on")


async def _run_op(world: _World, op: str, name: str, index: int, delay: int) -> None:
    for _ in range(delay):
        await asyncio.sleep(0)
    try:
        await asyncio.wait_for(_op(world, op, name, index), OP_BOUND_S)
    except CompactionServiceError:
        pass  # a refusal: the broker's answer (being loaded, deleted, busy, missing...)
    except TimeoutError:
        raise AssertionError(f"{op} {name} waited more than {OP_BOUND_S} s") from None


async def _scenario(path: Path, ops: list[tuple[str, str, int]]) -> None:
    data_dir = DataDir.open(str(path))
    broker = BrokerService(data_dir, Settings(compaction_monitor_interval_seconds=0))
    broker.loop = asyncio.get_running_loop()
    world = _World(broker)
    try:
        broker.partitioned.create(broker.admin, PARENT, 2)
        await asyncio.gather(*(_run_op(world, op, name, index, delay)
                               for index, (op, name, delay) in enumerate(ops)))
        await asyncio.wait_for(broker.settle_loads(), OP_BOUND_S)
    finally:
        await asyncio.wait_for(broker.stop(), OP_BOUND_S)
        data_dir.close()
    data_dir = DataDir.open(str(path))
    broker = BrokerService(data_dir, Settings(compaction_monitor_interval_seconds=0))
    broker.loop = asyncio.get_running_loop()
    try:
        for name, position, value in world.acked:
            topic = await broker.load_topic(name, create=False)
            read = topic.ledger.read_entries(position, 1)
            assert read and read[0].data == _entry(value), f"{name}: acknowledged append at {position} forgotten"
        for name in TOPICS:
            if not data_dir.metadata.topic_exists(name):
                assert broker.cursors.list(name) == [], f"{name}: deleted, yet cursors are left"
    finally:
        await broker.stop()
        data_dir.close()


_ops = st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(TOPICS), st.integers(0, 6)), min_size=2, max_size=12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_random_interleavings_of_the_topic_lifecycle_keep_every_invariant(ops: list[tuple[str, str, int]]) -> None:
    with tempfile.TemporaryDirectory() as path:
        asyncio.run(_scenario(Path(path), ops))
