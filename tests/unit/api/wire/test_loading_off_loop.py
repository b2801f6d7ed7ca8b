"""A first PRODUCER or SUBSCRIBE of a topic waits for its load off the event loop
(``api.wire.preparing``), then is answered as ever; a refusal comes at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from api.broker import dedup as dedup_module
from api.broker.dedup import ProducerSession
from api.broker.errors import NotAllowedError
from api.wire.frames import encode_command, make_command
from api.wire.preparing import Creations
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import Wire, broker_service, settle

T = pb.BaseCommand
TOPIC = "persistent://public/default/first-use"


def test_a_first_producer_or_subscribe_is_answered_after_the_load_off_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        with broker_service(tmp_path / "data") as broker:
            wire = Wire(broker)
            producer = make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1))
            assert wire.request_bytes(encode_command(producer)) == []  # loading: not answered yet
            assert TOPIC not in broker.registry.loaded
            await settle(lambda: len(wire.answers()) >= 2)  # CONNECTED, then PRODUCER_SUCCESS
            assert [frame.type for frame in wire.answers()][-1] == T.PRODUCER_SUCCESS
            assert TOPIC in broker.registry.loaded and broker.registry.loading_topics() == []
            subscribe = make_command(pb.CommandSubscribe(
                topic=TOPIC + "-sub", subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
                request_id=2))
            answers = await wire.request_durable(subscribe)
            assert [frame.type for frame in answers] == [T.SUCCESS] and TOPIC + "-sub" in broker.registry.loaded
            missing = make_command(pb.CommandProducer(topic="persistent://public/nowhere/t", producer_id=2,
                                                      request_id=3))
            refused = wire.request_bytes(encode_command(missing))  # refused at once, nothing loaded
            assert [frame.type for frame in refused] == [T.ERROR]
            assert refused[0].command.error.error == pb.TopicNotFound
            await asyncio.sleep(0)
            assert broker.registry.loading_topics() == []

    asyncio.run(main())


def test_a_producer_or_consumer_closed_while_its_topic_loads_is_never_attached(tmp_path: Path) -> None:
    """A client that gives up on a creation (CLOSE_PRODUCER / CLOSE_CONSUMER while the
    topic loads) leaves no producer or consumer behind: the name and the Exclusive
    subscription are free for its next attempt."""
    async def main() -> None:
        with broker_service(tmp_path / "data") as broker:
            wire = Wire(broker)
            producer = make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1, producer_name="p"))
            assert wire.request_bytes(encode_command(producer)) == []  # loading
            close = make_command(pb.CommandCloseProducer(producer_id=1, request_id=2))
            assert [frame.type for frame in wire.request_bytes(encode_command(close))] == [T.SUCCESS]
            subscribe = make_command(pb.CommandSubscribe(
                topic=TOPIC + "-sub", subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
                request_id=3))
            assert wire.request_bytes(encode_command(subscribe)) == []  # loading
            close_consumer = make_command(pb.CommandCloseConsumer(consumer_id=1, request_id=4))
            assert [frame.type for frame in wire.request_bytes(encode_command(close_consumer))] == [T.SUCCESS]
            await settle(lambda: len(wire.answers()) >= 5)  # CONNECTED, 2 SUCCESS, 2 refusals
            refusals = [frame.command.error for frame in wire.answers()[3:]]
            assert sorted(error.request_id for error in refusals) == [1, 3]
            assert {error.error for error in refusals} == {pb.NotAllowedError}
            assert broker.registry.loaded[TOPIC].producers == {} and wire.protocol.producers == {}
            subscription = broker.registry.loaded[TOPIC + "-sub"].subscriptions.get("s")
            assert subscription is None or not subscription.consumers
            assert wire.protocol.consumers == {}
            again = make_command(pb.CommandProducer(topic=TOPIC, producer_id=2, request_id=5, producer_name="p"))
            assert [frame.type for frame in wire.request_bytes(encode_command(again))] == [T.PRODUCER_SUCCESS]
            resubscribe = make_command(pb.CommandSubscribe(
                topic=TOPIC + "-sub", subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=2,
                request_id=6))
            assert [frame.type for frame in await wire.request_durable(resubscribe)] == [T.SUCCESS]

    asyncio.run(main())


def test_a_close_refuses_only_the_creation_it_abandoned_never_a_retry_with_the_same_id() -> None:
    creations = Creations("producer")
    creations.waiting(1, 5)
    creations.close(1)  # the client gave up on request 5
    creations.check(1, 9)  # its retry, same producer id, is handled first: allowed
    with pytest.raises(NotAllowedError):
        creations.check(1, 5)  # the abandoned one, resumed later: refused
    creations.check(1, 5)  # refused once only
    creations.close(2)  # a close of nothing waiting marks nothing
    creations.waiting(2, 7)
    creations.check(2, 7)
    creations.waiting(3, 8)
    creations.close(3)  # request 8 abandoned, and its preparation failed (never checked)
    creations.check(3, 11)  # a later creation of the same id is not refused


def test_a_producer_connecting_while_deduplication_starts_gets_its_last_sequence_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PRODUCER_SUCCESS waits for a de-duplication start in flight. A send of producer
    ``p`` is held by the start; ``p`` reconnecting meanwhile must learn that sequence id:
    answered -1 at once, its client would number the next messages from 0 and
    de-duplication would drop them as re-sends."""
    go = threading.Event()
    real_init = dedup_module.Deduplication.__init__

    def held_init(self: dedup_module.Deduplication, *args: object, **kwargs: object) -> None:
        assert go.wait(10)
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        with broker_service(tmp_path / "data") as broker:
            topic = await broker.load_topic(TOPIC)
            monkeypatch.setattr(dedup_module.Deduplication, "__init__", held_init)
            switched = topic.switch_deduplication(True)
            metadata = pb.MessageMetadata(producer_name="p", sequence_id=7, publish_time=1)
            held = topic.publish(ProducerSession(), "p", 7, 7, encode_entry(metadata, b"v", with_checksum=False))
            wire = Wire(broker)
            producer = make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1, producer_name="p"))
            assert wire.request_bytes(encode_command(producer)) == []  # waits for the start
            go.set()
            await asyncio.wait_for(switched, 10)
            await asyncio.wait_for(asyncio.wrap_future(held), 10)
            await settle(lambda: len(wire.answers()) >= 2)
            success = wire.answers()[-1]
            assert success.type == T.PRODUCER_SUCCESS
            assert success.command.producer_success.last_sequence_id == 7

    asyncio.run(main())
