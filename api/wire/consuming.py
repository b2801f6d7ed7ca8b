"""The consumer side of a Pulsar connection: SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES,
SEEK, GET_LAST_MESSAGE_ID, UNSUBSCRIBE and CLOSE_CONSUMER, and ``WireConsumer``, the consumer
whose deliveries become MESSAGE frames.

``ConsumerHandlers`` is mixed into ``ServerConnection`` (``api.wire.connection``), which
supplies the transport, the loop and the answers. Rules it keeps:

* SUBSCRIBE is checked for the consume grant and prepared off the loop first
  (``api.wire.preparing.ready_to_create``); its schema is admitted or refused
  IncompatibleSchema (``api.wire.schema_commands.check_subscribe_schema``).
* SUBSCRIBE, SEEK and UNSUBSCRIBE answer SUCCESS once the cursor change is durable,
  committed by the cursor store's thread, never on the event loop (``api.wire.durable``);
  a SUBSCRIBE whose cursor fails to commit is undone before its ERROR.
* SEEK answers CLOSE_CONSUMER to the subscription's consumers *before* SUCCESS, so the
  client flushes its queue and subscribes again from the new position.
* A consumer is ``writable`` only while its connection is open and its write buffer under
  the high-water mark; dispatch sends the others nothing.
* A partition topic's consumer stamps the partition index on the message ids it delivers
  and on GET_LAST_MESSAGE_ID's answer (as Java's broker does).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from api.broker.dispatch import Consumer, Delivery, Subscription, SubType
from api.broker.errors import NotAllowedError
from api.broker.key_shared import KeySharedPolicy
from api.broker.partitions import partition_index
from api.broker.topic_stats import RateCounter, connected_since
from api.wire.codec import U64_MAX, fill_message_id, from_message_id, server_error, to_message_id
from api.wire.connection_part import ConnectionPart
from api.wire.durable import answer_ack, answer_when_written, detach
from api.wire.frames import Frame
from api.wire.preparing import Creations, ready_to_create
from api.wire.schema_commands import check_subscribe_schema
from cursor.cursor import InitialPosition
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.topic import Topic

__all__ = ["ConsumerHandlers", "WireConsumer"]

T = pb.BaseCommand


class _Peer(Protocol):
    """What a consumer needs of the connection it came over."""

    client_version: str
    writing_paused: bool
    consumers: dict[int, WireConsumer]

    def peer_address(self) -> str: ...
    def is_open(self) -> bool: ...
    def write(self, command: pb.BaseCommand) -> None: ...
    def write_message(self, command: pb.BaseCommand, entry: bytes) -> None: ...


class WireConsumer(Consumer):
    """A consumer on a connection: deliveries become MESSAGE frames."""

    def __init__(self, connection: _Peer, consumer_id: int, name: str, priority_level: int) -> None:
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


class ConsumerHandlers(ConnectionPart):
    """The consumer commands of one connection (see the module docstring)."""

    # supplied by the connection
    consumers: dict[int, WireConsumer]
    creating_consumers: Creations
    client_version: str
    writing_paused: bool

    def write_message(self, command: pb.BaseCommand, entry: bytes) -> None:
        raise NotImplementedError

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
