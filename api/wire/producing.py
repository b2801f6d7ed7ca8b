"""The producer side of a Pulsar connection: PRODUCER, SEND and CLOSE_PRODUCER.

``ProducerHandlers`` is mixed into ``ServerConnection`` (``api.wire.connection``), which
supplies the transport, the loop and the answers. Rules it keeps:

* A producer name is held by one producer of a topic: a PRODUCER naming one held over
  another connection first checks that connection's liveness (a PING answered within
  ``LIVENESS_TIMEOUT_S``, as Pulsar 3 does); a live holder gets the newcomer refused with
  ProducerBusy, a dead or closing one gives the name up.
* The chunks of a chunked message are checked together (``api.wire.chunk_door``) before
  one is stored; a refused one answers SEND_ERROR as ``api.wire.validate``'s refusals do.
* SEND receipts go back in send order per producer, each only once the entry is durable;
  a checksum mismatch answers SEND_ERROR ``ChecksumError`` and stores nothing; a failed
  append answers SEND_ERROR ``PersistenceError``, and so does every later send of that
  producer session (``ProducerSession.failed``), so that the client, which reconnects,
  sends them all again in order.
* Access modes (Exclusive, WaitForExclusive, ExclusiveWithFencing) are decided before a
  producer is attached (the access-mode section below, ``api.broker.access_mode``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from api.broker.access_mode import AccessMode, Grant
from api.broker.dedup import ProducerSession
from api.broker.errors import BrokerError, ProducerBusyError
from api.broker.topic_stats import RateCounter, connected_since
from api.wire.chunk_door import may_be_chunk
from api.wire.codec import U64_MAX, server_error, to_message_id
from api.wire.connection_part import ConnectionPart
from api.wire.frames import Frame
from api.wire.outbox import Outbox
from api.wire.preparing import Creations, ready_to_create
from api.wire.schema_commands import producer_schema_version
from ledger.errors import CompactionServiceError, LedgerError
from ledger.position import Position
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.topic import Topic
    from api.wire.limits import Connections

__all__ = ["LIVENESS_TIMEOUT_S", "ProducerHandlers", "SendCompletions", "WireProducer"]

log = logging.getLogger(__name__)

LIVENESS_TIMEOUT_S = 5.0  # Pulsar's connectionLivenessCheckTimeoutMillis
T = pb.BaseCommand


class _Peer(Protocol):
    """What a producer needs of the connection it came over."""

    service_url: str
    client_version: str

    def peer_address(self) -> str: ...
    def disconnect_producer(self, producer: WireProducer) -> None: ...
    def is_open(self) -> bool: ...
    async def is_alive(self, timeout_s: float) -> bool: ...
    def close(self) -> None: ...
    def fence(self, producer: WireProducer) -> None: ...


class WireProducer:
    """A producer attached over a connection: its session and its receipts in send order."""

    def __init__(self, connection: _Peer, producer_id: int, name: str, topic: Topic) -> None:
        self.connection = connection
        self.producer_id = producer_id
        self.name = name
        self.topic = topic
        self.session = ProducerSession()
        self.receipts: deque[tuple[int, int, Future[Position]]] = deque()
        self.counter = RateCounter()  # messages stored for this producer
        self.connected_at = time.time()  # shown by describe()

    def disconnect(self) -> None:
        """The broker drops the producer (topic unload): the client re-creates it."""
        self.connection.disconnect_producer(self)

    def describe(self) -> dict[str, object]:
        """Pulsar's ``PublisherStats`` of this producer."""
        rate, throughput = self.counter.rates()
        return {
            "producerId": self.producer_id, "producerName": self.name, "accessMode": "Shared",
            "msgRateIn": rate, "msgThroughputIn": throughput, "averageMsgSize": self.counter.average_size(),
            "address": self.connection.peer_address(), "connectedSince": connected_since(self.connected_at),
            "clientVersion": self.connection.client_version, "metadata": {},
        }


