"""De-duplication switched on at run time (``Topic.switch_deduplication``): its start runs
on a worker thread while the topic holds the sends; each is then stored once, in order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.broker.dedup import ProducerSession
from api.broker.topic import Topic
from api.broker.topic_name import TopicName
from cursor.store import CursorStore
from ledger import DataDir, ManagedLedger
from ledger.position import Position
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/switched"


def entry(producer: str, sequence_id: int, value: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name=producer, sequence_id=sequence_id, publish_time=1)
    return encode_entry(metadata, value, with_checksum=False)


def _stored(ledger: ManagedLedger) -> list[bytes]:
    end = ledger.last_confirmed_position()
    return [e.data for e in ledger.read_entries(ledger.first_position(), 1000, end=end)]


@contextlib.asynccontextmanager
async def _switchable(path: Path) -> AsyncIterator[tuple[Topic, ManagedLedger]]:
    """A topic on a fresh data dir under ``path``, de-duplication off; closed afterwards."""
    data_dir = DataDir.open(str(path / "data"))
    cursors = CursorStore(data_dir.database)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    try:
        yield Topic(TopicName.parse(TOPIC), ledger, asyncio.get_running_loop(), cursors=cursors,
                    deduplication=False), ledger
    finally:
        ledger.close()
        cursors.close()
        data_dir.close()


def test_sends_made_while_de_duplication_starts_are_held_then_each_stored_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with _switchable(tmp_path) as (topic, ledger):
            session = ProducerSession()
            before = entry("p", 0, b"before")
            await asyncio.wrap_future(topic.publish(session, "p", 0, 0, before))
            switched = topic.switch_deduplication(True)
            sends = [entry("p", i, b"m%d" % i) for i in range(1, 6)]
            held = [topic.publish(session, "p", i, i, data) for i, data in enumerate(sends, start=1)]
            resent = topic.publish(ProducerSession(), "p", 3, 3, sends[2])  # a reconnected client re-sends m3
            assert topic.dedup is None and not any(f.done() for f in [*held, resent])  # held, none stored
            await switched
            assert topic.dedup is not None
            positions: list[Position] = [await asyncio.wrap_future(f) for f in held]
            assert await asyncio.wrap_future(resent) == positions[2]  # the held original's, not a copy
            again = topic.publish(ProducerSession(), "p", 2, 2, sends[1])  # a re-send after the start
            assert await asyncio.wrap_future(again) == positions[1]
            assert _stored(ledger) == [before, *sends]  # each once, in send order, nothing lost
            assert positions == sorted(positions)

    asyncio.run(main())


def test_de_duplication_switched_off_while_it_starts_stays_off_and_keeps_no_cursor(tmp_path: Path) -> None:
    async def main() -> None:
        async with _switchable(tmp_path) as (topic, ledger):
            switched = topic.switch_deduplication(True)
            held = topic.publish(ProducerSession(), "p", 0, 0, entry("p", 0, b"x"))
            off = topic.switch_deduplication(False)  # before the start ended: its end applies it
            await asyncio.gather(switched, off)
            await asyncio.wrap_future(held)
            assert topic.dedup is None
            await asyncio.wrap_future(topic.cursors.when_written(TOPIC, "pulsar.dedup"))
            assert "pulsar.dedup" not in topic.cursors.list(TOPIC)
            assert _stored(ledger) == [entry("p", 0, b"x")]

    asyncio.run(main())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_every_send_after_the_switch_is_stored_once_and_every_send_is_answered_where_it_is(
        tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """Property: new sends and re-sends (from a reconnected session) in any order around
    the switch and the end of the start: each message first sent after the switch is stored
    exactly once, and every answer is the position of an entry holding that message."""
    count = data.draw(st.integers(1, 12), label="messages")
    switch_at = data.draw(st.integers(0, count), label="switch before message")
    started_at = data.draw(st.integers(switch_at, count), label="start awaited before message")
    resends = data.draw(st.lists(st.integers(0, count - 1), max_size=8), label="re-sent messages")
    path = tmp_path_factory.mktemp("switch")

    async def main() -> None:
        async with _switchable(path) as (topic, ledger):
            sends = [entry("p", i, b"m%d" % i) for i in range(count)]
            answers: list[tuple[int, Future[Position]]] = []
            switched: asyncio.Future[None] | None = None
            session = ProducerSession()
            for i in range(count + 1):
                if i == switch_at:
                    switched = topic.switch_deduplication(True)
                if i == started_at and switched is not None:
                    await switched
                if i < count:
                    answers.append((i, topic.publish(session, "p", i, i, sends[i])))
                    for j in (j for j in resends if j == i):  # a reconnected client re-sends message j
                        answers.append((j, topic.publish(ProducerSession(), "p", j, j, sends[j])))
            assert switched is not None
            await switched
            stored = {}
            for i, answer in answers:
                position = await asyncio.wrap_future(answer)
                stored[position] = ledger.read_entries(position, 1)[0].data
                assert stored[position] == sends[i]  # answered where the message is
            log = _stored(ledger)
            for i in range(switch_at, count):
                assert log.count(sends[i]) == 1, (i, log)

    asyncio.run(main())
