"""The real pulsar-client reads a compacted view of several ledgers as it reads one
(issue 13, point 1): read-compacted readers from the earliest, seek by message id into a
later ledger of the view, seek by publish time, ``get_last_message_id``, internal stats,
and the same after a restart, which restores the view from the manifest.

The view is made as a Spark run's phase two would: the broker's own compacted entries are
split into sealed compacted ledgers (one of them empty) and published with
``Compactor._publish`` in place of the one-ledger view a local run published.
"""

from __future__ import annotations

import itertools
from typing import Any

import pulsar
import pytest

from compactor.view.view import CompactedView, encode_compacted_entry
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import read_available, unique_topic

pytestmark = pytest.mark.integration

MESSAGES = 40
CUTS = (4, 4, 9)  # 13 survivors in four ledgers, the second one empty


def key_of(index: int) -> str:
    return f"k{index * 7 % 13}"  # the last write of each key lies anywhere in the second half


def produce(client: Any, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for index in range(MESSAGES):
        producer.send(b"v%d" % index, partition_key=key_of(index))
    producer.close()


def split_view(broker: BrokerHarness, topic: str) -> CompactedView:
    """Replace the topic's one-ledger view with the same entries in several ledgers."""
    assert broker.service is not None and broker.data_dir is not None
    compacted = broker.service.registry.loaded[topic].compacted
    view = compacted.view
    assert view is not None and len(view.ledger_ids) == 1
    entries = list(view.iter_all())
    ledger_ids = []
    for first, end in itertools.pairwise([0, *CUTS, len(entries)]):
        ledger_id = broker.data_dir.ledgers.create({"component": "compacted-ledger", "topic": topic})
        for entry in entries[first:end]:
            broker.data_dir.ledgers.append(ledger_id, encode_compacted_entry(entry)).result(timeout=10)
        broker.data_dir.ledgers.close(ledger_id)
        ledger_ids.append(ledger_id)
    return broker.service.compactor._publish(compacted, compacted.cursor, view.horizon, ledger_ids, view)


def survivors(client: Any, topic: str, start: Any = pulsar.MessageId.earliest, **options: Any) -> list[Any]:
    reader = client.create_reader(topic, start, is_read_compacted=True, **options)
    try:
        return read_available(reader)
    finally:
        reader.close()


def ids(messages: list[Any]) -> list[tuple[int, int]]:
    return [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in messages]


def assert_reads(client: Any, topic: str, expected: list[Any]) -> None:
    """Every reader question answered over the view as over the one-ledger view."""
    assert ids(survivors(client, topic)) == ids(expected)
    for middle in (5, 9, 12):  # into the third and fourth ledgers of the view
        inclusive = survivors(client, topic, expected[middle].message_id(), start_message_id_inclusive=True)
        assert ids(inclusive) == ids(expected[middle:])
        assert ids(survivors(client, topic, expected[middle].message_id())) == ids(expected[middle + 1:])
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    try:
        at = expected[7].publish_timestamp()
        reader.seek(at)
        assert ids(read_available(reader)) == ids([m for m in expected if m.publish_timestamp() >= at])
    finally:
        reader.close()
    consumer = client.subscribe(topic, "last-id", is_read_compacted=True)
    try:
        last = consumer.get_last_message_id()
        assert (last.ledger_id(), last.entry_id()) == ids(expected)[-1]
    finally:
        consumer.close()


def test_readers_seek_and_last_message_id_over_a_view_of_several_ledgers(broker: BrokerHarness, client: Any) -> None:
    topic = unique_topic("multi-ledger-view")
    hold = client.subscribe(topic, "hold")  # keeps the raw ledgers: seek by time searches them
    produce(client, topic)
    broker.compact(topic)
    one_ledger = survivors(client, topic)
    assert [m.data() for m in one_ledger] == [b"v%d" % i for i in range(MESSAGES)
                                              if all(key_of(j) != key_of(i) for j in range(i + 1, MESSAGES))]

    view = split_view(broker, topic)
    assert len(view.ledger_ids) == len(CUTS) + 1 and view.entries == len(one_ledger) == 13
    assert_reads(client, topic, one_ledger)
    assert broker.service is not None
    stats = broker.service.admin.internal_stats(topic)["compactedLedger"]
    assert stats["ledgerId"] == view.ledger_ids[0] and stats["entries"] == 13
    assert [(s["ledgerId"], s["entries"]) for s in stats["ledgers"]] == list(view.segments)

    hold.close()
    broker.restart()
    assert broker.service is not None
    restored = broker.service.get_topic(topic, create=False).compacted.view
    assert restored is not None and restored.ledger_ids == view.ledger_ids
    assert_reads(client, topic, one_ledger)
