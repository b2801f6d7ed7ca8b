"""One client connection speaking the Pulsar binary protocol (``pulsar-protocol.md`` §2).

The connection only translates: frames in, calls on the broker core, frames out. Rules it
keeps for the real ``pulsar-client`` (C++ core 4.2.0):

* CONNECT must come first; anything else before it closes the connection. With
  authentication on, CONNECT must prove a role (``api.wire.auth.admit``: a token, or a
  trusted client certificate's CN) or is answered ERROR AuthenticationError and closed;
  every command that names a topic checks the role's grant on it (``HANDLERS``,
  ``api.broker.access``); a refusal is AuthorizationError in that command's own answer.
* Every command that carries a request id gets an answer; what compactd does not support
  answers ERROR ``NotAllowedError`` (never a connection-killing code such as ServiceNotReady).
* PRODUCER, SEND and CLOSE_PRODUCER are ``api.wire.producing`` (ProducerBusy, receipts in
  send order once durable, SEND_ERROR on a failed append).
* Schemas are ``api.wire.schema_commands``: the schema of PRODUCER and SUBSCRIBE (refused
  with IncompatibleSchema), GET_SCHEMA and GET_OR_CREATE_SCHEMA (always their own response).
* SEEK answers CLOSE_CONSUMER to the subscription's consumers *before* SUCCESS, so the
  client flushes its queue and subscribes again from the new position.
* SUBSCRIBE, SEEK and UNSUBSCRIBE answer SUCCESS once the cursor change is durable,
  committed by the cursor store's thread, never on the event loop (``api.wire.durable``).
* A malformed frame (``FrameError``) closes this connection only. A well-formed command
  carrying a hostile value (``api.wire.validate``: a string that is not UTF-8, a name with
  control characters, a sequence id above int64, a SEND entry that does not decode) is
  refused for that command only, before its handler runs, so it creates nothing.
* Flow control: while the transport's write buffer is over ``WRITE_BUFFER_HIGH_BYTES``
  the connection's consumers are not ``writable`` and dispatch sends them nothing; when
  it drains (``resume_writing``) their subscriptions dispatch again. With dispatch's
  bounded rounds this keeps what a consumer's permits can make the broker hold bounded.
* Limits (``api.wire.limits``): no CONNECT within the connect timeout, or a frame left
  incomplete past the frame timeout, closes the connection; partial frames count against
  a budget all the listener's ``Connections`` share, and the connection that would exceed
  it is closed. The connection is in that set from ``connection_made`` to ``connection_lost``.
* Writes go through the connection's ``api.wire.outbox.Outbox``: the answers to one read,
  or what one turn of the event loop wrote, reach the transport as one write (in order).
* Keep-alive: a PING every ``KEEPALIVE_INTERVAL_S``; a connection silent for two intervals
  is closed. A connection that goes away frees its consumers (their unacknowledged
  entries are redelivered) and producers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from api.broker.access import LOOKUP_ACTIONS, AuthorizationError
from api.broker.advertised import broker_service_url
from api.broker.dispatch import Consumer, Delivery, Subscription, SubType
from api.broker.errors import BrokerError, NotAllowedError
from api.broker.key_shared import KeySharedPolicy
from api.broker.partitions import partition_index
from api.broker.topic_stats import RateCounter, connected_since
from api.wire.auth import admit
from api.wire.codec import (
    CONNECTION_COMMANDS,
    U64_MAX,
    fill_message_id,
    from_message_id,
    request_id_of,
    server_error,
    to_message_id,
)
from api.wire.durable import answer_ack, answer_when_written, detach
from api.wire.frames import (
    FRAME_BYTES_MAX,
    MESSAGE_BYTES_MAX,
    Frame,
    FrameDecoder,
    FrameError,
    encode_command,
    encode_message,
    encode_payload_command,
)
from api.wire.limits import Connections, PartialFrameBudget, WireLimits
from api.wire.outbox import Outbox
from api.wire.preparing import Creations, get_or_create_schema, ready_to_create
from api.wire.producing import ProducerHandlers, SendCompletions, WireProducer
from api.wire.schema_commands import (
    check_subscribe_schema,
    get_schema_response,
    refused_response,
)
from api.wire.validate import frame_problem
from cursor.cursor import InitialPosition
from ledger.errors import CompactionServiceError
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.service import BrokerService
    from api.broker.topic import Topic

__all__ = ["HANDLERS", "KEEPALIVE_INTERVAL_S", "ServerConnection"]

log = logging.getLogger(__name__)

KEEPALIVE_INTERVAL_S = 30.0  # the client's own ping interval; silence for two closes
CLOSE_FLUSH_S = 2.0  # a closed connection's unsent bytes get this long, then it is aborted
PROTOCOL_VERSION = 20  # what pulsar-client 3.13.0 (C++ 4.2.0) speaks
# Consumers stop getting entries while more than this waits in a connection's write buffer
# (asyncio pauses writing above it, resumes at a quarter of it).
WRITE_BUFFER_HIGH_BYTES = 1024 * 1024
T = pb.BaseCommand


class WireConsumer(Consumer):
    """A consumer on this connection: deliveries become MESSAGE frames."""

    def __init__(self, connection: ServerConnection, consumer_id: int, name: str, priority_level: int) -> None:
        super().__init__(consumer_id, name, priority_level)
        self.connection = connection
        self.topic: Topic | None = None
        self.subscription: Subscription | None = None
        self.partition = -1  # a partition topic's index, stamped on message ids (as Java's broker does)
        self.counter = RateCounter()  # messages handed to this consumer
        self.connected_at = time.time()  # shown by describe()

    def describe(self) -> dict[str, object]:
        """Pulsar's ``ConsumerStats`` of this consumer."""
        return {
            "consumerName": self.name, **self.counter_fields(), "availablePermits": max(0, self.permits),
            "address": self.connection.peer_address(), "connectedSince": connected_since(self.connected_at),
            "clientVersion": self.connection.client_version, "metadata": {},
        }

    def counter_fields(self) -> dict[str, object]:
        rate, throughput = self.counter.rates()
        return {"msgRateOut": rate, "msgThroughputOut": throughput, "msgOutCounter": self.counter.messages,
                "bytesOutCounter": self.counter.bytes}

    @property
    def writable(self) -> bool:
        """Dispatch may send to it: its connection is open and not over its high-water mark
        (a closing connection's consumers get nothing more, which would only come back)."""
        return self.connection.is_open() and not self.connection.writing_paused

    def send(self, delivery: Delivery) -> None:
        command = pb.BaseCommand(type=T.MESSAGE)  # filled in place: no copies (encode_message)
        message = command.message
        message.consumer_id = self.consumer_id
        fill_message_id(message.message_id, delivery.position)
        message.redelivery_count = delivery.redelivery_count
        if delivery.ack_set:
            message.ack_set.extend(delivery.ack_set)
        if self.partition >= 0:
            message.message_id.partition = self.partition
        self.connection.write_message(command, delivery.data)
        self.counter.record(delivery.messages, len(delivery.data))
        if self.topic is not None and self.subscription is not None:
            self.topic.counters.record_out(self.subscription.name, delivery.messages, len(delivery.data))

    def set_active(self, active: bool) -> None:
        if self.subscription is not None and self.subscription.sub_type is SubType.FAILOVER:
            change = pb.CommandActiveConsumerChange(consumer_id=self.consumer_id, is_active=active)
            self.connection.write(pb.BaseCommand(type=T.ACTIVE_CONSUMER_CHANGE, active_consumer_change=change))

    def disconnect(self) -> None:
        close = pb.CommandCloseConsumer(consumer_id=self.consumer_id, request_id=U64_MAX)
        self.connection.write(pb.BaseCommand(type=T.CLOSE_CONSUMER, close_consumer=close))
        self.connection.consumers.pop(self.consumer_id, None)


