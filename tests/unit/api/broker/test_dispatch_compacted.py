"""A read-compacted subscription dispatches through its ``CompactedReader``.

A real managed ledger, compacted view and cursor; the consumer is in memory. Dispatch
rounds advance the reader's index (the view is searched once), compacted batches carry the
reader's mask, and batch-index acks are resolved by the reader.
"""

from __future__ import annotations

import pytest

from api.broker.dispatch import Consumer, Delivery, Subscription, SubType
from compactor.runs.runner import Compactor
from compactor.view.reader import CompactedReader
from compactor.view.topic import CompactedTopic
from compactor.view.view import CompactedView
from cursor.cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger import ManagedLedger, MemoryLedgerStore, MetadataStore
from ledger.position import Position
from tests.unit.compactor.scenarios.support import batch, message

TOPIC = "persistent://public/default/dispatch-compacted"


class _Consumer(Consumer):
    def __init__(self) -> None:
        super().__init__(1, "c")
        self.received: list[Delivery] = []

    def send(self, delivery: Delivery) -> None:
        self.received.append(delivery)


def _subscription(*datas: bytes) -> tuple[list[Position], Subscription]:
    ledger = ManagedLedger.open(TOPIC, MemoryLedgerStore(), MetadataStore(":memory:"))
    positions = [ledger.append(data).result(timeout=10) for data in datas]
    cursors = CursorStore(ledger.metadata.database)
    topic = CompactedTopic.restore(ledger, cursors)
    Compactor().compact(topic)
    cursor = ManagedCursor.open_durable(ledger, "sub", InitialPosition.EARLIEST, store=cursors)
    subscription = Subscription("sub", cursor, topic, SubType.EXCLUSIVE, read_compacted=True,
                                first_read_from_earliest=True)
    return positions, subscription


def test_dispatch_rounds_advance_the_readers_index_instead_of_searching_the_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    positions, subscription = _subscription(*(message(f"k{i}", b"v") for i in range(12)))
    assert isinstance(subscription.reader, CompactedReader)
    subscription.seek(positions[2])  # a search, once
    calls: list[Position] = []
    real = CompactedView.find_start
    monkeypatch.setattr(CompactedView, "find_start", lambda view, p: calls.append(p) or real(view, p))
    consumer = _Consumer()
    subscription.add_consumer(consumer, SubType.EXCLUSIVE)
    for _ in range(10):
        subscription.flow(consumer, 1)  # one entry per round
    assert [d.position for d in consumer.received] == positions[2:]
    assert calls == [positions[2]]


def test_a_compacted_batch_carries_the_readers_mask_and_a_batch_index_ack_of_what_was_sent_acknowledges_it() -> None:
    positions, subscription = _subscription(batch([("a", b"1"), ("b", b"1"), ("a", b"2")]), message("c", b"1"))
    consumer = _Consumer()
    subscription.add_consumer(consumer, SubType.EXCLUSIVE)
    subscription.flow(consumer, 10)
    assert [(d.position, d.ack_set) for d in consumer.received] == [(positions[0], (0b110,)), (positions[1], ())]
    slot = positions[0].with_batch_index(2)
    subscription.acknowledge_message_ids([(slot, [0b100])], cumulative=False)  # slot 2 left: ignored
    assert not subscription.cursor.is_acknowledged(positions[0])
    subscription.acknowledge_message_ids([(slot, [0b001])], cumulative=False)  # only the hidden slot left
    assert subscription.cursor.is_acknowledged(positions[0])
    assert subscription.reader.ack_set(positions[0]) == ()
