"""What PRODUCER, SUBSCRIBE and GET_OR_CREATE_SCHEMA need done off the event loop first.

Their handlers are synchronous and run on the broker's event loop; what they would commit
there is done beforehand, off the loop, and the command is handled again once it is done:

* the topic's load (``BrokerService.load_topic``: its first ledger, its internal cursors,
  the de-duplication replay), when the topic is not loaded; for a PRODUCER, a
  de-duplication start in flight (its PRODUCER_SUCCESS carries the producer's last
  sequence id, which only a started de-duplication knows);
* for a PRODUCER, a topic whose roll-over failed (a full disk): the producer is taken only
  once the topic stores appends again (``ManagedLedger.ready_for_appends``, whose tries
  back off). Its request waits meanwhile, trying again as the back-off allows, for at most
  ``STORAGE_WAIT_S``, and is then refused ``PersistenceError`` (retriable: the client
  asks again). A reconnecting client whose sends failed so waits, and its send timeout
  runs out, instead of being taken, failed and reconnected ten times a second (each
  reconnect restarts the C++ client's send timer: its sends would never time out); once
  space frees, the next try succeeds and the waiting request is answered at once;
* a PRODUCER's schema registration (``SchemaRegistry.put_if_absent``), when the schema is
  not registered yet; a SUBSCRIBE's schema registered on an idle topic without one
  (``SchemaRegistry.check_consumer``); GET_OR_CREATE_SCHEMA's registration. These go to the
  metadata writer thread (``api.broker.off_loop``).

``deferred`` answers whether the command waits (True: it is handled again later, from a
task, through the connection's ``_handle``, so its refusals are answered as ever); its
second pass finds the work done (reads only) and goes on synchronously. A failure of the
work is the command's answer (ERROR with the error's code, e.g. TopicNotFound, NotAllowed,
IncompatibleSchema), as the synchronous handler would have answered it.

``Creations`` remembers which producer (consumer) ids of a connection wait that way: a
CLOSE_PRODUCER (CLOSE_CONSUMER) that comes meanwhile — a client that gave up on the
creation — marks it, and the second pass then refuses it instead of attaching a producer
(consumer) nobody holds, whose name (or Exclusive subscription) would stay taken until
the connection closed (Pulsar's broker fails the pending creation the same way).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from api.broker.errors import BrokerError, NotAllowedError, StorageUnavailableError
from api.broker.off_loop import write_off_loop
from api.broker.schemas import schema_base
from api.broker.topic_name import TopicName
from api.wire.codec import request_id_of, server_error
from api.wire.schema_commands import get_or_create_schema_response, schema_data
from ledger.errors import CompactionServiceError, LedgerError
from message.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from api.broker.service import BrokerService
    from api.broker.topic import Topic
    from api.wire.frames import Frame
    from ledger.managed_ledger import ManagedLedger

__all__ = ["Creations", "deferred", "get_or_create_schema", "ready_to_create"]

log = logging.getLogger(__name__)
T = pb.BaseCommand

STORAGE_WAIT_S = 25.0  # a PRODUCER waits this long, at most, for its topic to store appends again: under
# the clients' default operation timeout (30 s), so a client that waits all along fails no request
STORAGE_POLL_MIN_S = 0.1  # the least wait between two looks at a topic that cannot store appends


class Creations:
    """Producer or consumer ids whose creation waits off the loop (see the module docstring).
    A close marks the request that was waiting, not the id: a client retrying with the
    same id sends a new request, which a mark left by the abandoned one never refuses."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "producer" or "consumer": for the refusal's message
        self._waiting: dict[int, int] = {}  # waiting id -> its request id
        self._closed: set[int] = set()  # request ids of creations closed while they waited

    def waiting(self, ident: int, request_id: int) -> None:
        """The creation ``request_id`` of ``ident`` waits."""
        self._waiting[ident] = request_id

    def close(self, ident: int) -> None:
        """A close of ``ident`` came: refuse its waiting creation, if any."""
        request_id = self._waiting.pop(ident, None)
        if request_id is not None:
            self._closed.add(request_id)

    def check(self, ident: int, request_id: int) -> None:
        """The creation ``request_id`` of ``ident`` goes on: ``NotAllowedError`` if it was
        closed while it waited."""
        if self._waiting.get(ident) == request_id:
            del self._waiting[ident]
        if request_id in self._closed:
            self._closed.discard(request_id)
            raise NotAllowedError(f"{self.kind} {ident} was closed while it was being created")


class Preparing(Protocol):
    """What this module needs of the connection (``api.wire.connection.ServerConnection``)."""

    broker: BrokerService
    role: str | None
    _loop: asyncio.AbstractEventLoop

    def is_open(self) -> bool: ...

    def write(self, command: pb.BaseCommand) -> None: ...

    def _handle(self, frame: Frame) -> None: ...

    def _error(self, request_id: int | None, error: BaseException) -> None: ...


