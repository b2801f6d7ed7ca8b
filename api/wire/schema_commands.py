"""Schemas on the Pulsar wire: the schema of PRODUCER and SUBSCRIBE, GET_SCHEMA and
GET_OR_CREATE_SCHEMA, answered from the broker's ``api.broker.schemas.SchemaRegistry``.

The connection calls in here (small hooks), so the rules live in one place:

* ``producer_schema_version``: a PRODUCER with a schema gets its version (registered when
  new), which PRODUCER_SUCCESS carries as 8 big-endian bytes and the client stamps into
  every message; a PRODUCER without one (BytesSchema) gets none. A refused schema raises
  ``IncompatibleSchemaError``, answered ERROR ``IncompatibleSchema``: the client raises
  ``pulsar.exceptions.IncompatibleSchema`` at once, without retrying.
* ``check_subscribe_schema``: a SUBSCRIBE with a schema (consumers, readers, TableViews)
  is admitted, registered on an idle topic, or refused the same way.
* ``get_schema_response`` / ``get_or_create_schema_response``: always their own response
  command, a failure as its ``error_code`` (TopicNotFound for a missing version), never
  silence nor a bare ERROR, so an Avro consumer that asks for a writer schema never waits
  out its operation timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from api.broker.errors import BrokerError
from api.broker.schemas import SchemaData, version_bytes
from api.wire.codec import server_error
from ledger.errors import CompactionServiceError
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.service import BrokerService
    from api.broker.topic import Topic

__all__ = [
    "check_subscribe_schema",
    "get_or_create_schema_response",
    "get_schema_response",
    "producer_schema_version",
    "refused_response",
    "schema_data",
    "wire_schema",
]

log = logging.getLogger(__name__)
T = pb.BaseCommand


def schema_data(schema: pb.Schema) -> SchemaData:
    """The registry's form of a wire ``Schema``."""
    properties: Iterable[pb.KeyValue] = schema.properties
    return SchemaData(int(schema.type), bytes(schema.schema_data), {p.key: p.value for p in properties})


def wire_schema(schema: SchemaData) -> pb.Schema:
    """The wire ``Schema`` of a registered one (its name is the type's, as Pulsar's)."""
    message = pb.Schema(name=schema.type_name, schema_data=schema.data, type=schema.type)  # type: ignore[arg-type]
    message.properties.extend(pb.KeyValue(key=k, value=v) for k, v in sorted(schema.properties.items()))
    return message


def producer_schema_version(broker: BrokerService, topic: Topic, request: pb.CommandProducer) -> bytes | None:
    """The 8-byte version of the producer's schema, or None when it sent none."""
    if not request.HasField("schema"):
        return None
    return version_bytes(broker.schemas.put_if_absent(topic.name, schema_data(request.schema)))


def check_subscribe_schema(broker: BrokerService, topic: Topic, request: pb.CommandSubscribe) -> None:
    """Admit the subscriber's schema, if it sent one (``IncompatibleSchemaError``)."""
    if not request.HasField("schema"):
        return
    in_use = (topic.ledger.number_of_entries > 0 or bool(topic.producers)
              or any(subscription.consumers for subscription in topic.subscriptions.values()))
    broker.schemas.check_consumer(topic.name, schema_data(request.schema), in_use=in_use)


def _version(raw: bytes) -> int | None:
    """The version a GET_SCHEMA names (None: the latest); 8 big-endian bytes, as any length
    the client may send is read as an unsigned big-endian number."""
    return int.from_bytes(raw, "big", signed=len(raw) == 8) if raw else None


def get_schema_response(broker: BrokerService, request: pb.CommandGetSchema) -> pb.BaseCommand:
    """GET_SCHEMA_RESPONSE for ``request``: the schema and its version, or an error code."""
    response = pb.CommandGetSchemaResponse(request_id=request.request_id)
    try:
        version = _version(request.schema_version) if request.HasField("schema_version") else None
        stored = broker.schemas.get(broker.topic_name(request.topic), version)
    except CompactionServiceError as error:
        _failed(response, error)
    else:
        response.schema.CopyFrom(wire_schema(stored.schema))
        response.schema_version = version_bytes(stored.version)
    return pb.BaseCommand(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=response)


def get_or_create_schema_response(broker: BrokerService, request: pb.CommandGetOrCreateSchema) -> pb.BaseCommand:
    """GET_OR_CREATE_SCHEMA_RESPONSE: the version of the schema, registered as a producer's."""
    response = pb.CommandGetOrCreateSchemaResponse(request_id=request.request_id)
    try:
        name = broker.topic_name(request.topic)
        response.schema_version = version_bytes(broker.schemas.put_if_absent(name, schema_data(request.schema)))
    except CompactionServiceError as error:
        _failed(response, error)
    return pb.BaseCommand(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=response)


def _failed(response: pb.CommandGetSchemaResponse | pb.CommandGetOrCreateSchemaResponse,
            error: CompactionServiceError) -> None:
    code = error.code if isinstance(error, BrokerError) else "MetadataError"
    log.info("schema request %d refused: %s", response.request_id, error)
    response.error_code = server_error(code)
    response.error_message = str(error)


def refused_response(command: pb.BaseCommand, error: BrokerError) -> pb.BaseCommand:
    """The response to a GET_SCHEMA or GET_OR_CREATE_SCHEMA refused before it ran (by
    ``frame_problem``, or for want of the role's grant): ``error``'s code in its own response."""
    if command.type == T.GET_SCHEMA:
        schema_response = pb.CommandGetSchemaResponse(request_id=command.getSchema.request_id)
        _failed(schema_response, error)
        return pb.BaseCommand(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=schema_response)
    created = pb.CommandGetOrCreateSchemaResponse(request_id=command.getOrCreateSchema.request_id)
    _failed(created, error)
    return pb.BaseCommand(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=created)

