"""Topics: list a namespace's topics, create and delete a topic, delete a subscription.

Pulsar's answers: create 204 (409 when it exists), delete 204 (404 missing, 412 while
producers or consumers are attached, 409 while a compaction runs). Deleting a topic deletes
its ledgers and its compacted ledger; deleting the ``__compaction`` subscription drops the
compacted view and deletes its ledger (the next run rebuilds it from the raw topic).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from api.routers.common import (
    PERSISTENT_PREFIX,
    TOPIC_PATH,
    AdminDependency,
    Namespace,
    Tenant,
    TopicFromPath,
    errors,
    no_content,
)

__all__ = ["router"]

router = APIRouter(tags=["topics"])


@router.get(
    PERSISTENT_PREFIX + "/{tenant}/{namespace}", response_model=list[str],
    summary="List the topics of a namespace",
    responses={200: {"description": "Full names of the namespace's persistent topics."}, **errors(412)},
)
async def list_topics(admin: AdminDependency, tenant: Tenant, namespace: Namespace) -> list[str]:
    """Every persistent topic of `tenant/namespace`, as `persistent://tenant/namespace/topic`.
    A namespace without topics answers an empty list."""
    return admin.list_topics(admin.namespace_scope(tenant, namespace))


@no_content(router.put, TOPIC_PATH, "Create a non-partitioned topic",
            errors(412, 409, 404, c409="The topic already exists.", c404="The namespace does not exist."),
            done="Created.")
async def create_topic(admin: AdminDependency, topic: TopicFromPath) -> None:
    """Create the persistent topic (topics are also created on first use by a client)."""
    await admin.create_topic(topic)


@no_content(router.delete, TOPIC_PATH, "Delete a topic",
            errors(404, 412, 409,
                   c404="The topic does not exist.",
                   c412="Producers or consumers are attached, or the name is not valid.",
                   c409="A compaction of the topic is running."),
            done="Deleted, with its ledgers and compacted ledger.")
async def delete_topic(admin: AdminDependency, topic: TopicFromPath) -> None:
    """Delete the topic: its ledgers, cursors and compacted ledger. Refused while clients
    are attached (Pulsar's delete without `force`)."""
    await admin.delete_topic(topic)


@no_content(router.delete, TOPIC_PATH + "/subscription/{subscription}", "Delete a subscription",
            errors(404, 405, 409, 412,
                   c404="The topic or the subscription does not exist.",
                   c409="`__compaction` while a compaction of the topic runs."),
            done="Deleted.")
async def delete_subscription(admin: AdminDependency, topic: TopicFromPath, subscription: str) -> None:
    """Delete the subscription and its cursor; its consumers are disconnected. Deleting
    `__compaction` drops the compacted view and deletes the compacted ledger."""
    await asyncio.wrap_future(admin.delete_subscription(topic, subscription))
