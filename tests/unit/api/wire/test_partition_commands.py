"""The wire's answers for partitioned parents and missing namespaces (issue 14, point 5).

The real client never produces to a parent nor subscribes on it; a client that does gets
NotAllowedError, which the C++ client treats as fatal, and creates nothing. A topic of a
missing namespace answers TopicNotFound on every door, which the client raises at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from api.wire.frames import make_command
from api.wire.listener import PulsarBroker
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import T, Wire, broker_service

PARENT = "persistent://public/default/parent"
MISSING = "persistent://acme/none/t"


def _run(path: Path, body: object) -> None:
    async def main() -> None:
        with broker_service(path) as broker:
            await body(broker)  # type: ignore[operator]
    asyncio.run(main())


def _metadata(wire: Wire, topic: str) -> pb.CommandPartitionedTopicMetadataResponse:
    answer = wire.request(make_command(pb.CommandPartitionedTopicMetadata(topic=topic, request_id=3)))
    assert [frame.type for frame in answer] == [T.PARTITIONED_METADATA_RESPONSE]
    return answer[0].command.partitionMetadataResponse


def test_partitioned_metadata_answers_n_for_a_parent_and_0_for_its_partitions(tmp_path: Path) -> None:
    async def body(broker: PulsarBroker) -> None:
        broker.partitioned.create(broker.admin, PARENT, 3)
        wire = Wire(broker)
        assert _metadata(wire, PARENT).partitions == 3
        assert _metadata(wire, f"{PARENT}-partition-1").partitions == 0
        assert _metadata(wire, "persistent://public/default/plain").partitions == 0

    _run(tmp_path, body)


def test_a_producer_or_consumer_on_a_parent_is_not_allowed_and_creates_nothing(tmp_path: Path) -> None:
    async def body(broker: PulsarBroker) -> None:
        broker.partitioned.create(broker.admin, PARENT, 2)
        wire = Wire(broker)
        producer = wire.request(make_command(pb.CommandProducer(topic=PARENT, producer_id=1, request_id=5)))
        subscribe = wire.request(make_command(pb.CommandSubscribe(
            topic=PARENT, subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1, request_id=6)))
        for answer, request_id in ((producer, 5), (subscribe, 6)):
            assert [frame.type for frame in answer] == [T.ERROR]
            assert answer[0].command.error.request_id == request_id
            assert answer[0].command.error.error == pb.NotAllowedError
            assert "partitioned" in answer[0].command.error.message
        assert not broker.data_dir.metadata.topic_exists(PARENT)

    _run(tmp_path, body)


def test_every_door_answers_topic_not_found_for_a_missing_namespace(tmp_path: Path) -> None:
    async def body(broker: PulsarBroker) -> None:
        wire = Wire(broker)
        metadata = _metadata(wire, MISSING)
        assert metadata.response == pb.CommandPartitionedTopicMetadataResponse.Failed
        assert metadata.error == pb.TopicNotFound and "acme/none" in metadata.message
        lookup = wire.request(make_command(pb.CommandLookupTopic(topic=MISSING, request_id=4)))
        assert lookup[0].command.lookupTopicResponse.error == pb.TopicNotFound
        producer = wire.request(make_command(pb.CommandProducer(topic=MISSING, producer_id=1, request_id=5)))
        assert producer[0].command.error.error == pb.TopicNotFound
        assert not broker.data_dir.metadata.topic_exists(MISSING)

    _run(tmp_path, body)
