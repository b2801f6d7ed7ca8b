"""De-duplication state: only real re-sends are duplicates, snapshots, replay after a crash."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.broker import dedup
from api.broker.dedup import (
    DEDUP_CURSOR,
    Deduplication,
    ProducerSession,
    Send,
    describe_send,
)
from cursor.store import CursorStore
from ledger import DataDir, ManagedLedger
from ledger.position import Position
from ledger.storage.record import scan
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/dedup"


def entry(producer: str, sequence_id: int, value: bytes = b"v", *, highest: int | None = None,
          publish_time: int = 1, chunk: tuple[int, int] | None = None) -> bytes:
    metadata = pb.MessageMetadata(producer_name=producer, sequence_id=sequence_id, publish_time=publish_time)
    if highest is not None:
        metadata.highest_sequence_id = highest
    if chunk is not None:
        metadata.uuid, metadata.chunk_id, metadata.num_chunks_from_msg = f"{producer}-{sequence_id}", *chunk
    return encode_entry(metadata, value, with_checksum=False)


class Log:
    """A managed ledger with its de-duplication state, sends made as the broker makes them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data_dir = DataDir.open(str(path))
        self.ledger = ManagedLedger.open(TOPIC, self.data_dir.ledgers, self.data_dir.metadata)
        self.cursors = CursorStore(self.data_dir.database)
        self.state = Deduplication(self.ledger, self.cursors)

    def send(self, session: ProducerSession, data: bytes, *, durable: bool = True) -> Future[Position]:
        """One send: a duplicate's answer, or the append (made durable in the state)."""
        metadata = pb.MessageMetadata()
        metadata.ParseFromString(data[4:4 + int.from_bytes(data[:4], "big")])
        highest = max(metadata.sequence_id, metadata.highest_sequence_id)
        send = describe_send(metadata.producer_name, metadata.sequence_id, highest, data)
        duplicate = self.state.find_duplicate(session, send)
        if duplicate is not None:
            return duplicate
        future = self.ledger.append(data)
        self.state.pushed_send(send, future)
        if durable:
            self.state.durable(send, future.result(timeout=10), future)
        return future

    def fail(self, session: ProducerSession, data: bytes) -> None:
        """One send whose append fails, as the broker settles it."""
        metadata = pb.MessageMetadata()
        metadata.ParseFromString(data[4:4 + int.from_bytes(data[:4], "big")])
        send = describe_send(metadata.producer_name, metadata.sequence_id, metadata.sequence_id, data)
        assert self.state.find_duplicate(session, send) is None
        failed: Future[Position] = Future()
        self.state.pushed_send(send, failed)
        failed.set_exception(OSError("write failed"))
        self.state.failed(send, failed)

    def stored(self) -> list[bytes]:
        end = self.ledger.last_confirmed_position()
        if end.entry_id < 0:
            return []
        return [e.data for e in self.ledger.read_entries(self.ledger.first_position(), 10_000, end=end)]

    def crash_and_reopen(self) -> None:
        """The process dies (no final snapshot) and the topic is loaded again."""
        self.data_dir.close()
        self.data_dir = DataDir.open(str(self.path))
        self.ledger = ManagedLedger.open(TOPIC, self.data_dir.ledgers, self.data_dir.metadata)
        self.cursors = CursorStore(self.data_dir.database)
        self.state = Deduplication(self.ledger, self.cursors)

    def close(self) -> None:
        self.data_dir.close()


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    instance = Log(tmp_path)
    yield instance
    instance.close()


def test_a_resend_in_a_new_session_is_answered_with_the_stored_position(log: Log) -> None:
    first = ProducerSession()
    positions = [log.send(first, entry("p", i, b"m%d" % i, publish_time=10)).result() for i in range(3)]
    again = ProducerSession()  # the client reconnected and re-sends what had no receipt
    assert log.send(again, entry("p", 1, b"m1", publish_time=10)).result() == positions[1]
    assert log.send(again, entry("p", 2, b"m2", publish_time=10)).result() == positions[2]
    assert log.stored() == [entry("p", i, b"m%d" % i, publish_time=10) for i in range(3)]
    assert log.state.last_sequence_id("p") == 2