def deferred(connection: Preparing, frame: Frame) -> bool:
    """True when ``frame`` waits for work off the loop and is handled again once it is done."""
    work = _work(connection.broker, frame.command)
    if work is None:
        return False
    task = connection._loop.create_task(_then_handle(connection, frame, work))
    task.add_done_callback(lambda done: done.cancelled() or done.exception())  # answered inside
    return True


def ready_to_create(connection: Preparing, frame: Frame, topic: str, action: str, creations: Creations,
                    ident: int, request_id: int) -> bool:
    """The start of PRODUCER (``action`` produce) and SUBSCRIBE (consume): the connection's
    role must hold ``action`` on ``topic`` (``AuthorizationError`` otherwise). False when
    the frame waits for the topic's load or a schema's registration off the loop first
    (``creations`` notes the creation ``ident`` waiting; the frame is handled again)."""
    connection.broker.access.check_topic(connection.role, topic, action)  # api.auth: grants
    if deferred(connection, frame):
        creations.waiting(ident, request_id)
        return False
    return True


def get_or_create_schema(connection: Preparing, frame: Frame) -> None:
    """GET_OR_CREATE_SCHEMA: answered once its registration (if any) is done off the loop."""
    if not deferred(connection, frame):
        connection.write(get_or_create_schema_response(connection.broker, frame.command.getOrCreateSchema))


def _work(broker: BrokerService, command: pb.BaseCommand) -> Awaitable[object] | None:
    """The work off the loop that ``command`` needs first, or None."""
    if command.type == T.PRODUCER:
        request = command.producer
        name, loaded = _loaded(broker, request.topic)
        if loaded is None:
            return broker.load_topic(request.topic)
        if loaded.deduplication_starting:  # PRODUCER_SUCCESS carries its last sequence id
            return loaded.deduplication_settled()
        if request.HasField("schema") and broker.schemas.registered(name, schema_data(request.schema)) is None:
            return write_off_loop(broker.schemas.put_if_absent, name, schema_data(request.schema))
        ledger = loaded.ledger
        ready = ledger.ready_for_appends()
        if not ready.done() or ready.exception() is not None:
            return _stores_appends(str(name), ledger, ready)
    elif command.type == T.SUBSCRIBE:
        subscribe = command.subscribe
        name, topic = _loaded(broker, subscribe.topic)
        if topic is None:
            return broker.load_topic(subscribe.topic)
        if subscribe.HasField("schema") and not broker.schemas.versions(schema_base(name)):
            in_use = (topic.ledger.number_of_entries > 0 or bool(topic.producers)
                      or any(s.consumers for s in topic.subscriptions.values()))
            if not in_use:
                return write_off_loop(broker.schemas.check_consumer, name, schema_data(subscribe.schema),
                                      in_use=False)
    elif command.type == T.GET_OR_CREATE_SCHEMA:
        create = command.getOrCreateSchema
        try:
            name = broker.topic_name(create.topic)
        except CompactionServiceError:
            return None  # refused by its handler, in its own response
        if broker.schemas.registered(name, schema_data(create.schema)) is None:
            return write_off_loop(broker.schemas.put_if_absent, name, schema_data(create.schema))
    return None


def _loaded(broker: BrokerService, topic: str) -> tuple[TopicName, Topic | None]:
    """``topic``'s name and its loaded ``Topic``, or None when it is not loaded and may be
    (``BrokerService.check_loadable``: a refusal raises, and is answered at once)."""
    name = TopicName.parse(topic)
    loaded = broker.registry.get(str(name))
    if loaded is None:
        broker.check_loadable(name, create=True)
    return name, loaded


async def _stores_appends(topic: str, ledger: ManagedLedger, ready: Future[None]) -> None:
    """Return once ``ledger`` stores appends, looking again (``ready_for_appends``: a try once
    its back-off allows) for at most ``STORAGE_WAIT_S``; then ``StorageUnavailableError``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STORAGE_WAIT_S
    poll_s = max(ledger.config.roll_over_retry_ms / 1000, STORAGE_POLL_MIN_S)
    while True:
        try:
            await asyncio.wrap_future(ready)
            return
        except LedgerError as error:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise StorageUnavailableError(f"topic {topic} cannot store messages now: {error}") from error
        await asyncio.sleep(min(poll_s, remaining_s))
        ready = ledger.ready_for_appends()


async def _then_handle(connection: Preparing, frame: Frame, work: Awaitable[object]) -> None:
    try:
        await work
    except Exception as error:
        if not isinstance(error, CompactionServiceError):
            log.exception("failed to prepare %s", T.Type.Name(frame.command.type))
        if not connection.is_open():
            return
        if frame.command.type == T.GET_OR_CREATE_SCHEMA:  # its own response, never a bare ERROR
            code = error.code if isinstance(error, BrokerError) else "MetadataError"
            response = pb.CommandGetOrCreateSchemaResponse(
                request_id=frame.command.getOrCreateSchema.request_id, error_code=server_error(code),
                error_message=str(error))
            connection.write(pb.BaseCommand(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=response))
        else:
            connection._error(request_id_of(frame.command), error)
        return
    if connection.is_open():
        connection._handle(frame)
