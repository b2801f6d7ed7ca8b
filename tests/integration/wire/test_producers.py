"""Producers with the real client: names, ProducerBusy, and the SEND failure path.

* Names the broker assigns never repeat on a data dir, across restarts (Pulsar's
  ``cluster-instance-counter`` form), so with de-duplication on a fresh producer is never
  taken for an earlier one.
* A name is held by one producer of a topic: a second one is refused with ProducerBusy
  while the holder's connection is alive; a producer whose connection dropped, or whose
  holder no longer answers a PING, takes its name again.
* An append that fails answers SEND_ERROR: the client reconnects and sends again, and the
  message is stored once, with de-duplication on or off.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from api.wire import connection, producing
from ledger.errors import LedgerIOError
from ledger.storage import file as file_store
from ledger.storage import file_io
from ledger.storage.faulty import FaultyLedgerStore
from message.proto import pulsar_api_pb2 as pb
from tests.integration.wire.helpers import unique_topic
from tests.integration.wire.test_robustness import _Raw
from tests.unit.ledger.test_managed_ledger_failures import FullDisk

pulsar = pytest.importorskip("pulsar")

NAME = re.compile(r"standalone-(\d+)-(\d+)")


def _read_all(client: Any, topic: str) -> list[Any]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(5000))
    reader.close()
    return out


def _set_deduplication(broker: Any, enabled: bool) -> None:
    async def apply() -> None:
        await broker.service.admin.set_policy("public/default", "deduplicationEnabled", enabled)
    broker.call(apply())


def _close_every_connection(broker: Any) -> None:
    async def close() -> None:
        for each in list(broker.service.connections):
            each.close()
    broker.call(close())


def _new_client(broker: Any) -> Any:
    return pulsar.Client(broker.url, operation_timeout_seconds=10,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def test_broker_assigned_names_never_repeat_across_restarts(broker: Any) -> None:
    topic = unique_topic("names")
    names = []
    for _ in range(3):
        client = _new_client(broker)
        names += [client.create_producer(topic).producer_name() for _ in range(2)]
        client.close()
        broker.restart()
    assert len(set(names)) == len(names), names
    instances = [int(NAME.fullmatch(name).group(1)) for name in names]  # type: ignore[union-attr]
    assert instances[0] == instances[1] < instances[2] == instances[3] < instances[4] == instances[5]


def test_fresh_producers_after_restarts_lose_nothing_with_deduplication_on(broker: Any) -> None:
    """The issue's reproduction: with de-duplication on, fresh producers after each restart
    got a reused name and their first messages were acknowledged -1:-1 and never stored."""
    _set_deduplication(broker, True)
    topic = unique_topic("fresh")
    receipts: dict[bytes, str] = {}
    for round_ in range(3):
        client = _new_client(broker)
        producer = client.create_producer(topic)
        for i in range(10):
            payload = b"r%d-%d" % (round_, i)
            receipts[payload] = str(producer.send(payload))
        client.close()
        broker.restart()
    client = _new_client(broker)
    stored = {m.data(): str(m.message_id()) for m in _read_all(client, topic)}
    client.close()
    assert stored == receipts


def test_a_second_producer_with_a_connected_name_is_refused_with_producer_busy(broker: Any) -> None:
    topic = unique_topic("busy")
    first, second = _new_client(broker), _new_client(broker)
    try:
        holder = first.create_producer(topic, producer_name="same")
        with pytest.raises(pulsar.ProducerBusy):
            second.create_producer(topic, producer_name="same")
        holder.send(b"still mine")
        holder.close()
        second.create_producer(topic, producer_name="same").send(b"now mine")  # released by close
    finally:
        first.close()
        second.close()


def test_a_producer_whose_connection_dropped_takes_its_name_again(broker: Any) -> None:
    topic = unique_topic("reconnect")
    client, other = _new_client(broker), _new_client(broker)
    try:
        producer = client.create_producer(topic, producer_name="mine")
        producer.send(b"before")
        _close_every_connection(broker)  # the client reconnects and re-creates its producer
        producer.send(b"after")
        with pytest.raises(pulsar.ProducerBusy):
            other.create_producer(topic, producer_name="mine")
    finally:
        client.close()
        other.close()
    assert [m.data() for m in _read_all(_new_client(broker), topic)] == [b"before", b"after"]


def test_a_holder_that_no_longer_answers_loses_its_name_after_a_liveness_check(
        broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producing, "LIVENESS_TIMEOUT_S", 0.5)
    topic = unique_topic("dead-holder")
    raw = _Raw(broker.port)
    answer = raw.request(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=pb.CommandProducer(
        topic=topic, producer_id=1, request_id=1, producer_name="held")))
    assert answer.type == pb.BaseCommand.PRODUCER_SUCCESS
    # raw now stays silent: it neither reads nor answers the broker's PING
    client = _new_client(broker)
    try:
        started = time.monotonic()
        client.create_producer(topic, producer_name="held").send(b"taken over")
        assert time.monotonic() - started >= 0.5
        assert raw.wait_closed() in ("eof", "reset")
    finally:
        client.close()
        raw.close()


@pytest.mark.parametrize("deduplication", [False, True], ids=["dedup-off", "dedup-on"])
def test_a_failed_append_answers_send_error_and_every_send_is_stored_once_in_order(
        broker: Any, deduplication: bool) -> None:
    """One append fails while later sends of the same producer are already on their way:
    those are refused too (the producer's session failed), the client reconnects and sends
    them all again, and each is stored once, in order, where its receipt says — with
    de-duplication on, the failed one is never answered as a duplicate of nothing."""
    _set_deduplication(broker, deduplication)
    faulty = FaultyLedgerStore(broker.data_dir.ledgers)
    broker.service.data_dir.ledgers = faulty  # topics loaded from now on append through it
    topic = unique_topic("send-error")
    client = _new_client(broker)
    done: dict[bytes, Any] = {}
    try:
        producer = client.create_producer(topic, send_timeout_millis=20_000, batching_enabled=False)
        producer.send(b"m0")
        faulty.fail_on("append", error=LedgerIOError("No space left on device"))
        _send_async(producer, [b"m%d" % i for i in range(1, 6)], done)  # pipelined: m2..m5 go before m1's answer
        _until(lambda: len(done) == 5, "the sends did not all end")
    finally:
        client.close()
    assert all(result == pulsar.Result.Ok for result, _ in done.values()), done
    stored = _read_all(_new_client(broker), topic)
    assert [m.data() for m in stored] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert {m.data(): str(m.message_id()) for m in stored[1:]} == {p: i for p, (_, i) in done.items()}
    assert faulty.calls["append"] >= 7  # m0, the failed m1, then m1..m5 again


@pytest.mark.parametrize("deduplication", [False, True], ids=["dedup-off", "dedup-on"])
def test_a_full_disk_fails_sends_and_the_topic_recovers_by_itself_once_space_frees(
        broker: Any, monkeypatch: pytest.MonkeyPatch, deduplication: bool) -> None:
    """The disk fills mid-write (ENOSPC on write and sync, at the OS calls of the ledger
    files): sends answer SEND_ERROR and the client keeps re-sending; once space frees the
    same topic takes them, with no restart, each stored once where its receipt says."""
    _set_deduplication(broker, deduplication)
    short_roll_over_retry(broker, monkeypatch)
    disk = FullDisk()
    monkeypatch.setattr(file_store, "os", disk)
    monkeypatch.setattr(file_io, "os", disk)  # the store's plain file operations
    topic = unique_topic("full-disk")
    client = _new_client(broker)
    try:
        done = send_through_a_full_disk(client, disk, topic)
    finally:
        client.close()
    stored = _read_all(_new_client(broker), topic)
    assert [m.data() for m in stored] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"after"]
    assert {m.data(): str(m.message_id()) for m in stored[1:6]} == {p: i for p, (_, i) in done.items()}


def short_roll_over_retry(broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Topics loaded from now on try a failed roll-over again after 200 ms, not 10 s: the
    full-disk tests wait for the topic to recover, not for the back-off."""
    monkeypatch.setattr(broker.service, "ledger_config",
                        dataclasses.replace(broker.service.ledger_config, roll_over_retry_ms=200))


def send_through_a_full_disk(client: Any, disk: FullDisk, topic: str,
                             watch: Callable[[bool], None] = lambda on: None) -> dict[bytes, Any]:
    """On ``topic``: m0 sent; then m1..m5 sent while ``disk`` is full (none acknowledged);
    then space frees and all five go through; then "after" is sent. ``watch(True)`` and
    ``watch(False)`` frame what follows m0. Returns m1..m5's (result, message id)."""
    done: dict[bytes, Any] = {}
    producer = client.create_producer(topic, send_timeout_millis=0, batching_enabled=False)
    producer.send(b"m0")
    watch(True)
    disk.full = True
    _send_async(producer, [b"m%d" % i for i in range(1, 6)], done)
    _until(lambda: disk.refused >= 3, "no write reached the full disk")
    assert done == {}  # nothing is acknowledged while the disk is full
    disk.full = False
    _until(lambda: len(done) == 5, "the sends did not go through once space freed")
    assert all(result == pulsar.Result.Ok for result, _ in done.values())
    producer.send(b"after")
    watch(False)
    return done


def _send_async(producer: Any, payloads: list[bytes], done: dict[bytes, Any]) -> None:
    """Send each payload without waiting; ``done[payload]`` becomes (result, message id)."""
    for payload in payloads:
        producer.send_async(payload, lambda result, message_id, payload=payload: done.update(
            {payload: (result, str(message_id))}))


def _until(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_connection_closed_while_its_peer_does_not_read_is_released(
        broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker closes a connection (here: a malformed frame) whose peer stopped reading
    with megabytes still unsent: the connection is dropped after a bounded flush, so its
    producer name, its consumers' messages and its buffers are released."""
    monkeypatch.setattr(connection, "CLOSE_FLUSH_S", 0.5)
    topic = unique_topic("stuck")
    client = _new_client(broker)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(250):  # ~16 MB: more than the kernel's socket buffers take
            producer.send_async(bytes(64 * 1024), lambda result, message_id: None)
        producer.flush()
        raw = _Raw(broker.port)
        raw.request(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=pb.CommandProducer(
            topic=topic, producer_id=1, request_id=1, producer_name="held")))
        raw.request(pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE, subscribe=pb.CommandSubscribe(
            topic=topic, subscription="s", subType=pb.CommandSubscribe.Shared, consumer_id=1, request_id=2,
            initialPosition=pb.CommandSubscribe.Earliest)))
        raw.send(pb.BaseCommand(type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(consumer_id=1, messagePermits=1000)))
        address = raw.address
        _until(lambda: _unsent(broker, address) > 256 << 10, "the broker never filled the peer's buffers")
        raw.sock.sendall(b"\x00\x00\x00\x08\x00\x00\x00\x04\xff\xff\xff\xff")  # malformed: closes it
        _until(lambda: _unsent(broker, address) < 0, "the connection was never released")
        client.create_producer(topic, producer_name="held").send(b"the name is free")
        raw.close()
    finally:
        client.close()


def _unsent(broker: Any, address: tuple[str, int]) -> int:
    """Bytes the broker still holds for the connection from ``address``; -1 once it is gone."""
    async def look() -> int:
        for each in broker.service.connections:
            if each.transport is not None and each.transport.get_extra_info("peername")[:2] == address:
                return int(each.transport.get_write_buffer_size())
        return -1
    result: int = broker.call(look())
    return result