def test_a_sequence_id_reused_within_a_session_is_a_new_message_and_is_stored(log: Log) -> None:
    """The client restarts its numbering after a reconnect when it never got a receipt:
    the re-sent messages come first, then new ones with the same sequence ids."""
    session = ProducerSession()
    resent = [log.send(session, entry("fresh", i, b"old%d" % i)).result() for i in range(3)]
    renumbered = [log.send(session, entry("fresh", i, b"new%d" % i)).result() for i in range(3)]
    assert len(set(resent + renumbered)) == 6
    assert len(log.stored()) == 6


def test_a_resend_stream_holding_a_reused_sequence_id_matches_each_original_once(log: Log) -> None:
    """Found by the property test below: after a renumbering, two stored messages share a
    sequence id; when the client re-sends both after the next crash, each is a duplicate."""
    session = ProducerSession()
    originals = [log.send(session, entry("p", 0, value)).result() for value in (b"m0", b"m1")]
    log.crash_and_reopen()
    again = ProducerSession()
    assert [log.send(again, entry("p", 0, value)).result() for value in (b"m0", b"m1")] == originals
    assert len(log.stored()) == 2


def test_the_same_message_sent_twice_in_a_session_is_stored_twice_and_each_resend_matches_one(log: Log) -> None:
    """Identical identity and content twice in one session: the second is a new message
    (a renumbered one that happens to match); a later re-send stream matches them in order."""
    session = ProducerSession()
    first, second = (log.send(session, entry("p", 0, b"same")).result() for _ in range(2))
    assert first != second and len(log.stored()) == 2
    again = ProducerSession()
    assert [log.send(again, entry("p", 0, b"same")).result() for _ in range(2)] == [first, second]
    assert log.send(again, entry("p", 0, b"same")).result() not in (first, second)  # a third is new
    assert len(log.stored()) == 3


def test_a_resend_whose_content_differs_is_stored(log: Log) -> None:
    log.send(ProducerSession(), entry("p", 0, b"one")).result()
    other = log.send(ProducerSession(), entry("p", 0, b"two")).result()
    assert log.stored()[-1] == entry("p", 0, b"two") and other.entry_id == 1


def test_a_resend_differing_only_in_publish_time_is_a_duplicate(log: Log) -> None:
    """An application re-sending after its own restart (Pulsar's use case) builds the
    message again: same sequence id and content, another publish time."""
    stored = log.send(ProducerSession(), entry("app", 7, b"row", publish_time=1)).result()
    assert log.send(ProducerSession(), entry("app", 7, b"row", publish_time=99)).result() == stored
    assert len(log.stored()) == 1


def test_a_resend_of_an_in_flight_entry_waits_for_it(log: Log) -> None:
    pending = log.send(ProducerSession(), entry("p", 0, b"x"), durable=False)
    answer = log.send(ProducerSession(), entry("p", 0, b"x"))
    assert answer is pending
    pending.result(timeout=10)
    assert len(log.stored()) == 1


def test_a_failed_append_is_forgotten_and_its_resend_is_stored(log: Log) -> None:
    session = ProducerSession()
    log.send(session, entry("p", 0)).result()
    data = entry("p", 1, b"lost")
    log.fail(session, data)
    assert log.state.last_sequence_id("p") == 0
    stored = log.send(ProducerSession(), data).result()
    assert stored.entry_id == 1 and log.stored()[-1] == data


def test_only_the_last_chunk_advances_the_sequence_id(log: Log) -> None:
    """Chunk 0 was durable, chunk 1 was lost in a crash: the re-send of chunk 0 is a
    duplicate, that of chunk 1 is stored."""
    first = log.send(ProducerSession(), entry("c", 5, b"part0", chunk=(0, 2))).result()
    assert log.state.last_sequence_id("c") == -1
    log.crash_and_reopen()
    again = ProducerSession()
    assert log.send(again, entry("c", 5, b"part0", chunk=(0, 2))).result() == first
    last = log.send(again, entry("c", 5, b"part1", chunk=(1, 2))).result()
    assert last != first
    assert log.state.last_sequence_id("c") == 5
    assert log.stored() == [entry("c", 5, b"part0", chunk=(0, 2)), entry("c", 5, b"part1", chunk=(1, 2))]


