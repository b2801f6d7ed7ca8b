"""Schemas with the real client: versions, refusals, GET_SCHEMA, compaction and restarts.

The acceptance checks of ``pulsar-partitions-schemas-keyshared.md`` §1.4 with
``pulsar.schema`` StringSchema, JsonSchema(Record) and AvroSchema(Record): versions from 0
in PRODUCER_SUCCESS and in every message; the same schema reuses its version; a refused
schema raises ``IncompatibleSchema`` at once; partitions share their base topic's
registry; the compacted view keeps each message's version, so typed read-compacted readers
and TableViews decode it; versions survive a restart; an Avro consumer never waits out a
GET_SCHEMA. Hostile schemas (deep, huge, not text, ...) over GET_OR_CREATE_SCHEMA and
PRODUCER get a protocol refusal on a connection that stays open.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from api.broker.schemas import schema_base
from api.wire.frames import make_command
from message.proto import pulsar_api_pb2 as pb
from tests.integration.wire.helpers import RECEIVE_MS, read_available, unique_topic
from tests.integration.wire.test_robustness import _Raw

T = pb.BaseCommand

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("fastavro")  # pulsar.schema.AvroSchema needs it

import _pulsar
from pulsar.schema import AvroSchema, Float, Integer, JsonSchema, Record, String, StringSchema


class Reading(Record):
    sensor = String()
    value = Integer()


def _evolved() -> type[Record]:
    """``Reading`` with one more field and no default, as Python Records are written."""
    class Reading(Record):  # the same record name: Avro resolution matches records by name
        sensor = String()
        value = Integer()
        unit = Float()
    return Reading


def _new_client(broker: Any) -> Any:
    return pulsar.Client(broker.url, operation_timeout_seconds=10,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _versions(broker: Any, topic: str) -> list[int]:
    async def read() -> list[int]:
        name = broker.service.topic_name(topic)
        return [each.version for each in broker.service.schemas.versions(schema_base(name))]
    result: list[int] = broker.call(read())
    return result


def _set_strategy(broker: Any, scope: str, strategy: str) -> None:
    async def apply() -> None:
        broker.service.policies.set_policy(scope, "schemaCompatibilityStrategy", strategy)
    broker.call(apply())


def test_a_string_schema_round_trips_with_version_zero(client: Any) -> None:
    topic = unique_topic("schema-string")
    consumer = client.subscribe(topic, "s", schema=StringSchema())
    producer = client.create_producer(topic, schema=StringSchema())
    producer.send("hello")
    message = consumer.receive(RECEIVE_MS)
    assert message.value() == "hello"
    assert message._message.int_schema_version() == 0
    assert client._client.get_schema_info(topic, 0).schema_type() == _pulsar.SchemaType.STRING


def test_a_second_json_producer_with_the_same_record_reuses_its_version(broker: Any, client: Any) -> None:
    topic = unique_topic("schema-json")
    first = client.create_producer(topic, schema=JsonSchema(Reading))
    second = _new_client(broker).create_producer(topic, schema=JsonSchema(Reading))
    first.send(Reading(sensor="a", value=1))
    second.send(Reading(sensor="b", value=2))
    consumer = client.subscribe(topic, "s", schema=JsonSchema(Reading), initial_position=pulsar.InitialPosition.Earliest)
    messages = [consumer.receive(RECEIVE_MS) for _ in range(2)]
    assert [(m.value().sensor, m.value().value) for m in messages] == [("a", 1), ("b", 2)]
    assert [m._message.int_schema_version() for m in messages] == [0, 0]
    assert _versions(broker, topic) == [0]


def test_avro_round_trips_through_a_fresh_client_that_fetches_the_writer_schema(broker: Any, client: Any) -> None:
    topic = unique_topic("schema-avro")
    producer = client.create_producer(topic, schema=AvroSchema(Reading))
    for i in range(5):
        producer.send(Reading(sensor=f"s{i}", value=i))
    fresh = _new_client(broker)
    try:
        consumer = fresh.subscribe(topic, "s", schema=AvroSchema(Reading),
                                   initial_position=pulsar.InitialPosition.Earliest)
        started = time.monotonic()
        values = [consumer.receive(RECEIVE_MS).value() for _ in range(5)]
        assert time.monotonic() - started < 5  # a GET_SCHEMA answered at once, not timed out
        assert [(v.sensor, v.value) for v in values] == [(f"s{i}", i) for i in range(5)]
        info = fresh._client.get_schema_info(topic, 0)
        assert json.loads(info.schema()) == json.loads(AvroSchema(Reading).schema_info().schema())
    finally:
        fresh.close()


def test_a_string_producer_on_a_json_topic_is_refused_at_once(client: Any) -> None:
    topic = unique_topic("schema-refused")
    client.create_producer(topic, schema=JsonSchema(Reading))
    started = time.monotonic()
    with pytest.raises(pulsar.exceptions.IncompatibleSchema):
        client.create_producer(topic, schema=StringSchema())
    assert time.monotonic() - started < 2


def test_an_added_field_is_refused_under_full_and_accepted_under_always_compatible(broker: Any, client: Any) -> None:
    topic = unique_topic("schema-evolve")
    old = client.create_producer(topic, schema=JsonSchema(Reading))
    evolved = _evolved()
    with pytest.raises(pulsar.exceptions.IncompatibleSchema):
        client.create_producer(topic, schema=JsonSchema(evolved))
    _set_strategy(broker, topic, "ALWAYS_COMPATIBLE")
    new = client.create_producer(topic, schema=JsonSchema(evolved))
    old.send(Reading(sensor="a", value=1))
    new.send(evolved(sensor="b", value=2, unit=0.5))
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [m._message.int_schema_version() for m in read_available(reader)] == [0, 1]
    assert _versions(broker, topic) == [0, 1]


def test_a_bytes_producer_on_a_schema_topic_writes_messages_without_a_version(client: Any) -> None:
    topic = unique_topic("schema-bytes")
    client.create_producer(topic, schema=JsonSchema(Reading))
    client.create_producer(topic).send(b"raw")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    messages = read_available(reader)
    assert [m.data() for m in messages] == [b"raw"]
    assert messages[0]._message.int_schema_version() == -1


def test_a_json_consumer_needs_a_schema_on_a_topic_with_data_and_registers_one_on_an_empty_topic(
        broker: Any, client: Any) -> None:
    written = unique_topic("schema-nodata")
    client.create_producer(written).send(b"bytes")
    with pytest.raises(pulsar.exceptions.IncompatibleSchema):
        client.subscribe(written, "s", schema=JsonSchema(Reading))
    with pytest.raises(pulsar.exceptions.IncompatibleSchema):
        client.create_reader(written, pulsar.MessageId.earliest, schema=JsonSchema(Reading))
    empty = unique_topic("schema-empty")
    client.subscribe(empty, "s", schema=JsonSchema(Reading))
    assert _versions(broker, empty) == [0]


def test_partitions_share_the_registry_of_their_base_topic(broker: Any, client: Any) -> None:
    base = unique_topic("schema-parts")
    producer = client.create_producer(f"{base}-partition-1", schema=JsonSchema(Reading))
    producer.send(Reading(sensor="a", value=1))
    with pytest.raises(pulsar.exceptions.IncompatibleSchema):
        client.create_producer(f"{base}-partition-0", schema=StringSchema())
    on_partition, on_base = client._client.get_schema_info(f"{base}-partition-1", -1), \
        client._client.get_schema_info(base, 0)
    assert on_partition.schema() == on_base.schema() == JsonSchema(Reading).schema_info().schema()
    assert _versions(broker, base) == [0]


def test_typed_compacted_readers_and_table_views_decode_json_after_compaction(broker: Any, client: Any) -> None:
    topic = unique_topic("schema-compacted")
    producer = client.create_producer(topic, schema=JsonSchema(Reading), batching_enabled=True,
                                      batching_max_publish_delay_ms=5)
    for round_ in range(3):
        for key in ("k1", "k2"):
            producer.send_async(Reading(sensor=key, value=round_), None, partition_key=key)
    producer.flush()
    broker.compact(topic)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, schema=JsonSchema(Reading),
                                  is_read_compacted=True)
    messages = read_available(reader)
    assert sorted((m.partition_key(), m.value().value) for m in messages) == [("k1", 2), ("k2", 2)]
    assert {m._message.int_schema_version() for m in messages} == {0}
    view = client.create_table_view(topic, schema=JsonSchema(Reading))
    try:
        seen: dict[str, tuple[str, int]] = {}
        view.for_each(lambda key, value: seen.__setitem__(key, (value.sensor, value.value)))
        assert seen == {"k1": ("k1", 2), "k2": ("k2", 2)}
    finally:
        view.close()


def test_schema_versions_survive_a_restart(broker: Any) -> None:
    topic = unique_topic("schema-restart")
    _set_strategy(broker, topic, "ALWAYS_COMPATIBLE")
    client = _new_client(broker)
    client.create_producer(topic, schema=JsonSchema(Reading)).send(Reading(sensor="a", value=1))
    client.create_producer(topic, schema=JsonSchema(_evolved()))
    client.close()
    broker.restart()
    client = _new_client(broker)
    try:
        assert _versions(broker, topic) == [0, 1]
        assert client._client.get_schema_info(topic, 1).schema() == JsonSchema(_evolved()).schema_info().schema()
        producer = client.create_producer(topic, schema=JsonSchema(Reading))
        producer.send(Reading(sensor="b", value=2))
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [m._message.int_schema_version() for m in read_available(reader)] == [0, 0]
        assert _versions(broker, topic) == [0, 1]
    finally:
        client.close()


# The client logs its fallback with the deprecated ``Logger.warn``.
@pytest.mark.filterwarnings("ignore:The 'warn' method is deprecated:DeprecationWarning")
def test_an_avro_consumer_whose_writer_schema_is_gone_decodes_without_waiting(broker: Any, client: Any) -> None:
    """GET_SCHEMA of a deleted version answers an error at once: the client decodes with
    its reader schema instead of waiting out its operation timeout for every message."""
    topic = unique_topic("schema-gone")
    producer = client.create_producer(topic, schema=AvroSchema(Reading))
    for i in range(5):
        producer.send(Reading(sensor="a", value=i))
    fresh = _new_client(broker)  # nothing cached: every version is asked for
    try:
        consumer = fresh.subscribe(topic, "s", schema=AvroSchema(Reading),
                                   initial_position=pulsar.InitialPosition.Earliest)

        async def delete() -> None:
            broker.service.schemas.delete(broker.service.topic_name(topic))
        broker.call(delete())
        started = time.monotonic()
        values = [consumer.receive(RECEIVE_MS).value().value for _ in range(5)]
        assert values == list(range(5))
        assert time.monotonic() - started < 5
    finally:
        fresh.close()


# -- the raw protocol: every schema request gets its own response -----------------------------


def test_schema_requests_always_get_their_own_response_on_the_wire(broker: Any) -> None:
    """GET_SCHEMA and GET_OR_CREATE_SCHEMA answer their response command, a failure as its
    error code (never a bare ERROR the client would wait past), and keep the connection."""
    topic = unique_topic("schema-raw")
    string = pb.Schema(name="s", schema_data=b"null", type=pb.Schema.String)
    raw = _Raw(broker.port)
    try:
        missing = raw.request(make_command(pb.CommandGetSchema(request_id=1, topic=topic)))
        assert missing.getSchemaResponse.request_id == 1 and missing.getSchemaResponse.error_code == pb.TopicNotFound
        created = raw.request(make_command(pb.CommandGetOrCreateSchema(request_id=2, topic=topic, schema=string)))
        assert created.getOrCreateSchemaResponse.schema_version == b"\0" * 8
        json_schema = pb.Schema(name="j", schema_data=JsonSchema(Reading).schema_info().schema().encode(),
                                type=pb.Schema.Json)
        refused = raw.request(make_command(pb.CommandGetOrCreateSchema(request_id=3, topic=topic, schema=json_schema)))
        assert refused.getOrCreateSchemaResponse.error_code == pb.IncompatibleSchema
        found = raw.request(make_command(pb.CommandGetSchema(request_id=4, topic=topic, schema_version=b"\0" * 8)))
        assert (found.getSchemaResponse.schema.type, found.getSchemaResponse.schema_version) == \
            (pb.Schema.String, b"\0" * 8)
        bad = raw.request(make_command(pb.CommandGetSchema(request_id=5, topic="persistent://a/b/c\n")))
        assert (bad.getSchemaResponse.request_id, bad.getSchemaResponse.error_code) == (5, pb.InvalidTopicName)
        assert raw.request(make_command(pb.CommandPing())).type == pb.BaseCommand.PONG
    finally:
        raw.close()


# -- hostile schemas on the wire: a protocol refusal, never a closed connection ----------------


def _schema(kind: int, data: bytes) -> pb.Schema:
    return pb.Schema(name="s", schema_data=data, type=kind)  # type: ignore[arg-type]


def test_a_schema_over_the_size_limit_is_refused_on_the_wire_as_over_rest(broker: Any) -> None:
    """--schema-max-size-bytes (5 MiB) holds on the Pulsar port too: a larger definition
    still fits a frame, and is refused as a protocol error; the connection stays."""
    topic = unique_topic("schema-huge")
    huge = json.dumps({"type": "record", "name": "R", "doc": "x" * (5 * 1024 * 1024), "fields": []}).encode()
    raw = _Raw(broker.port)
    try:
        refused = raw.request(make_command(pb.CommandGetOrCreateSchema(
            request_id=1, topic=topic, schema=_schema(pb.Schema.Avro, huge))))
        assert refused.getOrCreateSchemaResponse.error_code == pb.IncompatibleSchema
        assert "5242880" in refused.getOrCreateSchemaResponse.error_message
        producer = raw.request(make_command(pb.CommandProducer(
            topic=topic, producer_id=1, request_id=2, schema=_schema(pb.Schema.Avro, huge))))
        assert (producer.type, producer.error.error) == (T.ERROR, pb.IncompatibleSchema)
        assert raw.request(make_command(pb.CommandPing())).type == T.PONG
    finally:
        raw.close()


@pytest.mark.slow
def test_no_generated_schema_closes_the_connection_or_harms_the_broker(broker: Any, client: Any) -> None:
    """Property: GET_OR_CREATE_SCHEMA and PRODUCER with any definition (valid or hostile,
    ``hostile_definitions``) get their answer, a success or a protocol error, on a
    connection that stays open; afterwards the real client still registers a schema."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.unit.api.test_rest_schemas import hostile_definitions

    raw = _Raw(broker.port)
    ids = iter(range(1, 10**6))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from([pb.Schema.Avro, pb.Schema.Json, pb.Schema.String]), data=hostile_definitions())
    def one(kind: int, data: bytes) -> None:
        topic = unique_topic("schema-hostile")
        request_id = next(ids)
        created = raw.request(make_command(pb.CommandGetOrCreateSchema(
            request_id=request_id, topic=topic, schema=_schema(kind, data))))
        answer = created.getOrCreateSchemaResponse
        assert answer.request_id == request_id
        assert answer.HasField("error_code") != answer.HasField("schema_version")
        producer_id = next(ids)
        produced = raw.request(make_command(pb.CommandProducer(
            topic=unique_topic("schema-hostile"), producer_id=producer_id, request_id=producer_id,
            schema=_schema(kind, data))))
        assert produced.type in (T.PRODUCER_SUCCESS, T.ERROR), produced
        if produced.type == T.ERROR:
            assert produced.error.error == pb.IncompatibleSchema, produced

    try:
        one()
        assert raw.request(make_command(pb.CommandPing())).type == T.PONG
    finally:
        raw.close()
    topic = unique_topic("schema-after")
    client.create_producer(topic, schema=JsonSchema(Reading)).send(Reading(sensor="a", value=1))
    assert _versions(broker, topic) == [0]