class SendCompletions:
    """Sends whose append ended, handed from the ledger's flusher thread to the event loop.

    One ``call_soon_threadsafe`` (a lock and a write to the loop's wake-up pipe) per send
    cost as much as the rest of a send; a group commit completes many sends at once, so
    they queue here and the loop takes every one queued in one call. On the loop's own
    thread (an append refused at once) a completion is handled at once. Receipts still
    go out in send order: ``_drain_receipts`` answers by the order of ``receipts``.
    With the connection's ``outbox``, the receipts of one call are written together at
    its end (corked), not in a flush scheduled for another turn of the loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_done: Callable[..., None],
                 outbox: Outbox | None = None) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop's thread, with its connection
        self._on_done = on_done
        self._outbox = outbox
        self._queued: deque[tuple[object, ...]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def add(self, *args: object) -> None:
        """``on_done(*args)`` on the event loop, now when called there."""
        if threading.get_ident() == self._loop_thread:
            self._on_done(*args)
            return
        self._queued.append(args)
        with self._lock:
            if self._scheduled:
                return  # the loop's pending call takes this one too
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            self._scheduled = False  # a completion queued from here on schedules a new call
        queued, outbox = self._queued, self._outbox
        if outbox is None:
            while queued:
                self._on_done(*queued.popleft())
            return
        outbox.cork()
        try:
            while queued:
                self._on_done(*queued.popleft())
        finally:
            outbox.uncork()


class ProducerHandlers(ConnectionPart):
    """PRODUCER, SEND and CLOSE_PRODUCER of one connection (see the module docstring)."""

    # supplied by the connection
    connections: Connections
    producers: dict[int, WireProducer]
    creating_producers: Creations
    service_url: str
    client_version: str
    _loop_thread: int
    _completions: SendCompletions

    async def is_alive(self, timeout_s: float) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _producer(self, command: pb.BaseCommand, frame: Frame) -> None:
        request = command.producer
        if not ready_to_create(self, frame, request.topic, "produce", self.creating_producers,
                               request.producer_id, request.request_id):
            return
        topic = self.broker.get_topic(request.topic)
        name = request.producer_name or self.broker.new_producer_name()
        holder = topic.producers.get(name)
        if isinstance(holder, WireProducer) and holder.connection is not self:
            if holder.connection.is_open():
                self.creating_producers.waiting(request.producer_id, request.request_id)
                task = self._loop.create_task(self._producer_after_liveness_check(request, topic, name, holder))
                task.add_done_callback(lambda done: done.cancelled() or done.exception())  # answered inside
                return
            topic.detach_producer(name, holder)  # its connection is going away
        self._add_producer(request, topic, name)

    async def _producer_after_liveness_check(self, request: pb.CommandProducer, topic: Topic, name: str,
                                             holder: WireProducer) -> None:
        """A producer's name is held over another connection: refuse if it is alive."""
        try:
            if await holder.connection.is_alive(LIVENESS_TIMEOUT_S):
                raise ProducerBusyError(f"Producer with name '{name}' is already connected to topic {topic.name}")
            log.info("producer %s: its connection %s is dead, closing it", name, holder.connection.service_url)
            holder.connection.close()
            topic.detach_producer(name, holder)
            self._add_producer(request, topic, name)
        except CompactionServiceError as error:
            self._error(request.request_id, error)
        except Exception as error:  # never a traceback to the client
            log.exception("failed to create producer %s", name)
            self._error(request.request_id, error)

    def _add_producer(self, request: pb.CommandProducer, topic: Topic, name: str) -> None:
        """Attach producer ``name`` (ProducerBusy when this connection holds it already under
        another id) and answer PRODUCER_SUCCESS."""
        if not self.is_open():
            return
        self.creating_producers.check(request.producer_id, request.request_id)  # NotAllowed: closed while it waited
        schema_version = producer_schema_version(self.broker, topic, request)  # IncompatibleSchema
        previous = self.producers.get(request.producer_id)
        producer = WireProducer(self, request.producer_id, name, topic)
        if previous is not None and previous.topic is topic and previous.name == name:
            topic.detach_producer(name, previous)  # the same producer created again
        grant = admit_producer(self, request, topic, producer, schema_version)  # access mode: refuse, queue or grant
        if grant.queued:
            return
        try:
            topic.attach_producer(name, producer)  # ProducerBusy leaves everything as it was
        except ProducerBusyError:
            topic.access.detached(producer, producers_left=True)
            raise
        if previous is not None:
            previous.topic.detach_producer(previous.name, previous)
        self.producers[request.producer_id] = producer
        success = pb.CommandProducerSuccess(request_id=request.request_id, producer_name=name,
                                            last_sequence_id=topic.last_sequence_id(name))
        if schema_version is not None:
            success.schema_version = schema_version
        self.write(pb.BaseCommand(type=T.PRODUCER_SUCCESS, producer_success=with_epoch(success, grant)))

    def fence(self, producer: WireProducer) -> None:
        """An ExclusiveWithFencing producer took the topic: close ``producer`` (``fence_producer``)."""
        fence_producer(self, producer)

    def _send(self, command: pb.BaseCommand, frame: Frame) -> None:
        send = command.send
        producer = self.producers.get(send.producer_id)
        if producer is None or frame.entry is None:
            self._send_error(send.producer_id, send.sequence_id, "NotAllowedError", "unknown producer or no payload")
            return
        if not frame.checksum_ok:
            self._send_error(send.producer_id, send.sequence_id, "ChecksumError", "checksum mismatch")
            return
        if may_be_chunk(frame.entry):
            problem = self.connections.chunks.problem(producer.topic.name, frame.entry)
            if problem is not None:
                log.info("refusing SEND: %s", problem)
                self._send_error(send.producer_id, send.sequence_id, "ChecksumError", str(problem))
                return
        highest = max(send.sequence_id, send.highest_sequence_id) if send.HasField("highest_sequence_id") else send.sequence_id
        if producer.session.failed:  # an earlier send failed: the client re-sends in order
            future: Future[Position] = Future()
            future.set_exception(LedgerError("an earlier send of this producer failed; send again"))
        else:
            future = producer.topic.publish(producer.session, producer.name, send.sequence_id, highest, frame.entry,
                                            messages=send.num_messages)
        producer.receipts.append((send.sequence_id, highest, future))
        messages, size, completions = send.num_messages, len(frame.entry), self._completions
        future.add_done_callback(lambda done: completions.add(producer, done, messages, size))

    def _on_loop(self, callback: Callable[..., None], *args: object) -> None:
        """Run ``callback(*args)`` on the event loop: now when called there, else scheduled."""
        if threading.get_ident() == self._loop_thread:
            callback(*args)
        else:
            self._loop.call_soon_threadsafe(callback, *args)

    def _send_done(self, producer: WireProducer, done: Future[Position], messages: int = 1, size: int = 0) -> None:
        """A send ended: a failure refuses the producer session's later sends (Pulsar closes
        the producer), then receipts go out in order; a stored one counts for the producer."""
        if done.exception() is not None:
            producer.session.failed = True
        else:
            producer.counter.record(messages, size)
        self._drain_receipts(producer)

    def _drain_receipts(self, producer: WireProducer) -> None:
        """Answer completed sends in send order (a later one waits for an earlier one)."""
        while producer.receipts and producer.receipts[0][2].done():
            sequence_id, highest, future = producer.receipts.popleft()
            error = future.exception()
            if error is not None:
                self._send_error(producer.producer_id, sequence_id, "PersistenceError", str(error))
                continue
            receipt = pb.CommandSendReceipt(producer_id=producer.producer_id, sequence_id=sequence_id,
                                            message_id=to_message_id(future.result()), highest_sequence_id=highest)
            self.write(pb.BaseCommand(type=T.SEND_RECEIPT, send_receipt=receipt))

    def _send_error(self, producer_id: int, sequence_id: int, code: str, message: str) -> None:
        error = pb.CommandSendError(producer_id=producer_id, sequence_id=sequence_id,
                                    error=server_error(code), message=message)
        self.write(pb.BaseCommand(type=T.SEND_ERROR, send_error=error))

    def disconnect_producer(self, producer: WireProducer) -> None:
        """Detach ``producer`` and tell its client with CLOSE_PRODUCER (it reconnects)."""
        if self.producers.get(producer.producer_id) is producer:
            del self.producers[producer.producer_id]
        producer.topic.detach_producer(producer.name, producer)
        close = pb.CommandCloseProducer(producer_id=producer.producer_id, request_id=U64_MAX)
        self.write(pb.BaseCommand(type=T.CLOSE_PRODUCER, close_producer=close))

    def _close_producer(self, command: pb.BaseCommand, frame: Frame) -> None:
        self.creating_producers.close(command.close_producer.producer_id)
        producer = self.producers.pop(command.close_producer.producer_id, None)
        if producer is not None:
            producer.topic.detach_producer(producer.name, producer)
        self._success(command.close_producer.request_id)


