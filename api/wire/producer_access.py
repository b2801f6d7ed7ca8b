"""The wire side of producer access modes (``api.broker.access_mode`` decides).

``admit_producer`` is called by ``ProducerHandlers._add_producer`` before a producer is
attached. It answers what the client 3.13.0 (C++ core 4.2.0) expects:

* A refusal raises (ProducerBusy, ProducerFenced): the handler answers ERROR, and the
  client fails ``create_producer`` at once (both codes are fatal on creation).
* A WaitForExclusive producer that must wait gets PRODUCER_SUCCESS with
  ``producer_ready=false`` (the client then waits without a timeout), then a second
  PRODUCER_SUCCESS for the same request when it is granted, or ERROR ProducerFenced when
  an ExclusiveWithFencing producer fences it out of the queue.
* A fenced connected producer gets CLOSE_PRODUCER; its client reconnects and, if it was
  exclusive, is refused with ProducerFenced (its topic epoch is old), after which its
  sends fail with ``ProducerFenced``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from api.broker.access_mode import AccessMode, Grant
from api.broker.errors import BrokerError
from api.wire.codec import U64_MAX
from compactor.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.topic import Topic
    from api.wire.producing import ProducerHandlers, WireProducer

__all__ = ["admit_producer", "fence_producer", "with_epoch"]

log = logging.getLogger(__name__)
T = pb.BaseCommand


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
        handlers.write(_success(request, producer.name, -1, None, ready=False))
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
    from api.wire.producing import WireProducer  # producing imports this module

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
    success = _success(request, producer.name, topic.last_sequence_id(producer.name), epoch, ready=True)
    if schema_version is not None:
        success.producer_success.schema_version = schema_version
    handlers.write(success)


def _refused(handlers: ProducerHandlers, request: pb.CommandProducer, producer: WireProducer,
             error: BrokerError) -> None:
    if handlers.producers.get(request.producer_id) is producer:
        del handlers.producers[request.producer_id]
    handlers._error(request.request_id, error)  # the connection's own answer


def _success(request: pb.CommandProducer, name: str, last_sequence_id: int, epoch: int | None, *,
             ready: bool) -> pb.BaseCommand:
    success = pb.CommandProducerSuccess(request_id=request.request_id, producer_name=name,
                                        last_sequence_id=last_sequence_id, producer_ready=ready)
    if epoch is not None:
        success.topic_epoch = epoch
    return T(type=T.PRODUCER_SUCCESS, producer_success=success)
