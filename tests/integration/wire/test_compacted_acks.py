"""Acknowledgements of a read-compacted subscription are durable (issue 10, point 5).

The real client against an in-process compactd: 500 messages over 20 keys (batched or
not) are compacted while the raw ledger is kept, so the compacted view holds the 20 latest
values at scattered raw positions whose predecessors nobody acknowledges. A read-compacted
consumer acknowledges what it received — individually (entry acks, or batch-index acks
with ``batch_index_ack_enabled``) or cumulatively — and goes away; the subscription's next
consumer, on the same broker or after a broker restart, gets nothing it acknowledged and
everything it did not, then the raw tail.

The client groups acknowledgements for 100 ms: instead of sleeping, each test polls the
broker's cursor (bounded) until it records every acknowledgement sent. Then the same once
the raw ledger is trimmed (a subscription created after, or one that consumed it whole),
including after a seek into the compacted view; last, the issue's scenario against a real
``compactd serve`` killed with SIGKILL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest

from cursor.store import CursorStore
from ledger.database import Database
from ledger.position import Position
from tests.integration.wire.helpers import RECEIVE_MS, drain, unique_topic
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.integration

KEYS = 20
MESSAGES = 500
BATCH = 10  # batched: the 20 latest values are in the last two batches
ACK_TIMEOUT_S = 10.0  # the client sends grouped acknowledgements within 100 ms
POLL_S = 0.02


def publish(client: Any, topic: str, *, batched: bool, start: int = 0, count: int = MESSAGES) -> None:
    """``count`` messages ``k{i % KEYS}: v{i}``; batched: batches of ``BATCH``, cut by flush."""
    producer = client.create_producer(topic, batching_enabled=batched, batching_max_messages=BATCH,
                                      batching_max_publish_delay_ms=60_000)
    try:
        for index in range(start, start + count):
            producer.send_async(f"v{index}".encode(), lambda _result, _message_id: None,
                                partition_key=f"k{index % KEYS}")
            if batched and index % BATCH == BATCH - 1:
                producer.flush()
        producer.flush()
    finally:
        producer.close()


def subscribe(client: Any, topic: str, batch_index_ack: bool) -> Any:
    return client.subscribe(topic, "sub", is_read_compacted=True, batch_index_ack_enabled=batch_index_ack,
                            initial_position=pulsar.InitialPosition.Earliest)


def receive(consumer: Any, count: int) -> list[Any]:
    return [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(count)]


def values(messages: list[Any]) -> list[str]:
    return [message.data().decode() for message in messages]


def wait_until(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + ACK_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {ACK_TIMEOUT_S} s")
        time.sleep(POLL_S)


def wait_acknowledged(broker: Any, topic: str, messages: list[Any]) -> None:
    """Poll until the broker's cursor holds every entry of ``messages`` as acknowledged."""
    positions = [Position(m.message_id().ledger_id(), m.message_id().entry_id()) for m in messages]

    def recorded() -> bool:
        cursor = broker.service.registry.loaded[topic].subscriptions["sub"].cursor
        return all(cursor.is_acknowledged(position) for position in positions)
    wait_until("the broker records the acknowledgements", recorded)


ACKS = [
    pytest.param("individual", False, id="individual"),
    pytest.param("individual", True, id="batch-index"),
    pytest.param("cumulative", False, id="cumulative"),
    pytest.param("cumulative", True, id="cumulative-batch-index"),
]
BATCHING = [pytest.param(False, id="no-batching"), pytest.param(True, id="batching")]
AGAIN = [pytest.param(False, id="resubscribe"), pytest.param(True, id="broker-restart")]


@pytest.mark.parametrize("restart", AGAIN)
@pytest.mark.parametrize("batched", BATCHING)
@pytest.mark.parametrize(("ack", "batch_index_ack"), ACKS)
def test_acknowledged_compacted_messages_are_not_delivered_again(
    broker: Any, client: Any, ack: str, batch_index_ack: bool, batched: bool, restart: bool,
) -> None:
    topic = unique_topic("compacted-acks")
    publish(client, topic, batched=batched)
    broker.compact(topic)
    latest = [f"v{index}" for index in range(MESSAGES - KEYS, MESSAGES)]

    consumer = subscribe(client, topic, batch_index_ack)
    got = receive(consumer, KEYS)
    assert values(got) == latest
    if ack == "cumulative":
        consumer.acknowledge_cumulative(got[-1])
    else:
        for message in got:
            consumer.acknowledge(message)
    wait_acknowledged(broker, topic, got)
    consumer.close()
    if restart:
        broker.restart()

    consumer = subscribe(client, topic, batch_index_ack)
    publish(client, topic, batched=batched, start=MESSAGES, count=3)
    assert values(drain(consumer)) == ["v500", "v501", "v502"]  # nothing acknowledged comes again
    consumer.close()


