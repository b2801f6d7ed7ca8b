"""Acknowledgements persist on a bounded schedule, and kill -9 loses only the window.

A real ``compactd serve`` (default ``--managed-ledger-mark-delete-rate-limit``: one persist
a second per cursor) and the real client: a consumer acknowledges messages individually,
leaving some unacknowledged. The first half of its acks must reach the data dir within the
schedule's bound (read from ``metadata.db`` while the broker runs); then it acknowledges
the rest and the broker is killed with SIGKILL at once. What the data dir holds after the
kill decides what comes back: the restarted broker delivers again exactly the messages the
persisted cursor state does not cover — every unacknowledged one (no loss) and the acks
after the last persist (the documented at-least-once window), and nothing acknowledged
before it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cursor.store import CursorRecord, CursorStore
from ledger.database import Database
from tests.integration.wire.helpers import RECEIVE_MS, drain, unique_topic
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
MESSAGES = 600
SUB = "acks"
PERSIST_BOUND_S = 10.0  # one persist interval (1 s) plus the client's 100 ms ack grouping, with room
POLL_S = 0.05

Entry = tuple[int, int]


def _unacked(index: int) -> bool:
    return index % 7 == 3


def _persisted(data_dir: Path, topic: str) -> CursorRecord | None:
    """The subscription's cursor state in the data dir (a read-only look; WAL lets it read
    while the broker writes, and after a kill)."""
    database = Database(str(data_dir / "metadata.db"), read_only=True)
    try:
        return CursorStore(database).load_persisted(topic, SUB)
    finally:
        database.close()


def _covered(record: CursorRecord | None, entries: set[Entry]) -> set[Entry]:
    """The entries that ``record`` counts as acknowledged."""
    if record is None:
        return set()
    md = record.mark_delete_position
    return {(ledger_id, entry_id) for ledger_id, entry_id in entries
            if (ledger_id, entry_id) <= (md.ledger_id, md.entry_id)
            or any(ledger_id == lid and first <= entry_id <= last for lid, first, last in record.individually_deleted)}


def _entry(message: Any) -> Entry:
    return message.message_id().ledger_id(), message.message_id().entry_id()


def _wait_for_backlog(serve: ServeProcess, topic: str, backlog: int) -> None:
    """Until the broker has applied the acks in memory (its backlog, over REST, is
    ``backlog``): the client groups acknowledgements for 100 ms before it sends them."""
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/stats"
    deadline = time.monotonic() + PERSIST_BOUND_S
    with httpx.Client(base_url=serve.http_url, timeout=10) as http:
        while http.get(path).json()["subscriptions"][SUB]["msgBacklog"] != backlog:
            assert time.monotonic() < deadline, f"the broker's backlog did not reach {backlog}"
            time.sleep(POLL_S)


@pytest.mark.slow
def test_acks_persisted_before_a_kill_are_never_redelivered_and_no_unacked_message_is_lost(tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    topic = unique_topic("ack-persistence")
    serve = ServeProcess(data_dir, log_path)
    try:
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        try:
            consumer = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(MESSAGES):
                producer.send_async(b"m%d" % i, None)
            producer.flush()
            received = [consumer.receive(RECEIVE_MS) for _ in range(MESSAGES)]
            index_of = {_entry(m): int(m.data()[1:]) for m in received}
            unacked = {e for e, i in index_of.items() if _unacked(i)}
            first_half = {e for e, i in index_of.items() if i < MESSAGES // 2 and not _unacked(i)}
            for message in received:
                if _entry(message) in first_half:
                    consumer.acknowledge(message)
            deadline = time.monotonic() + PERSIST_BOUND_S
            while not first_half <= _covered(_persisted(data_dir, topic), set(index_of)):
                assert time.monotonic() < deadline, "the first acks were not persisted within the bound"
                time.sleep(POLL_S)
            for message in received:
                if int(message.data()[1:]) >= MESSAGES // 2 and not _unacked(int(message.data()[1:])):
                    consumer.acknowledge(message)
            _wait_for_backlog(serve, topic, len(unacked))  # applied in memory; then killed at once
        finally:
            serve.kill()
            client.close()
        persisted = _covered(_persisted(data_dir, topic), set(index_of))
        assert first_half <= persisted
        assert not persisted & unacked, "an unacknowledged message was persisted as acknowledged"

        serve = ServeProcess(data_dir, log_path)
        client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
        try:
            consumer = client.subscribe(topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
            redelivered = [_entry(m) for m in drain(consumer, silence_ms=1000)]
        finally:
            client.close()
        assert len(redelivered) == len(set(redelivered))
        assert set(redelivered) == set(index_of) - persisted  # the window and the unacked, nothing else
        assert unacked <= set(redelivered)
    finally:
        assert serve.terminate() == 0, log_path.read_text()


@pytest.mark.slow
def test_a_clean_stop_persists_every_ack(tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "serve.log"
    topic = unique_topic("ack-clean-stop")
    serve = ServeProcess(data_dir, log_path, "--managed-ledger-mark-delete-rate-limit", "0.01")  # every 100 s
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
    try:
        consumer = client.subscribe(topic, SUB)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(50):
            producer.send(b"m%d" % i)
        received = [consumer.receive(RECEIVE_MS) for _ in range(50)]
        for message in received:
            if not _unacked(int(message.data()[1:])):
                consumer.acknowledge(message)
        expected = {_entry(m) for m in received if not _unacked(int(m.data()[1:]))}
        _wait_for_backlog(serve, topic, 50 - len(expected))
        assert not expected <= _covered(_persisted(data_dir, topic), expected)  # not yet persisted
    finally:
        client.close()
    assert serve.terminate() == 0, log_path.read_text()
    assert _covered(_persisted(data_dir, topic), {_entry(m) for m in received}) == expected
