"""The delay index: each deferred position comes out once, when due, in position order;
and a subscription reads on past delayed entries, however many there are."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.broker import dispatch
from api.broker.delayed import DelayedDeliveryTracker
from api.broker.dispatch import Consumer, Delivery, Subscription, SubType
from compactor.view.topic import CompactedTopic
from cursor.cursor import ManagedCursor
from cursor.store import CursorStore
from ledger import DataDir, ManagedLedger
from ledger.position import EARLIEST, Position
from ledger.storage.base import SyncPolicy
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(-2000, 5000)), max_size=40),
       st.lists(st.integers(0, 50), max_size=10), st.lists(st.integers(0, 6000), max_size=6))
def test_every_deferred_position_comes_out_once_when_due_and_in_order(
        deferrals: list[tuple[int, int]], acked: list[int], steps: list[int]) -> None:
    clock = _Clock()
    tracker = DelayedDeliveryTracker(lambda: None, clock)
    start_ms = tracker.now_ms()
    due: dict[Position, int] = {}
    for entry, offset_ms in deferrals:
        position = Position(1, entry)
        if tracker.defer(position, start_ms + offset_ms):
            due.setdefault(position, start_ms + offset_ms)
        else:
            assert offset_ms <= 0
    tracker.discard([Position(1, e) for e in acked])
    for e in acked:
        due.pop(Position(1, e), None)
    out: list[Position] = []
    for step in sorted(steps) + [6000]:
        clock.now = 1000.0 + step / 1000
        popped = tracker.pop_due()
        assert popped == sorted(popped)
        assert all(due[p] <= tracker.now_ms() for p in popped)
        out.extend(popped)
    assert sorted(out) == sorted(due) and len(out) == len(set(out))
    assert len(tracker) == 0


def test_the_timer_calls_back_when_the_earliest_is_due() -> None:
    async def main() -> None:
        fired = asyncio.Event()
        tracker = DelayedDeliveryTracker(fired.set)
        tracker.defer(Position(1, 2), tracker.now_ms() + 300)
        tracker.defer(Position(1, 1), tracker.now_ms() + 50)
        async with asyncio.timeout(5):
            await fired.wait()
        assert tracker.pop_due() == [Position(1, 1)]
        fired.clear()
        async with asyncio.timeout(5):
            await fired.wait()
        assert tracker.pop_due() == [Position(1, 2)]

    asyncio.run(main())


@pytest.mark.parametrize("sub_type", [SubType.SHARED, SubType.KEY_SHARED])
def test_more_delayed_entries_than_a_round_scans_never_hide_the_entry_after_them(
        tmp_path: Path, sub_type: SubType) -> None:
    data_dir = DataDir.open(str(tmp_path), sync=SyncPolicy.NONE)
    try:
        ledger = ManagedLedger.open("persistent://public/default/delayed", data_dir.ledgers, data_dir.metadata)
        later = int((time.time() + 3600) * 1000)
        count = dispatch.DISPATCH_ROUND_ENTRIES_MAX * 2 + 5
        futures = [ledger.append(encode_entry(pb.MessageMetadata(
            producer_name="p", sequence_id=n, publish_time=1, deliver_at_time=later), b"later", with_checksum=False))
            for n in range(count)]
        futures.append(ledger.append(encode_entry(
            pb.MessageMetadata(producer_name="p", sequence_id=count, publish_time=1), b"now", with_checksum=False)))
        for future in futures:
            future.result(timeout=30)
        cursor = ManagedCursor.open_non_durable(ledger, "sub", EARLIEST)
        subscription = Subscription("sub", cursor, CompactedTopic.restore(ledger, CursorStore(data_dir.database)),
                                    sub_type)

        async def main() -> list[Delivery]:
            consumer = _Consumer()
            subscription.add_consumer(consumer, sub_type)
            subscription.flow(consumer, 10)
            async with asyncio.timeout(30):
                while not consumer.received:
                    await asyncio.sleep(0)
            return consumer.received

        received = asyncio.run(main())
        assert [d.data.endswith(b"now") for d in received] == [True]
        assert subscription.delayed_count == count
    finally:
        data_dir.close()


class _Consumer(Consumer):
    def __init__(self) -> None:
        super().__init__(1, "c")
        self.received: list[Delivery] = []

    def send(self, delivery: Delivery) -> None:
        self.received.append(delivery)
