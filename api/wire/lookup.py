"""The lookup and metadata side of a Pulsar connection: PARTITIONED_METADATA, LOOKUP,
GET_TOPICS_OF_NAMESPACE, GET_SCHEMA and GET_OR_CREATE_SCHEMA.

``LookupHandlers`` is mixed into ``ServerConnection`` (``api.wire.connection``), which
supplies the transport and the answers. Rules it keeps:

* Each command checks the role's grant on what it names (``api.broker.access``):
  PARTITIONED_METADATA, LOOKUP and GET_SCHEMA need produce or consume on the topic,
  GET_OR_CREATE_SCHEMA produce (checked before anything is registered),
  GET_TOPICS_OF_NAMESPACE consume on the namespace.
* PARTITIONED_METADATA and LOOKUP answer a failure (a bad topic name, a refused grant) in
  their own response command with its error code, never a bare ERROR; ``_*_failed`` are
  also how ``ServerConnection._refuse`` answers a refused frame of theirs.
* LOOKUP always answers Connect to this broker's own service URL (one broker, authoritative).
* The schema commands are answered by ``api.wire.schema_commands`` (always their own
  response); GET_OR_CREATE_SCHEMA's registration runs off the loop (``api.wire.preparing``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from api.broker.access import LOOKUP_ACTIONS, AuthorizationError
from api.broker.errors import BrokerError
from api.wire.codec import server_error
from api.wire.connection_part import ConnectionPart
from api.wire.frames import Frame
from api.wire.preparing import get_or_create_schema
from api.wire.schema_commands import get_schema_response, refused_response
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.topic_name import TopicName

__all__ = ["LookupHandlers"]

T = pb.BaseCommand


class LookupHandlers(ConnectionPart):
    """The lookup, metadata and schema commands of one connection (see the module docstring)."""

    # supplied by the connection
    service_url: str

    def _partitioned_metadata(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.partitionMetadata
        name = self._looked_up(request.topic, request.request_id, self._partitioned_metadata_failed)
        if name is not None:
            self.write(_metadata_response(request_id=request.request_id, response=_METADATA.Success,
                                          partitions=self.broker.partitioned.partitions(name)))

    def _partitioned_metadata_failed(self, request_id: int, error: BrokerError) -> None:
        self.write(_metadata_response(request_id=request_id, response=_METADATA.Failed, **_failure(error)))

    def _lookup(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.lookupTopic
        if self._looked_up(request.topic, request.request_id, self._lookup_failed) is not None:
            self.write(_lookup_response(
                request_id=request.request_id, response=_LOOKUP.Connect, brokerServiceUrl=self.service_url,
                brokerServiceUrlTls=self.service_url, authoritative=True, proxy_through_service_url=False))

    def _lookup_failed(self, request_id: int, error: BrokerError) -> None:
        self.write(_lookup_response(request_id=request_id, response=_LOOKUP.Failed, **_failure(error)))

    def _looked_up(self, topic: str, request_id: int, failed: Callable[[int, BrokerError], None]) -> TopicName | None:
        """The name of the ``topic`` a PARTITIONED_METADATA or LOOKUP asks about, when it is
        valid and the role may look it up; else None, the refusal answered by ``failed``."""
        try:
            name = self.broker.topic_name(topic)
            self.broker.access.check_topic(self.role, topic, *LOOKUP_ACTIONS)  # api.auth: grants
        except BrokerError as error:
            failed(request_id, error)
            return None
        return name

    def _topics_of_namespace(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.getTopicsOfNamespace
        self.broker.access.check_namespace(self.role, request.namespace, "consume")  # api.auth: grants
        topics = self.broker.list_topics(request.namespace)
        response = pb.CommandGetTopicsOfNamespaceResponse(request_id=request.request_id, topics=topics)
        self.write(pb.BaseCommand(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE, getTopicsOfNamespaceResponse=response))

    def _get_schema(self, command: pb.BaseCommand, frame: Frame) -> None:
        try:
            self.broker.access.check_topic(self.role, command.getSchema.topic, *LOOKUP_ACTIONS)  # api.auth: grants
        except AuthorizationError as error:
            self.write(refused_response(command, error))
            return
        self.write(get_schema_response(self.broker, command.getSchema))

    def _get_or_create_schema(self, command: pb.BaseCommand, frame: Frame) -> None:
        try:  # before anything is registered
            self.broker.access.check_topic(self.role, command.getOrCreateSchema.topic, "produce")  # api.auth: grants
        except AuthorizationError as error:
            self.write(refused_response(command, error))
            return
        get_or_create_schema(self, frame)  # api.wire.preparing: registered off the loop


_METADATA = pb.CommandPartitionedTopicMetadataResponse
_LOOKUP = pb.CommandLookupTopicResponse


def _metadata_response(**fields: Any) -> pb.BaseCommand:
    return pb.BaseCommand(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=_METADATA(**fields))


def _lookup_response(**fields: Any) -> pb.BaseCommand:
    return pb.BaseCommand(type=T.LOOKUP_RESPONSE, lookupTopicResponse=_LOOKUP(**fields))


def _failure(error: BrokerError) -> dict[str, Any]:
    """The fields of a failed lookup's or metadata request's response: ``error``'s code and text."""
    return {"error": server_error(error.code), "message": str(error)}
