"""One client connection speaking the Pulsar binary protocol (``pulsar-protocol.md`` §2).

This module owns the connection itself: its transport and write path, its limits, the
dispatch of each command to its handler (``HANDLERS``, the one table of command ->
handler), the refusals and error answers, the handshake (CONNECT) and the keep-alive. The
command groups are mixins of ``ServerConnection``, each in its own module:

* producers — PRODUCER, SEND, CLOSE_PRODUCER: ``api.wire.producing`` (ProducerBusy,
  receipts in send order once durable, SEND_ERROR on a failed append);
* consumers — SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, SEEK,
  GET_LAST_MESSAGE_ID, UNSUBSCRIBE, CLOSE_CONSUMER: ``api.wire.consuming`` (cursor changes
  answered once durable, SEEK's CLOSE_CONSUMER before SUCCESS);
* lookup and metadata — PARTITIONED_METADATA, LOOKUP, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA,
  GET_OR_CREATE_SCHEMA: ``api.wire.lookup`` (schemas answered by ``api.wire.schema_commands``).

The connection only translates: frames in, calls on the broker core, frames out. Rules it
keeps for the real ``pulsar-client`` (C++ core 4.2.0):

* CONNECT must come first; anything else before it closes the connection. With
  authentication on, CONNECT must prove a role (``api.wire.auth.admit``: a token, or a
  trusted client certificate's CN) or is answered ERROR AuthenticationError and closed;
  every command that names a topic checks the role's grant on it (``HANDLERS``,
  ``api.broker.access``); a refusal is AuthorizationError in that command's own answer.
* Every command that carries a request id gets an answer; what compactd does not support
  answers ERROR ``NotAllowedError`` (never a connection-killing code such as ServiceNotReady).
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
from collections.abc import Callable
from typing import TYPE_CHECKING

from api.broker.advertised import broker_service_url
from api.broker.errors import BrokerError, NotAllowedError
from api.wire.auth import admit
from api.wire.codec import CONNECTION_COMMANDS, request_id_of, server_error
from api.wire.consuming import ConsumerHandlers, WireConsumer
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
from api.wire.lookup import LookupHandlers
from api.wire.outbox import Outbox
from api.wire.preparing import Creations
from api.wire.producing import ProducerHandlers, SendCompletions, WireProducer
from api.wire.schema_commands import refused_response
from api.wire.validate import frame_problem
from ledger.errors import CompactionServiceError
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.service import BrokerService

__all__ = ["HANDLERS", "KEEPALIVE_INTERVAL_S", "ServerConnection"]

log = logging.getLogger(__name__)

KEEPALIVE_INTERVAL_S = 30.0  # the client's own ping interval; silence for two closes
CLOSE_FLUSH_S = 2.0  # a closed connection's unsent bytes get this long, then it is aborted
PROTOCOL_VERSION = 20  # what pulsar-client 3.13.0 (C++ 4.2.0) speaks
# Consumers stop getting entries while more than this waits in a connection's write buffer
# (asyncio pauses writing above it, resumes at a quarter of it).
WRITE_BUFFER_HIGH_BYTES = 1024 * 1024
T = pb.BaseCommand


# The commands a client may send, each to its handler: a method of ``ServerConnection`` or
# of the mixin that owns its group (named per group below). Those that name a topic check
# the role's grant there (``AccessControl.check_topic``): PARTITIONED_METADATA, LOOKUP and
# GET_SCHEMA need produce or consume, PRODUCER and GET_OR_CREATE_SCHEMA produce, SUBSCRIBE
# consume, GET_TOPICS_OF_NAMESPACE consume on the namespace; the rest act on a producer or
# consumer this connection made, under that grant.
HANDLERS: dict[int, str] = {
    # this module: the handshake and keep-alive
    T.CONNECT: "_connect", T.PING: "_ping", T.PONG: "_pong",
    # api.wire.lookup.LookupHandlers
    T.PARTITIONED_METADATA: "_partitioned_metadata", T.LOOKUP: "_lookup",
    T.GET_TOPICS_OF_NAMESPACE: "_topics_of_namespace", T.GET_SCHEMA: "_get_schema",
    T.GET_OR_CREATE_SCHEMA: "_get_or_create_schema",
    # api.wire.producing.ProducerHandlers
    T.PRODUCER: "_producer", T.SEND: "_send", T.CLOSE_PRODUCER: "_close_producer",
    # api.wire.consuming.ConsumerHandlers
    T.SUBSCRIBE: "_subscribe", T.FLOW: "_flow", T.ACK: "_ack", T.REDELIVER_UNACKNOWLEDGED_MESSAGES: "_redeliver",
    T.SEEK: "_seek", T.GET_LAST_MESSAGE_ID: "_get_last_message_id", T.UNSUBSCRIBE: "_unsubscribe",
    T.CLOSE_CONSUMER: "_close_consumer",
}


class ServerConnection(ProducerHandlers, ConsumerHandlers, LookupHandlers, asyncio.Protocol):
    """The protocol object of one TCP connection: its transport, limits, dispatch, handshake
    and keep-alive; its command groups are ``ProducerHandlers``, ``ConsumerHandlers`` and
    ``LookupHandlers``."""

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

    # -- handshake and keep-alive -------------------------------------------------------

    def _connect(self, command: pb.BaseCommand, frame: Frame) -> None:
        if not admit(self, self.broker.access, command.connect):  # refused: answered and closed
            return
        version = min(command.connect.protocol_version or PROTOCOL_VERSION, PROTOCOL_VERSION)
        connected = pb.CommandConnected(server_version="compactd", protocol_version=version,
                                        max_message_size=MESSAGE_BYTES_MAX)
        self.connected = True
        self.client_version = command.connect.client_version
        self.write(pb.BaseCommand(type=T.CONNECTED, connected=connected))

    def _ping(self, command: pb.BaseCommand, frame: Frame) -> None:
        self.write(pb.BaseCommand(type=T.PONG, pong=pb.CommandPong()))

    def _pong(self, command: pb.BaseCommand, frame: Frame) -> None:
        pass  # any data received counts as the client's being alive
