"""Subscriptions and loading of a topic: list, peek, reset, clear the backlog, unload,
last message id (Pulsar's admin v2 paths; the operations are ``api.broker.admin_topics``).

Peek answers the entry's payload (``application/octet-stream``, decompressed; a batch's
whole body) with its metadata in headers: ``X-Pulsar-Message-ID`` (``ledger:entry``),
``X-Pulsar-publish-time`` (ms since epoch), ``X-Pulsar-producer-name``,
``X-Pulsar-partition-key`` (when it has one), ``X-Pulsar-num-batch-message`` (for a batch)
and one ``X-Pulsar-PROPERTY-<name>`` per property.
"""

from __future__ import annotations

import asyncio
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Body, Path, Response

from api.broker.admin_topics import TopicOperations
from api.routers.common import TOPIC_PATH, AdminDependency, TopicFromPath, errors, no_content
from api.schemas import JAVA_LONG_MAX, MessageIdData, ResetCursorData
from ledger.position import Position

__all__ = ["router"]

router = APIRouter(tags=["subscriptions"])

SUBSCRIPTION_PATH = TOPIC_PATH + "/subscription/{subscription}"
Subscription = Annotated[str, Path(description="The subscription's name.")]


@router.get(
    TOPIC_PATH + "/subscriptions", response_model=list[str],
    summary="List the subscriptions of a topic",
    responses={200: {"description": "The subscription names (`__compaction` included)."}, **errors(404, 412)},
)
async def list_subscriptions(admin: AdminDependency, topic: TopicFromPath) -> list[str]:
    """Every durable subscription of the topic, sorted."""
    return TopicOperations(admin).subscriptions(topic)


@router.get(
    SUBSCRIPTION_PATH + "/position/{messagePosition}", response_class=Response,
    summary="Peek the n-th unacknowledged message of a subscription",
    responses={200: {"description": "The entry's payload; its id and metadata are in `X-Pulsar-*` headers.",
                     "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
               **errors(400, 404, 412, c404="The topic or subscription does not exist, or there are not "
                                            "that many unacknowledged messages.")},
)
async def peek_message(admin: AdminDependency, topic: TopicFromPath,
                       subscription: Subscription,
                       messagePosition: Annotated[int, Path(ge=1, le=JAVA_LONG_MAX,
                                                            description="1 for the first unacknowledged.")],
                       ) -> Response:
    """The `messagePosition`-th entry after the subscription's mark-delete position, not
    acknowledged; nothing moves."""
    peeked = TopicOperations(admin).peek(topic, subscription, messagePosition)
    headers = {
        "X-Pulsar-Message-ID": str(peeked.position),
        "X-Pulsar-publish-time": str(peeked.publish_time_ms),
        "X-Pulsar-producer-name": quote(peeked.producer_name, safe=""),
    }
    if peeked.key is not None:
        headers["X-Pulsar-partition-key"] = quote(peeked.key, safe="")
    if peeked.batch_size is not None:
        headers["X-Pulsar-num-batch-message"] = str(peeked.batch_size)
    for name, value in peeked.properties.items():
        headers[f"X-Pulsar-PROPERTY-{quote(name, safe='')}"] = quote(value, safe="")
    return Response(content=peeked.payload, media_type="application/octet-stream", headers=headers)


@no_content(router.post, SUBSCRIPTION_PATH + "/resetcursor/{timestamp}", "Reset a subscription to a publish time",
            errors(400, 404, 412), done="Reset.")
async def reset_cursor_to_time(admin: AdminDependency, topic: TopicFromPath,
                               subscription: Subscription,
                               timestamp: Annotated[int, Path(ge=0, le=JAVA_LONG_MAX,
                                                              description="Milliseconds since the epoch.")],
                               ) -> None:
    """The subscription reads next the first message published at or after `timestamp`
    (the end of the topic when none is); its consumers are disconnected and subscribe again."""
    await asyncio.wrap_future(TopicOperations(admin).reset_cursor(
        topic, subscription, timestamp_ms=timestamp))  # durable, off the loop


@no_content(router.post, SUBSCRIPTION_PATH + "/resetcursor", "Reset a subscription to a message id",
            errors(400, 404, 412), done="Reset.")
async def reset_cursor_to_message(admin: AdminDependency, topic: TopicFromPath, subscription: Subscription,
                                  message_id: Annotated[ResetCursorData, Body()]) -> None:
    """The subscription reads next from the message id (just after it with `isExcluded`);
    its consumers are disconnected and subscribe again."""
    await asyncio.wrap_future(TopicOperations(admin).reset_cursor(
        topic, subscription,
        position=Position(message_id.ledgerId, message_id.entryId), excluded=message_id.isExcluded))


@no_content(router.post, SUBSCRIPTION_PATH + "/skip_all", "Clear the backlog of a subscription",
            errors(404, 412), done="Everything stored so far is acknowledged.")
async def skip_all(admin: AdminDependency, topic: TopicFromPath, subscription: Subscription) -> None:
    """Acknowledge every message stored so far (`pulsar-admin topics clear-backlog`)."""
    await asyncio.wrap_future(TopicOperations(admin).skip_all(topic, subscription))


@no_content(router.put, TOPIC_PATH + "/unload", "Unload a topic",
            errors(404, 409, 412, c409="A compaction of the topic is in flight."),
            done="Unloaded; the next use loads it again.")
async def unload(admin: AdminDependency, topic: TopicFromPath) -> None:
    """Disconnect the topic's producers and consumers (clients reconnect), seal its current
    ledger and drop it from memory."""
    await TopicOperations(admin).unload(topic)  # durable, off the loop


@router.get(
    TOPIC_PATH + "/lastMessageId", response_model=MessageIdData,
    summary="Last message id of a topic",
    responses={200: {"description": "The id of the last stored message (entryId -1 when none)."},
               **errors(404, 412)},
)
async def last_message_id(admin: AdminDependency, topic: TopicFromPath) -> MessageIdData:
    """The last stored message's id; a batch's last slot has `batchIndex`."""
    return MessageIdData.model_validate(TopicOperations(admin).last_message_id(topic))
