"""The real pulsar-client against compactd: the basic round trip."""

from __future__ import annotations

from typing import Any

import pulsar

pytestmark = [__import__("pytest").mark.integration]


def test_produce_read_compact_and_read_compacted(broker: Any, client: Any) -> None:
    producer = client.create_producer("smoke")
    for i in range(10):
        producer.send(b"v%d" % i, partition_key=f"k{i % 3}")
    producer.send(None, partition_key="k0")
    reader = client.create_reader("smoke", pulsar.MessageId.earliest)
    raw = []
    while reader.has_message_available():
        raw.append(reader.read_next(5000).data())
    assert len(raw) == 11
    broker.compact("smoke")
    compacted = client.create_reader("smoke", pulsar.MessageId.earliest, is_read_compacted=True)
    seen = []
    while compacted.has_message_available():
        message = compacted.read_next(5000)
        seen.append((message.partition_key(), message.data()))
    assert seen == [("k1", b"v7"), ("k2", b"v8")]
