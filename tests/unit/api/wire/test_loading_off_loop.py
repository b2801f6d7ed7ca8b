"""A first PRODUCER or SUBSCRIBE of a topic waits for its load off the event loop
(``api.wire.preparing``), then is answered as ever; a refusal comes at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from api.wire.frames import encode_command, make_command
from compactor.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import Wire, broker_service, settle

T = pb.BaseCommand
TOPIC = "persistent://public/default/first-use"


def test_a_first_producer_or_subscribe_is_answered_after_the_load_off_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        with broker_service(tmp_path / "data") as broker:
            wire = Wire(broker)
            producer = make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1))
            assert wire.request_bytes(encode_command(producer)) == []  # loading: not answered yet
            assert TOPIC not in broker.topics
            await settle(lambda: len(wire.answers()) >= 2)  # CONNECTED, then PRODUCER_SUCCESS
            assert [frame.type for frame in wire.answers()][-1] == T.PRODUCER_SUCCESS
            assert TOPIC in broker.topics and broker.loading == {}
            subscribe = make_command(pb.CommandSubscribe(
                topic=TOPIC + "-sub", subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1,
                request_id=2))
            answers = await wire.request_durable(subscribe)
            assert [frame.type for frame in answers] == [T.SUCCESS] and TOPIC + "-sub" in broker.topics
            missing = make_command(pb.CommandProducer(topic="persistent://public/nowhere/t", producer_id=2,
                                                      request_id=3))
            refused = wire.request_bytes(encode_command(missing))  # refused at once, nothing loaded
            assert [frame.type for frame in refused] == [T.ERROR]
            assert refused[0].command.error.error == pb.TopicNotFound
            await asyncio.sleep(0)
            assert broker.loading == {}

    asyncio.run(main())