@pytest.mark.parametrize("interval", [1000, 3])
def test_resends_after_a_crash_find_every_durable_entry(log: Log, monkeypatch: pytest.MonkeyPatch,
                                                        interval: int) -> None:
    monkeypatch.setattr(dedup, "SNAPSHOT_INTERVAL_ENTRIES", interval)
    sends = [("a", entry("a", 0)), ("b", entry("b", 5)), ("a", entry("a", 1, highest=4)), ("b", entry("b", 6)),
             ("c", entry("c", 9)), ("a", entry("a", 5)), ("b", entry("b", 7, highest=9))]
    sessions = {name: ProducerSession() for name in "abc"}
    positions = [log.send(sessions[name], data).result() for name, data in sends]
    expected = {"a": 5, "b": 9, "c": 9}
    assert log.state.persisted == expected
    snapshot = log.cursors.load(TOPIC, DEDUP_CURSOR)
    assert snapshot is not None and bool(snapshot.properties) == (interval < len(sends))
    log.crash_and_reopen()
    assert log.state.persisted == expected
    sessions = {name: ProducerSession() for name in "abc"}  # every producer reconnected
    assert [log.send(sessions[name], data).result() for name, data in sends] == positions
    assert len(log.stored()) == len(sends)


def test_past_the_window_a_resend_is_stored_again(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """A duplicate answer is only ever the stored original's position: a re-send whose
    original left the window is stored again (never answered -1:-1 unseen)."""
    monkeypatch.setattr(dedup, "WINDOW_ENTRIES", 2)
    session = ProducerSession()
    for i in range(4):
        log.send(session, entry("p", i, b"m%d" % i)).result()
    assert log.send(ProducerSession(), entry("p", 3, b"m3")).result().entry_id == 3  # in the window
    assert log.send(ProducerSession(), entry("p", 0, b"m0")).result().entry_id == 4  # stored again
    assert len(log.stored()) == 5


def test_a_failed_send_followed_by_stored_ones_is_stored_when_sent_again(log: Log) -> None:
    """The review's case: m1's append fails, m2..m3 of the same producer are stored after
    it; the client re-sends m1..m3 after its reconnect: m1 is stored, m2..m3 are found."""
    session = ProducerSession()
    log.send(session, entry("p", 0, b"m0")).result()
    lost = entry("p", 1, b"m1")
    log.fail(session, lost)
    later = [log.send(session, entry("p", i, b"m%d" % i)).result() for i in (2, 3)]
    again = ProducerSession()
    stored = log.send(again, lost).result()
    assert [log.send(again, entry("p", i, b"m%d" % i)).result() for i in (2, 3)] == later
    assert log.stored()[stored.entry_id] == lost and len(log.stored()) == 4


def test_a_corrupt_entry_in_the_window_is_skipped_at_load(log: Log) -> None:
    session = ProducerSession()
    positions = [log.send(session, entry("p", i, b"m%d" % i)).result() for i in range(3)]
    log.ledger.close()
    ledger_file = log.path / "ledgers" / f"{positions[1].ledger_id:020d}.ledger"
    offset = scan(ledger_file.read_bytes()).entry_offsets[positions[1].entry_id] + 12
    with ledger_file.open("r+b") as raw:
        raw.seek(offset)
        byte = raw.read(1)
        raw.seek(offset)
        raw.write(bytes([byte[0] ^ 0x5A]))
    log.crash_and_reopen()  # loads: the damaged entry is skipped, the others are found
    again = ProducerSession()
    assert log.send(again, entry("p", 0, b"m0")).result() == positions[0]
    assert log.send(again, entry("p", 2, b"m2")).result() == positions[2]


def test_the_window_read_back_at_load_is_bounded_in_bytes(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "WINDOW_BYTES", 3 * 1024)
    session = ProducerSession()
    positions = [log.send(session, entry("p", i, bytes(1000))).result() for i in range(10)]
    log.state.snapshot()
    log.state.cursor.when_written().result(timeout=10)  # the snapshot is queued: durable before the crash
    log.crash_and_reopen()
    assert log.state._window_start() >= positions[6]  # about 3 KiB of 1 KB entries
    assert len(log.state._window) <= 4


def test_snapshot_moves_the_cursor_so_it_holds_little_data(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "SNAPSHOT_INTERVAL_ENTRIES", 2)
    session = ProducerSession()
    positions = [log.send(session, entry("p", i)).result() for i in range(5)]
    assert log.state.cursor.mark_delete_position == positions[3]
    log.state.snapshot()
    assert log.state.cursor.mark_delete_position == positions[4]
    assert log.cursors.load(TOPIC, DEDUP_CURSOR).properties == {"p": 4}  # type: ignore[union-attr]


def test_enabling_starts_at_the_end_of_the_log_and_disabling_deletes_the_cursor(log: Log) -> None:
    log.state.delete()
    log.ledger.append(entry("p", 3)).result(timeout=10)  # stored while de-duplication was off
    state = Deduplication(log.ledger, log.cursors)
    assert state.persisted == {} and state.cursor.mark_delete_position == log.ledger.last_confirmed_position()
    state.delete()
    assert DEDUP_CURSOR not in log.cursors.list(TOPIC)


def test_a_send_is_described_without_its_volatile_fields() -> None:
    one = describe_send("p", 1, 1, entry("p", 1, b"v", publish_time=1))
    two = describe_send("p", 1, 1, entry("p", 1, b"v", publish_time=2))
    other = describe_send("p", 1, 1, entry("p", 1, b"w", publish_time=1))
    assert one.digest == two.digest != other.digest
    assert one == Send("p", 1, 1, -1, True, one.digest, len(entry("p", 1, b"v", publish_time=1)))
    chunk = describe_send("p", 1, 1, entry("p", 1, chunk=(0, 3)))
    assert (chunk.chunk_id, chunk.last_chunk) == (0, False)


# -- a model of the real client against the broker, with crashes ---------------------------------

ACTIONS = st.lists(st.sampled_from(["send", "send", "send", "deliver", "deliver", "receipt", "crash"]),
                   min_size=1, max_size=60)


class _Client:
    """What the C++ client keeps for one producer: its pending sends, its numbering, and the
    reset of that numbering after a reconnect when it never got a receipt."""

    def __init__(self) -> None:
        self.next_sequence_id = 0
        self.last_published = -1
        self.pending: list[tuple[int, bytes]] = []  # (sequence id, entry bytes), send order
        self.answers: dict[int, Future[Position]] = {}  # index in pending -> the broker's answer
        self.transit = 0  # pending sends the broker has received (a prefix)
        self.receipts: dict[bytes, Position] = {}
        self.sent = 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS)
