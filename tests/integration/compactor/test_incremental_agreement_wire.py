"""The real pulsar-client over incremental views gets the logical view the agreement
property checks (issue 30, point 4).

``tests/unit/compactor/test_incremental_agreement.py`` compares logical views read through
``CompactedReader`` in process. Here a few fixed histories (a derandomized Hypothesis: the
same ones every time) of produced rounds — keys from a small alphabet, tombstones (empty
values), key-less messages, batched and not — are sent by a real pulsar-client to a real
broker and compacted after each round by the broker's own (incremental) runs; after each
run, a read-compacted reader of the real client gets exactly the messages (ids, keys,
values) of the in-process logical view, which are those of a model of Pulsar's rule (each
key's last value, tombstones and key-less messages gone); after one more message, a full
rewrite (``rewrite=True``) gives the client the same again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pulsar
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from compactor.view.topic import CompactedTopic
from message.entry import is_marker, iter_messages, parse_entry
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import read_available, unique_topic
from tests.unit.compactor.history import read_compacted

pytestmark = pytest.mark.integration

FIXED = settings(max_examples=3, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
KEYS = ("k0", "k1", "k2", "k3")
Sent = tuple[str | None, bytes]
Seen = tuple[tuple[int, int, int], str | None, bytes]

messages = st.tuples(st.sampled_from((*KEYS, None)), st.one_of(st.just(b""), st.binary(min_size=1, max_size=6)))
rounds = st.lists(st.tuples(st.booleans(), st.lists(messages, min_size=2, max_size=10)), min_size=2, max_size=3)
"""Rounds of (batched, messages); an empty value with a key is a tombstone."""


def send_round(client: Any, topic: str, batched: bool, sent: list[Sent]) -> None:
    producer = client.create_producer(topic, batching_enabled=batched, batching_max_messages=4,
                                      batching_max_publish_delay_ms=10_000)
    try:
        for key, value in sent:
            options = {} if key is None else {"partition_key": key}
            producer.send_async(value, None, **options)
        producer.flush()
    finally:
        producer.close()


def client_view(client: Any, topic: str) -> list[Seen]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    try:
        got = read_available(reader, limit=1000)
    finally:
        reader.close()
    seen = []
    for message in got:
        message_id = message.message_id()
        batch = message_id.batch_index()
        key = message.partition_key() or None
        seen.append(((message_id.ledger_id(), message_id.entry_id(), batch if batch >= 0 else -1), key,
                     message.data()))
    return seen


def process_view(topic: CompactedTopic) -> list[Seen]:
    """The in-process logical view (``CompactedReader`` from the earliest message) as the
    client presents it: each delivered message's id, key and value."""
    seen = []
    for entry in read_compacted(topic):
        parsed = parse_entry(entry.data)
        if is_marker(parsed.metadata):
            continue
        for message in iter_messages(parsed):
            if message.compacted_out or (entry.batch_size and message.batch_index not in entry.surviving):
                continue
            position = entry.position
            seen.append(((position.ledger_id, position.entry_id, message.batch_index), message.key or None,
                         bytes(message.payload)))
    return seen


def latest(sent: list[Sent]) -> list[tuple[str, bytes]]:
    """Pulsar's rule, as a model: each key's last value unless empty (a tombstone), in the
    order of those last writes; key-less messages dropped."""
    last: dict[str, tuple[int, bytes]] = {}
    for order, (key, value) in enumerate(sent):
        if key is not None:
            last[key] = (order, value)
    return [(key, value) for key, (_, value) in sorted(last.items(), key=lambda item: item[1][0]) if value]


@FIXED
@given(rounds)
def test_a_real_reader_gets_the_logical_view_of_every_incremental_run(
    broker: BrokerHarness, client: Any, history: list[tuple[bool, list[Sent]]],
) -> None:
    note(f"history: {history!r}")  # Hypothesis prints the argument blank
    topic = unique_topic("incremental-agreement")
    everything: list[Sent] = []
    dead_marked = 0
    assert broker.service is not None
    for batched, sent in history:
        sent = [*sent, ("k0", b"last")]  # k0 lives on into each next round
        send_round(client, topic, batched, sent)
        everything += sent
        figures = broker.compact(topic)
        dead_marked += figures.dead_marked
        compacted = broker.service.registry.loaded[topic].compacted
        seen = client_view(client, topic)
        assert seen == process_view(compacted)
        assert [(key, value) for _, key, value in seen] == latest(everything)
    assert dead_marked > 0  # the runs were incremental: later rounds superseded older ledgers' data

    send_round(client, topic, False, [("k1", b"tail")])
    everything.append(("k1", b"tail"))
    figures = broker.call(asyncio.to_thread(broker.service.compactor.compact, compacted, rewrite=True), timeout_s=120)
    assert compacted.view is not None and compacted.view.ledger_ids == (figures.ledger_id,)
    seen = client_view(client, topic)
    assert seen == process_view(compacted)
    assert [(key, value) for _, key, value in seen] == latest(everything)
