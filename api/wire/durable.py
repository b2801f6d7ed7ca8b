"""Answers that wait until a cursor change is durable: SUBSCRIBE, SEEK, UNSUBSCRIBE, and
an ack receipt (ACK_RESPONSE) when acknowledgements are written at once.

The broker core never commits a cursor on the event loop: a subscription's creation, a
seek's reset and an unsubscribe's deletion change memory and are queued for the cursor
store's thread (``cursor.store``), which hands back a future of the commit
(``ManagedCursor.when_written``). ``answer_when_written`` sends the command's SUCCESS once that
future resolves, from the event loop, so a client that got SUCCESS knows the new cursor
state survives a crash (kill -9); the loop goes on serving everything else meanwhile. When
the write fails, the command is answered ERROR (``MetadataError``) after ``undo``: a
SUBSCRIBE's consumer is detached (the store retries the queued creation later; the client
subscribes again).

An ACK asking for a receipt (``request_id`` set) is answered by ``answer_ack``: with
``--managed-ledger-mark-delete-rate-limit 0`` (``ManagedCursor.writes_acks_at_once``) only
once the acknowledgement is committed, so a received ACK_RESPONSE means it survives kill -9;
with a rate limit, at once, as Pulsar does: the acknowledgement is applied in memory and
written by the next scheduled persist (a crash before it redelivers the message). A failed
write answers ACK_RESPONSE with the error (``MetadataError``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from api.broker.consumer import Consumer
    from api.broker.dispatch import Subscription
    from api.broker.topic import Topic
    from cursor.cursor import ManagedCursor

__all__ = ["AckAnswering", "Answering", "answer_ack", "answer_when_written", "detach"]

log = logging.getLogger(__name__)


class Answering(Protocol):
    """What an answer needs of the connection (``api.wire.connection.ServerConnection``)."""

    def _success(self, request_id: int) -> None: ...

    def _error(self, request_id: int | None, error: BaseException) -> None: ...


class AckAnswering(Protocol):
    """What an ack receipt needs of the connection."""

    def _ack_response(self, consumer_id: int, request_id: int, error: BaseException | None = None) -> None: ...


def answer_when_written(loop: asyncio.AbstractEventLoop, connection: Answering, written: Future[None],
                        request_id: int, undo: Callable[[], None] | None = None) -> None:
    """SUCCESS for ``request_id`` once ``when_written`` resolves (at once when it is done), on
    ``loop``; ERROR after ``undo()`` when it fails."""

    def settle(error: BaseException | None) -> None:
        if error is None:
            connection._success(request_id)
            return
        log.warning("request %d: the cursor change could not be persisted: %s", request_id, error)
        if undo is not None:
            undo()
        connection._error(request_id, error)

    _on_loop(loop, written, settle, request_id)


def answer_ack(loop: asyncio.AbstractEventLoop, connection: AckAnswering, cursor: ManagedCursor | None,
               consumer_id: int, request_id: int) -> None:
    """ACK_RESPONSE for an ACK just applied to ``cursor`` (None: the consumer is gone):
    once the acknowledgement is committed when ``cursor.writes_acks_at_once``, else now."""
    if cursor is None or not cursor.writes_acks_at_once:
        connection._ack_response(consumer_id, request_id)
        return

    def settle(error: BaseException | None) -> None:
        if error is not None:
            log.warning("ack %d: the acknowledgement could not be persisted: %s", request_id, error)
        connection._ack_response(consumer_id, request_id, error)

    _on_loop(loop, cursor.when_written(), settle, request_id)


def _on_loop(loop: asyncio.AbstractEventLoop, written: Future[None],
             settle: Callable[[BaseException | None], None], request_id: int) -> None:
    """``settle(error)`` on ``loop`` once ``written`` resolves (now when it is done)."""
    if written.done():
        settle(written.exception())
        return

    def from_writer(done: Future[None]) -> None:  # on the cursor store's thread
        try:
            loop.call_soon_threadsafe(settle, done.exception())
        except RuntimeError:  # the loop is closed: the connection is gone with it
            log.debug("request %d: not answered, the event loop is closed", request_id)

    written.add_done_callback(from_writer)


C = TypeVar("C", bound="Consumer")


def detach(consumers: dict[int, C], consumer: C, topic: Topic, subscription: Subscription) -> None:
    """Undo a SUBSCRIBE whose cursor could not be written: ``consumer`` leaves its
    connection's ``consumers`` (if still there) and ``subscription``."""
    if consumers.get(consumer.consumer_id) is consumer:
        del consumers[consumer.consumer_id]
        topic.remove_consumer(subscription, consumer)