def test_every_receipt_names_its_message_and_no_resend_is_stored_twice(tmp_path_factory: Any, actions: list[str]) -> None:
    log = Log(tmp_path_factory.mktemp("model"))
    client, session = _Client(), ProducerSession()

    def deliver() -> None:
        _, data = client.pending[client.transit]
        client.answers[client.transit] = log.send(session, data)
        client.transit += 1

    try:
        for action in actions:
            if action == "send":
                data = entry("p", client.next_sequence_id, b"m%d" % client.sent, publish_time=client.sent)
                client.pending.append((client.next_sequence_id, data))
                client.next_sequence_id += 1
                client.sent += 1
            elif action == "deliver" and client.transit < len(client.pending):
                deliver()
            elif action == "receipt" and client.transit > 0:
                position = client.answers[0].result(timeout=10)
                client.receipts[client.pending[0][1]] = position
                client.last_published = client.pending[0][0]
                client.pending.pop(0)
                client.answers = {i - 1: f for i, f in client.answers.items() if i > 0}
                client.transit -= 1
            elif action == "crash":
                log.crash_and_reopen()
                session = ProducerSession()
                client.answers, client.transit = {}, 0
                if client.last_published == -1:  # ProducerImpl::handleCreateProducer
                    client.next_sequence_id = log.state.last_sequence_id("p") + 1
        while client.transit < len(client.pending):
            deliver()
        for index, (_, data) in enumerate(client.pending):
            client.receipts[data] = client.answers[index].result(timeout=10)
        stored = {data: position for data, position in zip(log.stored(), _positions(log), strict=True)}
        assert len(stored) == len(log.stored()), "a message was stored twice"
        for data, position in client.receipts.items():
            assert stored.get(data) == position, "a receipt does not name its message"
        assert len(client.receipts) == client.sent
    finally:
        log.close()


def _positions(log: Log) -> list[Position]:
    end = log.ledger.last_confirmed_position()
    if end.entry_id < 0:
        return []
    return [e.position for e in log.ledger.read_entries(log.ledger.first_position(), 10_000, end=end)]