@pytest.mark.parametrize("restart", AGAIN)
@pytest.mark.parametrize("batched", BATCHING)
@pytest.mark.parametrize("batch_index_ack", [False, True], ids=["entry-acks", "batch-index"])
def test_unacknowledged_compacted_messages_are_delivered_again(
    broker: Any, client: Any, batch_index_ack: bool, batched: bool, restart: bool,
) -> None:
    """The first ten compacted messages and every other one after them acknowledged: the next
    consumer gets exactly the others — batched, the whole second batch, as a partly
    acknowledged batch is not acknowledged (Pulsar's default, batch-index acks are not
    persisted) — and, once it acknowledges those, a third gets nothing."""
    topic = unique_topic("compacted-unacked")
    publish(client, topic, batched=batched)
    broker.compact(topic)

    consumer = subscribe(client, topic, batch_index_ack)
    got = receive(consumer, KEYS)
    acked = got[:10] + got[10::2]
    for message in acked:
        consumer.acknowledge(message)
    wait_acknowledged(broker, topic, got[:10] if batched else acked)
    consumer.close()
    if restart:
        broker.restart()

    consumer = subscribe(client, topic, batch_index_ack)
    again = drain(consumer)
    assert values(again) == values(got[10:] if batched else got[11::2])
    for message in again:
        consumer.acknowledge(message)
    wait_acknowledged(broker, topic, again)
    consumer.close()
    if restart:
        broker.restart()

    consumer = subscribe(client, topic, batch_index_ack)
    assert drain(consumer) == []
    consumer.close()


@pytest.mark.parametrize("batched", BATCHING)
def test_a_consumed_compacted_view_is_not_delivered_again_once_its_raw_ledger_is_trimmed(
    broker: Any, client: Any, batched: bool,
) -> None:
    """A cumulative ack of the last message consumes the whole raw ledger: after a restart
    seals it, the next compaction run trims it, and the subscription's next consumer (its
    cursor recovered with the ledger gone) gets only what comes after — not the compacted
    view again, which is what a cursor that never acknowledged anything would get."""
    topic = unique_topic("compacted-trimmed")
    publish(client, topic, batched=batched)
    broker.compact(topic)
    consumer = subscribe(client, topic, False)
    got = receive(consumer, KEYS)
    consumer.acknowledge_cumulative(got[-1])
    wait_acknowledged(broker, topic, got)
    consumer.close()
    sealed = broker.service.registry.loaded[topic].ledger.ledger_list()[0].ledger_id
    broker.restart()
    broker.compact(topic)  # nothing new to compact; trims what every cursor consumed
    assert sealed not in [record.ledger_id for record in broker.service.registry.loaded[topic].ledger.ledger_list()]
    broker.restart()

    consumer = subscribe(client, topic, False)
    publish(client, topic, batched=batched, start=MESSAGES, count=3)
    assert values(drain(consumer)) == ["v500", "v501", "v502"]
    consumer.close()


def _compacted_then_trimmed(broker: Any, client: Any, batched: bool) -> str:
    """500 messages compacted, the raw ledger trimmed (no subscription held it), then one
    raw message v500: the topic a subscription created now reads."""
    topic = unique_topic("compacted-after-trim")
    publish(client, topic, batched=batched)
    broker.compact(topic)
    broker.restart()  # seals the ledger
    broker.compact(topic)  # trims it: only __compaction held it
    ledgers = broker.service.registry.loaded[topic].ledger.ledger_list()
    assert sum(record.entries for record in ledgers) == 0
    publish(client, topic, batched=batched, start=MESSAGES, count=1)
    return topic


def _again(broker: Any, client: Any, topic: str, restart: bool) -> Any:
    if restart:
        broker.restart()
    return subscribe(client, topic, True)


@pytest.mark.parametrize("restart", AGAIN)
@pytest.mark.parametrize("batched", BATCHING)
def test_individual_acks_of_compacted_messages_whose_raw_ledger_is_trimmed_are_kept(
    broker: Any, client: Any, batched: bool, restart: bool,
) -> None:
    """A subscription created after the raw ledger was trimmed (Pulsar's #21187 case):
    every other compacted message and the raw tail acknowledged; the next consumer gets
    exactly the compacted messages not acknowledged — none is lost because a later raw
    message was acknowledged — and once those are acknowledged, nothing."""
    topic = _compacted_then_trimmed(broker, client, batched)
    consumer = subscribe(client, topic, True)
    got = receive(consumer, KEYS + 1)
    assert values(got) == [f"v{index}" for index in range(MESSAGES - KEYS, MESSAGES + 1)]
    acked = got[:10] + got[10:KEYS:2] + got[KEYS:]
    for message in acked:
        consumer.acknowledge(message)
    wait_acknowledged(broker, topic, got[:10] + got[KEYS:] if batched else acked)
    consumer.close()

    consumer = _again(broker, client, topic, restart)
    again = drain(consumer)
    assert values(again) == values(got[10:KEYS] if batched else got[11:KEYS:2])
    for message in again:
        consumer.acknowledge(message)
    wait_acknowledged(broker, topic, again)
    consumer.close()

    consumer = _again(broker, client, topic, restart)
    publish(client, topic, batched=batched, start=MESSAGES + 1, count=1)
    assert values(drain(consumer)) == ["v501"]
    consumer.close()