# -- producer access modes ------------------------------------------------------------
# The wire side of producer access modes (``api.broker.access_mode`` decides).
#
# ``admit_producer`` is called by ``ProducerHandlers._add_producer`` before a producer is
# attached. It answers what the client 3.13.0 (C++ core 4.2.0) expects:
#
# * A refusal raises (ProducerBusy, ProducerFenced): the handler answers ERROR, and the
#   client fails ``create_producer`` at once (both codes are fatal on creation).
# * A WaitForExclusive producer that must wait gets PRODUCER_SUCCESS with
#   ``producer_ready=false`` (the client then waits without a timeout), then a second
#   PRODUCER_SUCCESS for the same request when it is granted, or ERROR ProducerFenced when
#   an ExclusiveWithFencing producer fences it out of the queue.
# * A fenced connected producer gets CLOSE_PRODUCER; its client reconnects and, if it was
#   exclusive, is refused with ProducerFenced (its topic epoch is old), after which its
#   sends fail with ``ProducerFenced``.


def admit_producer(handlers: ProducerHandlers, request: pb.CommandProducer, topic: Topic,
                   producer: WireProducer, schema_version: bytes | None = None) -> Grant:
    """Decide on ``producer`` (see the module docstring); when queued, it is registered on
    ``handlers`` and answered "not ready", and the caller must stop there."""
    mode = AccessMode(request.producer_access_mode)
    epoch = request.topic_epoch if request.HasField("topic_epoch") else None
    grant = topic.access.admit(producer, mode, epoch, list(topic.producers.values()), fence=_fence)
    if grant.queued:
        handlers.producers[request.producer_id] = producer
        topic.access.wait(producer, lambda granted: _ready(handlers, request, topic, producer, granted, schema_version),
                          lambda error: _refused(handlers, request, producer, error))
        log.info("producer %s on %s waits for exclusive access", producer.name, topic.name)
        handlers.write(_producer_success(request, producer.name, -1, None, ready=False))
    return grant


