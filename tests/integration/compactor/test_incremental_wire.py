"""The real pulsar-client over a view built by incremental runs (issue 30, point 2).

A topic is produced in batches and single messages, compacted, updated and partly deleted,
and compacted again: the second run appends a ledger and marks dead what it superseded in
the first one (whole entries, and slots of batches that keep others). Every reader question
must be answered as over a full rewrite: read-compacted readers (the batch slot masks hide
the dead slots), a read-compacted consumer, seek by message id and by publish time,
``get_last_message_id``, a TableView, internal stats; and a full rewrite of the same topic
afterwards gives readers the same messages.
"""

from __future__ import annotations

import threading
from typing import Any

import pulsar
import pytest

from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import read_available, unique_topic, wait_until

pytestmark = pytest.mark.integration

KEYS = [f"k{index}" for index in range(12)]

Sent = tuple[tuple[int, int, int], str, bytes | None]


def send_all(producer: Any, messages: list[tuple[str, bytes | None]]) -> list[Sent]:
    """Send ``messages`` (key, value; None: a tombstone) asynchronously and return each one's
    id (ledger, entry, batch index), key and value, once all are persisted."""
    ids: list[Any] = [None] * len(messages)
    done = threading.Event()
    left = [len(messages)]
    lock = threading.Lock()

    def sent(at: int) -> Any:
        def callback(result: Any, message_id: Any) -> None:
            assert result == pulsar.Result.Ok
            ids[at] = message_id
            with lock:
                left[0] -= 1
                if not left[0]:
                    done.set()
        return callback

    for at, (key, value) in enumerate(messages):
        producer.send_async(value if value is not None else b"", sent(at), partition_key=key)
    producer.flush()
    assert done.wait(30)
    return [((m.ledger_id(), m.entry_id(), max(m.batch_index(), -1) if m.batch_index() >= 0 else -1), key, value)
            for m, (key, value) in zip(ids, messages, strict=True)]


def latest(sent: list[Sent]) -> list[Sent]:
    """What a full rewrite keeps: each key's last message unless it is a tombstone, in id order."""
    last: dict[str, Sent] = {}
    for message in sent:
        last[message[1]] = message
    return sorted((m for m in last.values() if m[2]), key=lambda m: m[0])


def identity(message: Any) -> tuple[tuple[int, int, int], str, bytes]:
    message_id = message.message_id()
    batch = message_id.batch_index()
    return (message_id.ledger_id(), message_id.entry_id(), batch if batch >= 0 else -1), \
        message.partition_key(), message.data()


def survivors(client: Any, topic: str, start: Any = pulsar.MessageId.earliest, **options: Any) -> list[Any]:
    reader = client.create_reader(topic, start, is_read_compacted=True, **options)
    try:
        return read_available(reader)
    finally:
        reader.close()


def assert_reads(client: Any, topic: str, expected: list[Sent]) -> list[Any]:
    """Every reader question over the view answered as over a full rewrite."""
    got = survivors(client, topic)
    assert [identity(m) for m in got] == expected
    middle = len(got) // 2
    inclusive = survivors(client, topic, got[middle].message_id(), start_message_id_inclusive=True)
    assert [identity(m) for m in inclusive] == expected[middle:]
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    try:
        at = got[middle].publish_timestamp()
        reader.seek(at)
        assert [identity(m) for m in read_available(reader)] == [
            identity(m) for m in got if m.publish_timestamp() >= at]
    finally:
        reader.close()
    consumer = client.subscribe(topic, "compacted", is_read_compacted=True,
                                initial_position=pulsar.InitialPosition.Earliest)
    try:
        received = [identity(consumer.receive(5000)) for _ in expected]
        assert received == expected
        last = consumer.get_last_message_id()
        assert (last.ledger_id(), last.entry_id()) == expected[-1][0][:2]
    finally:
        consumer.close()
    table = client.create_table_view(topic)
    try:
        wait_until(lambda: len(table) == len(expected), "the table view")
        assert {key: table.get(key) for _, key, _ in expected} == {key: value for _, key, value in expected}
    finally:
        table.close()
    return got


def test_readers_get_from_an_incremental_view_what_a_full_rewrite_gives(broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("incremental-view")
    hold = client.subscribe(topic, "hold")  # keeps the raw ledgers: seek by time searches them
    batched = client.create_producer(topic, batching_enabled=True, batching_max_messages=4,
                                     batching_max_publish_delay_ms=10_000)
    single = client.create_producer(topic, batching_enabled=False)
    sent = send_all(batched, [(KEYS[i % len(KEYS)], b"v1-%d" % i) for i in range(24)])
    sent += send_all(single, [(KEYS[i], b"s1-%d" % i) for i in range(0, 12, 5)])
    broker.compact(topic)
    # updates of a few keys (some slots of the first run's batches die, some whole entries),
    # and deletes
    sent += send_all(batched, [(KEYS[1], b"v2-1"), (KEYS[6], b"v2-6"), (KEYS[2], None), (KEYS[10], b"v2-10")])
    sent += send_all(single, [(KEYS[5], None), (KEYS[0], b"s2-0")])
    figures = broker.compact(topic)
    assert broker.service is not None
    view = broker.service.registry.loaded[topic].compacted.view
    assert view is not None and len(view.ledger_ids) == 2 and figures.dead_marked > 0
    first = view.marks_of(view.ledger_ids[0])
    assert first is not None and len(first.dead_slots) > 0  # batches that lost slots, kept others
    expected = latest(sent)
    assert_reads(client, topic, expected)
    stats = broker.service.admin.internal_stats(topic)["compactedLedger"]
    assert stats["entries"] == view.entries and sum(s["deadMessages"] for s in stats["ledgers"]) == first.dead_messages

    # the same after a restart (the marks come back from the manifest), and after a full rewrite
    hold.close()
    broker.restart()
    assert_reads(client, topic, expected)
    assert broker.service is not None
    more = client.create_producer(topic, batching_enabled=False)
    sent += send_all(more, [(KEYS[3], b"s3-3")])
    compacted = broker.service.get_topic(topic, create=False).compacted
    figures = broker.call(_rewrite(broker, compacted), timeout_s=120)
    view = compacted.view
    assert view is not None and view.ledger_ids == (figures.ledger_id,) and view.dead_messages == 0
    assert_reads(client, topic, latest(sent))


async def _rewrite(broker: BrokerHarness, compacted: Any) -> Any:
    """A full rewrite (``rewrite=True``) on a worker thread, as the broker runs its runs."""
    import asyncio

    assert broker.service is not None
    return await asyncio.to_thread(broker.service.compactor.compact, compacted, rewrite=True)