# The commands a client may send, each to its handler (a method of ``ServerConnection``).
# Those that name a topic check the role's grant there (``AccessControl.check_topic``):
# PARTITIONED_METADATA, LOOKUP and GET_SCHEMA need produce or consume, PRODUCER and
# GET_OR_CREATE_SCHEMA produce, SUBSCRIBE consume, GET_TOPICS_OF_NAMESPACE consume on the
# namespace; the rest act on a producer or consumer this connection made, under that grant.
HANDLERS: dict[int, str] = {
    T.CONNECT: "_connect", T.PARTITIONED_METADATA: "_partitioned_metadata", T.LOOKUP: "_lookup",
    T.PRODUCER: "_producer", T.SEND: "_send", T.SUBSCRIBE: "_subscribe", T.FLOW: "_flow", T.ACK: "_ack",
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: "_redeliver", T.SEEK: "_seek",
    T.GET_LAST_MESSAGE_ID: "_get_last_message_id", T.UNSUBSCRIBE: "_unsubscribe",
    T.CLOSE_PRODUCER: "_close_producer", T.CLOSE_CONSUMER: "_close_consumer", T.PING: "_ping", T.PONG: "_pong",
    T.GET_TOPICS_OF_NAMESPACE: "_topics_of_namespace", T.GET_SCHEMA: "_get_schema",
    T.GET_OR_CREATE_SCHEMA: "_get_or_create_schema",
}