def with_epoch(success: pb.CommandProducerSuccess, grant: Grant) -> pb.CommandProducerSuccess:
    """``success`` carrying the topic epoch of an exclusive grant."""
    if grant.epoch is not None:
        success.topic_epoch = grant.epoch
    return success


def fence_producer(handlers: ProducerHandlers, producer: WireProducer) -> None:
    """Fence ``producer`` of ``handlers``' connection: detached, and closed on the client."""
    if handlers.producers.get(producer.producer_id) is producer:
        del handlers.producers[producer.producer_id]
    producer.topic.detach_producer(producer.name, producer)
    close = pb.CommandCloseProducer(producer_id=producer.producer_id, request_id=U64_MAX)
    handlers.write(T(type=T.CLOSE_PRODUCER, close_producer=close))


def _fence(owner: object) -> None:
    if isinstance(owner, WireProducer):
        owner.connection.fence(owner)


def _ready(handlers: ProducerHandlers, request: pb.CommandProducer, topic: Topic, producer: WireProducer,
           epoch: int, schema_version: bytes | None) -> None:
    """A queued producer got exclusive access: attach it and answer the request again."""
    try:
        topic.attach_producer(producer.name, producer)
    except BrokerError as error:
        topic.access.detached(producer, producers_left=bool(topic.producers))
        _refused(handlers, request, producer, error)
        return
    success = _producer_success(request, producer.name, topic.last_sequence_id(producer.name), epoch, ready=True)
    if schema_version is not None:
        success.producer_success.schema_version = schema_version
    handlers.write(success)


def _refused(handlers: ProducerHandlers, request: pb.CommandProducer, producer: WireProducer,
             error: BrokerError) -> None:
    if handlers.producers.get(request.producer_id) is producer:
        del handlers.producers[request.producer_id]
    handlers._error(request.request_id, error)  # the connection's own answer


def _producer_success(request: pb.CommandProducer, name: str, last_sequence_id: int, epoch: int | None, *,
             ready: bool) -> pb.BaseCommand:
    success = pb.CommandProducerSuccess(request_id=request.request_id, producer_name=name,
                                        last_sequence_id=last_sequence_id, producer_ready=ready)
    if epoch is not None:
        success.topic_epoch = epoch
    return T(type=T.PRODUCER_SUCCESS, producer_success=success)
