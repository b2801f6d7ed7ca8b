"""Partitioned topics: create, read, grow and delete a parent, list them, their stats.

Pulsar's paths and answers (``api.broker.partitions`` has the rules)::

    PUT    …/{topic}/partitions          body: N (a bare JSON integer) → 204
    GET    …/{topic}/partitions          {"partitions": N}, 0 for a topic that is not partitioned
    POST   …/{topic}/partitions          body: a larger N → 204
    DELETE …/{topic}/partitions          → 204 (the partitions and their data go too)
    POST   …/{topic}/createMissedPartitions → 204
    GET    …/{tenant}/{namespace}/partitioned  the parents of the namespace
    GET    …/{topic}/partitioned-stats   summed stats, ``metadata.partitions``, each partition's

``GET …/partitions`` is also what a client on the HTTP service URL asks before it looks a
topic up (``pulsar.Client("http://…")``), so a topic of a missing namespace answers 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from pydantic import StrictInt

from api.auth.rest import topic_grant
from api.broker.access import LOOKUP_ACTIONS
from api.broker.off_loop import write_off_loop
from api.broker.topic_name import TopicName
from api.routers.common import (
    PERSISTENT_PREFIX,
    TOPIC_PATH,
    AdminDependency,
    NamespaceFromPath,
    TopicFromPath,
    errors,
    no_content,
)

__all__ = ["router"]

router = APIRouter(tags=["partitioned topics"])

PARTITIONS_PATH = TOPIC_PATH + "/partitions"
Count = Annotated[StrictInt, Body(description="The number of partitions, a bare JSON integer (e.g. `4`).")]


@no_content(router.put, PARTITIONS_PATH, "Create a partitioned topic",
            errors(400, 404, 406, 409, 412,
                   c404="The namespace does not exist.",
                   c406="The count is 0 or less, or above `max_num_partitions_per_partitioned_topic`.",
                   c409="A partitioned or non-partitioned topic of that name exists.",
                   c412="The name is not valid or contains `-partition-`."),
            done="Created, with its partitions.")
async def create_partitioned_topic(admin: AdminDependency, topic: TopicFromPath, count: Count) -> None:
    """Create the partitioned topic and its partitions `<topic>-partition-0` … `-partition-<N-1>`."""
    await write_off_loop(admin.broker.partitioned.create, admin, topic, count)


@router.get(
    PARTITIONS_PATH, summary="Partitioned topic metadata", openapi_extra=topic_grant(*LOOKUP_ACTIONS),
    responses={200: {"description": "`{\"partitions\": N}`; 0 for a topic that is not partitioned."},
               **errors(404, 412, c404="The namespace does not exist.")},
)
async def get_partitioned_topic_metadata(admin: AdminDependency, topic: TopicFromPath) -> dict[str, int]:
    """The number of partitions of the topic (what PARTITIONED_METADATA answers)."""
    name = TopicName.parse(topic)
    admin.check_namespace(name)
    return {"partitions": admin.broker.partitioned.partitions(name)}


@no_content(router.post, PARTITIONS_PATH, "Grow a partitioned topic",
            errors(400, 404, 406, 409, 412,
                   c404="The partitioned topic does not exist.",
                   c406="The count is 0 or less, or above the limit.",
                   c409="The count does not grow."),
            done="Updated; the new partitions exist.")
async def update_partitioned_topic(admin: AdminDependency, topic: TopicFromPath, count: Count) -> None:
    """Raise the number of partitions (it never shrinks); clients pick the new partitions
    up at their next metadata poll."""
    await write_off_loop(admin.broker.partitioned.update, admin, topic, count)


@no_content(router.delete, PARTITIONS_PATH, "Delete a partitioned topic",
            errors(404, 409, 412,
                   c404="The partitioned topic does not exist.",
                   c409="A compaction of a partition is running.",
                   c412="A partition has producers or consumers attached, or the name is not valid."),
            done="Deleted, with every partition.")
async def delete_partitioned_topic(admin: AdminDependency, topic: TopicFromPath) -> None:
    """Delete the partitioned topic, its partitions (ledgers, cursors, compacted ledgers)
    and its topic policies; nothing is deleted when any partition is busy."""
    await admin.broker.partitioned.delete(admin, topic)


@no_content(router.post, TOPIC_PATH + "/createMissedPartitions", "Create missing partitions",
            errors(404, 412), done="Every partition exists.")
async def create_missed_partitions(admin: AdminDependency, topic: TopicFromPath) -> None:
    """Create any partition of the partitioned topic that does not exist."""
    await write_off_loop(admin.broker.partitioned.create_missing, admin, topic)


@router.get(
    PERSISTENT_PREFIX + "/{tenant}/{namespace}/partitioned", response_model=list[str],
    summary="List the partitioned topics of a namespace",
    responses={200: {"description": "Full names of the namespace's partitioned topics."}, **errors(412)},
)
async def list_partitioned_topics(admin: AdminDependency, namespace: NamespaceFromPath) -> list[str]:
    """Every partitioned topic of `tenant/namespace` (the parents, not their partitions)."""
    return admin.broker.partitioned.in_namespace(namespace)


@router.get(
    TOPIC_PATH + "/partitioned-stats", summary="Stats of a partitioned topic",
    responses={200: {"description": "Counters summed over the partitions, `metadata.partitions`, "
                                    "and each partition's stats under `partitions`."},
               **errors(400, 404, 412, c400="`perPartition` is not a boolean.",
                        c404="The partitioned topic does not exist.")},
)
async def partitioned_stats(admin: AdminDependency, topic: TopicFromPath,
                            perPartition: Annotated[bool, Query(
                                description="Include each partition's stats.")] = True) -> dict[str, Any]:
    """Pulsar's `PartitionedTopicStats`: the fields compactd keeps, summed over the partitions."""
    partitioned = admin.broker.partitioned
    name = partitioned.required(topic)
    return partitioned.stats(admin, name, per_partition=perPartition)