class ServerConnection(ProducerHandlers, asyncio.Protocol):
    """The protocol object of one TCP connection; its producer side is ``ProducerHandlers``."""

    def __init__(self, broker: BrokerService, connections: Connections) -> None:
        """A connection to ``broker`` (the core), one of the listener's ``connections``."""
        self.broker = broker
        self.connections = connections
        self.decoder = FrameDecoder(max_frame_bytes=FRAME_BYTES_MAX)
        self.transport: asyncio.Transport | None = None
        self.connected = False
        self.producers: dict[int, WireProducer] = {}
        self.consumers: dict[int, WireConsumer] = {}
        self.creating_producers, self.creating_consumers = Creations("producer"), Creations("consumer")
        self.service_url = ""
        self.role: str | None = None  # proven at CONNECT (api.wire.auth); None: authentication off
        self.client_version = ""  # what the client's CONNECT said it is
        self.writing_paused = False  # the transport's write buffer is over its high-water mark
        self._loop = asyncio.get_event_loop()
        self._loop_thread = threading.get_ident()  # connections are made on the loop's thread
        self.outbox = Outbox(self._loop, self._transport_write)  # what is written goes out once a loop turn
        self._completions = SendCompletions(self._loop, self._send_done, self.outbox)  # appends ended, to the loop in batches
        self._last_received = self._loop.time()
        self._activity = asyncio.Event()  # set by any data received or by the connection's end
        self._keepalive: asyncio.TimerHandle | None = None
        self.limits: WireLimits = connections.limits
        self._budget: PartialFrameBudget = connections.partial_frames
        self._partial_held = 0  # bytes of an incomplete frame, taken from the budget
        self._partial_since: float | None = None  # when the incomplete frame started
        self._partial_timer: asyncio.TimerHandle | None = None
        self._connect_timer: asyncio.TimerHandle | None = None
        self._handlers: dict[int, Callable[[pb.BaseCommand, Frame], None]] = {
            command_type: getattr(self, name) for command_type, name in HANDLERS.items()}

    # -- transport ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        host, port = transport.get_extra_info("sockname")[:2]
        tls = transport.get_extra_info("sslcontext") is not None
        self.service_url = broker_service_url(self.broker.settings, host, port, tls=tls)  # what LOOKUP answers
        if not self.connections.add(self):  # at the listener's cap: its descriptor goes back at once
            transport.abort()
            return
        self._keepalive = self._loop.call_later(KEEPALIVE_INTERVAL_S, self._check_alive)
        self._connect_timer = self._loop.call_later(self.limits.connect_timeout_s, self._check_connected)

    def data_received(self, data: bytes) -> None:
        self._last_received = self._loop.time()
        self._activity.set()
        try:
            frames = self.decoder.feed(data)
        except FrameError as error:
            log.warning("closing connection: %s", error)
            self.close()
            return
        if not self._hold_partial_frame(started_anew=bool(frames)):
            return
        self.outbox.cork()  # the answers to this read go out in one write
        try:
            for frame in frames:
                if self.transport is None or self.transport.is_closing():
                    return
                self._handle(frame)
        finally:
            self.outbox.uncork()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        """The write buffer drained: the consumers that stopped for it get their next round."""
        self.writing_paused = False
        for subscription in {id(c.subscription): c.subscription for c in self.consumers.values()
                             if c.subscription is not None}.values():
            subscription.dispatch()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._keepalive, self._connect_timer, self._partial_timer):
            if timer is not None:
                timer.cancel()
        self._release_partial_frame()
        self.outbox.drop()
        self.connections.discard(self)
        self.transport = None  # closed: removing one of its consumers dispatches nothing to the others here
        for consumer in list(self.consumers.values()):
            if consumer.topic is not None and consumer.subscription is not None:
                consumer.topic.remove_consumer(consumer.subscription, consumer)
        self.consumers.clear()
        for producer in self.producers.values():
            producer.topic.detach_producer(producer.name, producer)
        self.producers.clear()
        self._activity.set()

    def close(self) -> None:
        """Close the connection; what cannot be flushed within ``CLOSE_FLUSH_S`` (a peer
        that does not read) is dropped, so the connection is always released."""
        if self.transport is not None:
            transport = self.transport
            self.outbox.flush()  # what was written before the close goes first
            transport.close()
            self._loop.call_later(CLOSE_FLUSH_S, transport.abort)

    def is_open(self) -> bool:
        """True until the connection is closing."""
        return self.transport is not None and not self.transport.is_closing()

    async def is_alive(self, timeout_s: float) -> bool:
        """Ping the client: True when anything comes back within ``timeout_s``."""
        if not self.is_open():
            return False
        self._activity.clear()
        self.write(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()))
        try:
            await asyncio.wait_for(self._activity.wait(), timeout_s)
        except TimeoutError:
            return False
        return self.is_open()

    def write(self, command: pb.BaseCommand) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.outbox.put(encode_command(command))

    def write_payload(self, command: pb.BaseCommand, entry: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.outbox.put(encode_payload_command(command, entry, with_checksum=True))

    def write_message(self, command: pb.BaseCommand, entry: bytes) -> None:
        """``write_payload`` of a MESSAGE built in place (``encode_message``)."""
        if self.transport is not None and not self.transport.is_closing():
            self.outbox.put(encode_message(command, entry))

    def _transport_write(self, data: bytes) -> None:
        """The outbox's way out: the transport, while it is open."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- limits on what a connection holds --------------------------------------------

    def _hold_partial_frame(self, *, started_anew: bool) -> bool:
        """Account the decoder's incomplete frame against the broker's budget and start
        its clock; False (the connection is closing) when it does not fit."""
        held = self.decoder.buffered
        if not self._budget.resize(self._partial_held, held):
            log.warning(
                "closing connection %s: its incomplete frame of %d bytes would take the partial "
                "frames of all connections over their budget of %d bytes",
                self._peer(), held, self._budget.limit_bytes)
            self._release_partial_frame()
            self.close()
            return False
        self._partial_held = held
        if not held:
            self._partial_since = None
        elif started_anew or self._partial_since is None:
            self._partial_since = self._loop.time()
            if self._partial_timer is None:
                self._partial_timer = self._loop.call_later(self.limits.frame_timeout_s, self._check_partial_frame)
        return True

    def _release_partial_frame(self) -> None:
        """The connection is closing: give its buffered bytes back to the budget and to the
        allocator now (the protocol object itself may live on until a cyclic GC pass)."""
        self._budget.resize(self._partial_held, 0)
        self._partial_held = 0
        self._partial_since = None
        self.decoder.release()

    def _check_partial_frame(self) -> None:
        self._partial_timer = None
        if self._partial_since is None or self.transport is None:
            return
        waited = self._loop.time() - self._partial_since
        if waited < self.limits.frame_timeout_s:
            self._partial_timer = self._loop.call_later(self.limits.frame_timeout_s - waited, self._check_partial_frame)
            return
        log.warning("closing connection %s: a frame stayed incomplete for %.1f s", self._peer(), waited)
        self.close()

    def _check_connected(self) -> None:
        if not self.connected and self.transport is not None:
            log.warning("closing connection %s: no CONNECT within %.1f s", self._peer(), self.limits.connect_timeout_s)
            self.close()

    def peer_address(self) -> str:
        """The client's address as Pulsar's stats write it: ``/host:port``."""
        return f"/{self._peer()}"

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def _check_alive(self) -> None:
        if self._loop.time() - self._last_received > 2 * KEEPALIVE_INTERVAL_S:
            log.info("closing silent connection %s", self.service_url)
            self.close()
            return
        self.write(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()))
        self._keepalive = self._loop.call_later(KEEPALIVE_INTERVAL_S, self._check_alive)

    # -- dispatching commands -----------------------------------------------------------

    def _handle(self, frame: Frame) -> None:
        command = frame.command
        if not self.connected and command.type != T.CONNECT:
            log.warning("closing connection: %s before CONNECT", T.Type.Name(command.type))
            self.close()
            return
        handler = self._handlers.get(command.type)
        try:
            problem = frame_problem(frame) if handler is not None else None
            if problem is not None:
                self._refuse(command, request_id_of(command), problem)
            elif handler is None:
                self._unsupported(command, request_id_of(command))
            else:
                handler(command, frame)
        except CompactionServiceError as error:
            self._error(request_id_of(command), error)
        except Exception as error:  # never a traceback to the client: log it, answer ERROR
            log.exception("failed to handle %s", T.Type.Name(command.type))
            self._error(request_id_of(command), error)

    def _refuse(self, command: pb.BaseCommand, request_id: int | None, error: BrokerError) -> None:
        """Answer a command that ``frame_problem`` refused, as a failure of that command
        only; nothing it asked for is created. A refused SEND answers ChecksumError: the
        only code the client answers by failing that message rather than resending it."""
        name = T.Type.Name(command.type)
        log.info("refusing %s: %s", name, error)
        if command.type == T.SEND:
            self._send_error(command.send.producer_id, command.send.sequence_id, "ChecksumError", str(error))
        elif command.type == T.LOOKUP:
            self._lookup_failed(command.lookupTopic.request_id, error)
        elif command.type == T.PARTITIONED_METADATA:
            self._partitioned_metadata_failed(command.partitionMetadata.request_id, error)
        elif command.type in (T.GET_SCHEMA, T.GET_OR_CREATE_SCHEMA):
            self.write(refused_response(command, error))
        elif command.type == T.CONNECT:
            log.warning("closing connection: %s", error)
            self.close()
        elif request_id is not None:
            self._error(request_id, error)

    def _unsupported(self, command: pb.BaseCommand, request_id: int | None) -> None:
        name = T.Type.Name(command.type)
        if command.type in CONNECTION_COMMANDS:
            log.warning("closing connection: unexpected %s from a client", name)
            self.close()
        elif request_id is not None:
            self._error(request_id, NotAllowedError(f"{name} is not supported by compactd"))
        else:
            log.info("ignoring unsupported %s", name)

    def _error(self, request_id: int | None, error: BaseException) -> None:
        code = getattr(error, "code", "UnknownError") if isinstance(error, BrokerError) else "UnknownError"
        if isinstance(error, CompactionServiceError) and not isinstance(error, BrokerError):
            code = "MetadataError"
        if request_id is None:
            log.warning("request without id failed: %s", error)
            return
        failure = pb.CommandError(request_id=request_id, error=server_error(code), message=str(error))
        self.write(pb.BaseCommand(type=T.ERROR, error=failure))

    def _success(self, request_id: int) -> None:
        self.write(pb.BaseCommand(type=T.SUCCESS, success=pb.CommandSuccess(request_id=request_id)))

    # -- handshake and lookup -----------------------------------------------------------

    def _connect(self, command: pb.BaseCommand, frame: Frame) -> None:
        if not admit(self, self.broker.access, command.connect):  # refused: answered and closed
            return
        version = min(command.connect.protocol_version or PROTOCOL_VERSION, PROTOCOL_VERSION)
        connected = pb.CommandConnected(server_version="compactd", protocol_version=version,
                                        max_message_size=MESSAGE_BYTES_MAX)
        self.connected = True
        self.client_version = command.connect.client_version
        self.write(pb.BaseCommand(type=T.CONNECTED, connected=connected))

    def _partitioned_metadata(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.partitionMetadata
        try:
            name = self.broker.topic_name(request.topic)
            self.broker.access.check_topic(self.role, request.topic, *LOOKUP_ACTIONS)  # api.auth: grants
        except BrokerError as error:
            self._partitioned_metadata_failed(request.request_id, error)
            return
        response = pb.CommandPartitionedTopicMetadataResponse(
            request_id=request.request_id, partitions=self.broker.partitioned.partitions(name),
            response=pb.CommandPartitionedTopicMetadataResponse.Success)
        self.write(pb.BaseCommand(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=response))

    def _partitioned_metadata_failed(self, request_id: int, error: BrokerError) -> None:
        response = pb.CommandPartitionedTopicMetadataResponse(
            request_id=request_id, response=pb.CommandPartitionedTopicMetadataResponse.Failed,
            error=server_error(error.code), message=str(error))
        self.write(pb.BaseCommand(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=response))

    def _lookup(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.lookupTopic
        try:
            self.broker.topic_name(request.topic)
            self.broker.access.check_topic(self.role, request.topic, *LOOKUP_ACTIONS)  # api.auth: grants
        except BrokerError as error:
            self._lookup_failed(request.request_id, error)
            return
        response = pb.CommandLookupTopicResponse(
            request_id=request.request_id, response=pb.CommandLookupTopicResponse.Connect,
            brokerServiceUrl=self.service_url, brokerServiceUrlTls=self.service_url,
            authoritative=True, proxy_through_service_url=False)
        self.write(pb.BaseCommand(type=T.LOOKUP_RESPONSE, lookupTopicResponse=response))

    def _lookup_failed(self, request_id: int, error: BrokerError) -> None:
        response = pb.CommandLookupTopicResponse(
            request_id=request_id, response=pb.CommandLookupTopicResponse.Failed,
            error=server_error(error.code), message=str(error))
        self.write(pb.BaseCommand(type=T.LOOKUP_RESPONSE, lookupTopicResponse=response))

    def _topics_of_namespace(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.getTopicsOfNamespace
        self.broker.access.check_namespace(self.role, request.namespace, "consume")  # api.auth: grants
        topics = self.broker.list_topics(request.namespace)
        response = pb.CommandGetTopicsOfNamespaceResponse(request_id=request.request_id, topics=topics)
        self.write(pb.BaseCommand(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE, getTopicsOfNamespaceResponse=response))

    def _ping(self, command: pb.BaseCommand, frame: Frame) -> None:
        self.write(pb.BaseCommand(type=T.PONG, pong=pb.CommandPong()))

    def _pong(self, command: pb.BaseCommand, frame: Frame) -> None:
        pass  # any data received counts as the client's being alive

    # -- schemas (api.wire.schema_commands) ------------------------------------------------

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

    # -- consumers ----------------------------------------------------------------------

    def _subscribe(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.subscribe
        if not ready_to_create(self, frame, request.topic, "consume", self.creating_consumers,
                               request.consumer_id, request.request_id):
            return
        self.creating_consumers.check(request.consumer_id, request.request_id)  # NotAllowed: closed while it waited
        topic = self.broker.get_topic(request.topic)
        check_subscribe_schema(self.broker, topic, request)  # IncompatibleSchema
        consumer = WireConsumer(self, request.consumer_id, request.consumer_name, request.priority_level)
        if request.subType == pb.CommandSubscribe.Key_Shared:
            consumer.key_shared_policy = KeySharedPolicy.from_wire(
                request.keySharedMeta if request.HasField("keySharedMeta") else None)
        start = from_message_id(request.start_message_id) if request.HasField("start_message_id") else None
        initial = InitialPosition.EARLIEST if request.initialPosition == 1 else InitialPosition.LATEST
        subscription = topic.subscribe(
            request.subscription, consumer, SubType(request.subType),
            durable=request.durable if request.HasField("durable") else True,
            initial_position=initial, start=start, read_compacted=request.read_compacted,
        )
        consumer.topic, consumer.subscription = topic, subscription
        consumer.partition = -1 if (index := partition_index(topic.name)) is None else index
        self.consumers[request.consumer_id] = consumer
        answer_when_written(self._loop, self, subscription.cursor.when_written(), request.request_id,  # cursor durable
                            lambda: detach(self.consumers, consumer, topic, subscription))

    def _consumer(self, consumer_id: int) -> WireConsumer:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise NotAllowedError(f"no consumer {consumer_id} on this connection")
        return consumer

    def _flow(self, command: pb.BaseCommand, frame: Frame) -> None:
        consumer = self.consumers.get(command.flow.consumer_id)
        if consumer is not None and consumer.subscription is not None:
            consumer.subscription.flow(consumer, command.flow.messagePermits)

    def _ack(self, command: pb.BaseCommand, frame: Frame) -> None:
        ack = command.ack
        consumer = self.consumers.get(ack.consumer_id)
        if consumer is not None and consumer.subscription is not None:
            consumer.subscription.acknowledge_message_ids(
                [(from_message_id(m), m.ack_set) for m in ack.message_id],
                cumulative=ack.ack_type == pb.CommandAck.Cumulative)
        if ack.HasField("request_id"):  # the receipt: once durable with no rate limit, else now
            cursor = consumer.subscription.cursor if consumer is not None and consumer.subscription else None
            answer_ack(self._loop, self, cursor, ack.consumer_id, ack.request_id)

    def _ack_response(self, consumer_id: int, request_id: int, error: BaseException | None = None) -> None:
        response = pb.CommandAckResponse(consumer_id=consumer_id, request_id=request_id)
        if error is not None:
            response.error, response.message = server_error("MetadataError"), str(error)
        self.write(pb.BaseCommand(type=T.ACK_RESPONSE, ackResponse=response))

    def _redeliver(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.redeliverUnacknowledgedMessages
        consumer = self.consumers.get(request.consumer_id)
        if consumer is not None and consumer.subscription is not None:
            positions = [from_message_id(m) for m in request.message_ids] or None
            consumer.subscription.redeliver(consumer, positions)

    def _seek(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.seek
        consumer = self._consumer(request.consumer_id)
        assert consumer.topic is not None and consumer.subscription is not None
        if request.HasField("message_publish_time"):
            position = self.broker.find_by_publish_time(consumer.topic, request.message_publish_time)
        else:
            position = from_message_id(request.message_id)
        consumer.subscription.seek(position)  # CLOSE_CONSUMER to every consumer first
        answer_when_written(self._loop, self, consumer.subscription.cursor.when_written(), request.request_id)

    def _get_last_message_id(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.getLastMessageId
        consumer = self._consumer(request.consumer_id)
        assert consumer.topic is not None and consumer.subscription is not None
        last = consumer.subscription.last_message_id()
        response = pb.CommandGetLastMessageIdResponse(
            request_id=request.request_id, last_message_id=to_message_id(last),
            consumer_mark_delete_position=to_message_id(consumer.subscription.cursor.mark_delete_position),
        )
        if consumer.partition >= 0:  # the ids it delivered carry the index; the client compares them whole
            response.last_message_id.partition = response.consumer_mark_delete_position.partition = consumer.partition
        self.write(pb.BaseCommand(type=T.GET_LAST_MESSAGE_ID_RESPONSE, getLastMessageIdResponse=response))

    def _unsubscribe(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.unsubscribe
        consumer = self._consumer(request.consumer_id)
        assert consumer.topic is not None and consumer.subscription is not None
        consumer.topic.unsubscribe(consumer.subscription, consumer)
        self.consumers.pop(request.consumer_id, None)
        answer_when_written(self._loop, self, consumer.subscription.cursor.when_written(), request.request_id)

    def _close_consumer(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.close_consumer
        self.creating_consumers.close(request.consumer_id)
        consumer = self.consumers.pop(request.consumer_id, None)
        if consumer is not None and consumer.topic is not None and consumer.subscription is not None:
            consumer.topic.remove_consumer(consumer.subscription, consumer)
        self._success(request.request_id)