@pytest.mark.parametrize("restart", AGAIN)
@pytest.mark.parametrize("batched", BATCHING)
def test_a_cumulative_ack_of_a_compacted_message_whose_raw_ledger_is_trimmed_is_kept(
    broker: Any, client: Any, batched: bool, restart: bool,
) -> None:
    topic = _compacted_then_trimmed(broker, client, batched)
    consumer = subscribe(client, topic, True)
    got = receive(consumer, KEYS + 1)
    consumer.acknowledge_cumulative(got[9])
    wait_acknowledged(broker, topic, got[:10])
    consumer.close()

    consumer = _again(broker, client, topic, restart)
    assert values(drain(consumer)) == values(got[10:])
    consumer.close()


def test_acks_after_a_seek_into_compacted_messages_whose_raw_ledger_is_trimmed_are_kept(
    broker: Any, client: Any,
) -> None:
    """A seek to a compacted message of a trimmed ledger marks what is before it consumed;
    acks from there on are kept: the next consumer gets what follows the last one, and the
    seek target, which the client drops itself (exclusive) and so never acknowledged."""
    topic = _compacted_then_trimmed(broker, client, False)
    consumer = subscribe(client, topic, True)
    got = receive(consumer, KEYS + 1)
    consumer.seek(got[5].message_id())
    after = receive(consumer, KEYS + 1 - 6)
    assert values(after) == values(got[6:])
    for message in after[:4]:
        consumer.acknowledge(message)
    wait_acknowledged(broker, topic, after[:4])
    consumer.close()

    consumer = subscribe(client, topic, True)
    assert values(drain(consumer)) == values(got[5:6] + got[10:])
    consumer.close()


# -- the scenario against a real ``compactd serve``, killed with SIGKILL ----------------


def _admin_url(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def _acked_runs(messages: list[Any]) -> str:
    """Pulsar's ``individuallyDeletedMessages`` for the (contiguous) entries of ``messages``."""
    ids = sorted({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in messages})
    (ledger_id, first), (_, last) = ids[0], ids[-1]
    assert len(ids) == last - first + 1
    return f"[({ledger_id}:{first - 1}..{ledger_id}:{last}]]"


def _persisted_runs(data_dir: Path, topic: str) -> str:
    """The subscription's acknowledged runs as persisted in the data dir (a read-only look
    while the broker runs), in internal stats' notation."""
    database = Database(str(data_dir / "metadata.db"), read_only=True)
    try:
        record = CursorStore(database).load_persisted(topic, "sub")
    finally:
        database.close()
    runs = record.individually_deleted if record is not None else ()
    return "[" + ", ".join(f"({lid}:{first - 1}..{lid}:{last}]" for lid, first, last in runs) + "]"


@pytest.mark.parametrize("batched", BATCHING)
def test_acks_of_a_read_compacted_consumer_survive_a_killed_compactd_serve(tmp_path: Path, batched: bool) -> None:
    """Issue 10: 500 messages over 20 keys, compacted over REST; a read-compacted consumer
    with batch-index acks acknowledges the 20 it gets; internal stats show the ranges;
    ``compactd serve`` is killed (SIGKILL) and started again on the same data dir: the
    subscription's next consumer gets only the messages published after."""
    topic = unique_topic("compacted-acks-serve")
    serve = ServeProcess(tmp_path / "data", tmp_path / "serve.log")
    try:
        with httpx.Client(base_url=serve.http_url, timeout=30) as http:
            client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10,
                                   logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
            try:
                publish(client, topic, batched=batched)
                assert http.put(_admin_url(topic) + "/compaction").status_code == 204
                wait_until("the compaction succeeds",
                           lambda: http.get(_admin_url(topic) + "/compaction").json()["status"] == "SUCCESS")
                consumer = subscribe(client, topic, True)
                got = receive(consumer, KEYS)
                for message in got:
                    consumer.acknowledge(message)
                expected = _acked_runs(got)
                wait_until("internal stats show the acks", lambda: http.get(_admin_url(topic) + "/internalStats")
                           .json()["cursors"]["sub"]["individuallyDeletedMessages"] == expected)
                # acks are persisted on a schedule (one persist a second): the kill comes after it
                wait_until("the acks are persisted", lambda: _persisted_runs(tmp_path / "data", topic) == expected)
            finally:
                client.close()
        serve.kill()
        serve = ServeProcess(tmp_path / "data", tmp_path / "serve.log")
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            consumer = subscribe(client, topic, True)
            publish(client, topic, batched=batched, start=MESSAGES, count=3)
            assert values(drain(consumer)) == ["v500", "v501", "v502"]
        finally:
            client.close()
    finally:
        serve.kill()
