"""Dispatch goes in bounded rounds, whatever permits a consumer grants.

A real managed ledger and cursor; the consumer is in memory. One ``dispatch`` call sends
at most one round (entries and bytes), the rest follows on later loop iterations, and a
consumer that is not writable gets nothing until it dispatches again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from api.broker import dispatch
from api.broker.dispatch import Consumer, Delivery, Subscription, SubType
from compactor.view.topic import CompactedTopic
from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger import DataDir, ManagedLedger
from ledger.storage.base import SyncPolicy
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/rounds"


class _Consumer(Consumer):
    def __init__(self) -> None:
        super().__init__(1, "c")
        self.received: list[Delivery] = []
        self.open = True

    @property
    def writable(self) -> bool:
        return self.open

    def send(self, delivery: Delivery) -> None:
        self.received.append(delivery)


def _subscription(tmp_path: Path, entries: int, value_bytes: int, sub_type: SubType) -> tuple[DataDir, Subscription]:
    data_dir = DataDir.open(str(tmp_path), sync=SyncPolicy.NONE)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    futures = [ledger.append(encode_entry(metadata, b"v" * value_bytes, with_checksum=False)) for _ in range(entries)]
    for future in futures:
        future.result(timeout=30)
    cursors = CursorStore(data_dir.database)
    cursor = ManagedCursor.open_durable(ledger, "sub", InitialPosition.EARLIEST, store=cursors)
    return data_dir, Subscription("sub", cursor, CompactedTopic.restore(ledger, cursors), sub_type)


@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.SHARED])
@pytest.mark.parametrize(("entries", "value_bytes", "round_cap"), [
    (3000, 10, "entries"),  # small entries: the round's entry count binds
    (60, 300 * 1024, "bytes"),  # large entries: the round's bytes bind
])
def test_one_dispatch_sends_one_bounded_round_and_the_rest_follows(
    tmp_path: Path, sub_type: SubType, entries: int, value_bytes: int, round_cap: str,
) -> None:
    data_dir, subscription = _subscription(tmp_path, entries, value_bytes, sub_type)

    async def main() -> None:
        consumer = _Consumer()
        subscription.add_consumer(consumer, sub_type)
        subscription.flow(consumer, 2**32 - 1)
        first = consumer.received[:]
        if round_cap == "entries":
            assert len(first) == dispatch.DISPATCH_ROUND_ENTRIES_MAX
        else:
            # within the round's bytes, give or take the one entry that crossed it
            assert sum(len(d.data) for d in first) <= dispatch.DISPATCH_ROUND_BYTES_MAX + value_bytes + 100
            assert len(first) < entries
        async with asyncio.timeout(30):
            while len(consumer.received) < entries:
                await asyncio.sleep(0)
        assert [d.position for d in consumer.received] == sorted({d.position for d in consumer.received})

    try:
        asyncio.run(main())
    finally:
        data_dir.close()


def test_a_consumer_that_is_not_writable_gets_nothing_until_it_dispatches_again(tmp_path: Path) -> None:
    data_dir, subscription = _subscription(tmp_path, 50, 10, SubType.EXCLUSIVE)

    async def main() -> None:
        consumer = _Consumer()
        consumer.open = False
        subscription.add_consumer(consumer, SubType.EXCLUSIVE)
        subscription.flow(consumer, 1000)
        for _ in range(10):
            await asyncio.sleep(0)
        assert consumer.received == []
        consumer.open = True
        subscription.dispatch()  # what the connection's resume_writing does
        assert len(consumer.received) == 50

    try:
        asyncio.run(main())
    finally:
        data_dir.close()
