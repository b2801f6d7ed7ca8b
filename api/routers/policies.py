"""Compaction policies of a topic and of a namespace: GET, POST (set), DELETE (remove).

For each policy of ``api.schemas.POLICIES`` — Pulsar's ``compactionThreshold``,
``deduplicationEnabled``, ``offloadThreshold`` and ``offloadDeletionLagMs`` and, beyond Pulsar, ``minCleanableDirtyRatio``,
``maxCompactionLagMs``, ``deleteRetentionMs``, ``minCompactionLagMs``,
``compactionMaxBytesPerSecond`` — at::

    /admin/v2/persistent/{tenant}/{namespace}/{topic}/<name>     (the topic must exist)
    /admin/v2/namespaces/{tenant}/{namespace}/<name>

The POST body (PUT too for the two offload policies, as Pulsar sets them) is a bare JSON
value, validated here: an integer in [0, 2^63-1] (the offload policies: any Java long,
negative meaning off), for the ratio a number in [0, 1], for a switch true or false. A value of the wrong type answers 400, one out of range 412
(Pulsar's "compactionThreshold must be 0 or more"). GET of an unset policy answers 204
with no body. The topic policy wins over the namespace policy, which wins over the broker
default (``compactor.runs.scheduler.effective_threshold``).

(No ``from __future__ import annotations`` here: the handlers are built per policy and
scope in closures, and FastAPI must resolve their annotations at definition.)
"""

from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Response
from fastapi.responses import JSONResponse
from pydantic import StrictBool, StrictFloat, StrictInt

from api.routers.common import (
    TOPIC_PATH,
    AdminDependency,
    TopicFromPath,
    errors,
    namespace_from_path,
)
from api.schemas import JAVA_LONG_MAX, JAVA_LONG_MIN, POLICIES, PolicySpec

__all__ = ["NAMESPACE_PATH", "router"]

router = APIRouter()

NAMESPACE_PATH = "/admin/v2/namespaces/{tenant}/{namespace}"
ScopeDependency = Callable[..., Awaitable[str]]


async def _topic_scope(admin: AdminDependency, topic: TopicFromPath) -> str:
    return admin.topic_scope(topic)


def _add_routes(spec: PolicySpec, path: str, scope_of: ScopeDependency, where: str, not_found: tuple[int, ...]) -> None:
    tags: list[str | Enum] = [f"{where} policies"]
    value_schema = {"type": {"long": "integer", "signed": "integer", "ratio": "number", "bool": "boolean"}[spec.kind]}

    @router.get(path, tags=tags, response_class=Response, summary=f"Get the {where} {spec.summary}",
                description=f"{spec.description}\n\nAnswers 204 with no body when the {where} has none set.",
                responses={200: {"description": "The value set.", "content": {"application/json": {"schema": value_schema}}},
                           204: {"description": "No value is set."}, **errors(*not_found, 412)},
                name=f"get_{where}_{spec.name}")
    async def get_policy(admin: AdminDependency, scope: Annotated[str, Depends(scope_of)]) -> Response:
        value = admin.get_policy(scope, spec.name)
        return Response(status_code=204) if value is None else JSONResponse(value)

    async def set_policy(admin: AdminDependency, scope: str, value: Any) -> Response:
        await admin.set_policy(scope, spec.name, value)
        return Response(status_code=204)

    post = router.post(path, tags=tags, status_code=204, response_class=Response,
                       summary=f"Set the {where} {spec.summary}", description=spec.description,
                       responses={204: {"description": "Set."}, **errors(400, *not_found, 412)},
                       name=f"set_{where}_{spec.name}")
    if spec.kind == "long":
        @post
        async def set_long(admin: AdminDependency, scope: Annotated[str, Depends(scope_of)],
                           value: Annotated[StrictInt, Body(ge=0, le=JAVA_LONG_MAX, description=spec.summary)]) -> Response:
            return await set_policy(admin, scope, value)
    elif spec.kind == "signed":
        async def set_signed(admin: AdminDependency, scope: Annotated[str, Depends(scope_of)],
                             value: Annotated[StrictInt, Body(ge=JAVA_LONG_MIN, le=JAVA_LONG_MAX,
                                                              description=spec.summary)]) -> Response:
            return await set_policy(admin, scope, value)

        post(set_signed)
        # Pulsar sets its namespace offload policies with PUT: the same handler on PUT.
        router.put(path, tags=tags, status_code=204, response_class=Response,
                   summary=f"Set the {where} {spec.summary} (as POST)", description=spec.description,
                   responses={204: {"description": "Set."}, **errors(400, *not_found, 412)},
                   name=f"put_{where}_{spec.name}")(set_signed)
    elif spec.kind == "bool":
        @post
        async def set_bool(admin: AdminDependency, scope: Annotated[str, Depends(scope_of)],
                           value: Annotated[StrictBool, Body(description=spec.summary)]) -> Response:
            return await set_policy(admin, scope, value)
    else:
        @post
        async def set_ratio(admin: AdminDependency, scope: Annotated[str, Depends(scope_of)],
                            value: Annotated[StrictFloat, Body(ge=0, le=1, allow_inf_nan=False,
                                                               description=spec.summary)]) -> Response:
            return await set_policy(admin, scope, value)

    @router.delete(path, tags=tags, status_code=204, response_class=Response,
                   summary=f"Remove the {where} {spec.summary}",
                   description=f"Unset it: the {'namespace policy' if where == 'topic' else 'broker default'} applies again.",
                   responses={204: {"description": "Removed (also when none was set)."}, **errors(*not_found, 412)},
                   name=f"remove_{where}_{spec.name}")
    async def remove_policy(admin: AdminDependency, scope: Annotated[str, Depends(scope_of)]) -> Response:
        await admin.remove_policy(scope, spec.name)
        return Response(status_code=204)


for _spec in POLICIES:
    _add_routes(_spec, f"{TOPIC_PATH}/{_spec.name}", _topic_scope, "topic", (404,))
    _add_routes(_spec, f"{NAMESPACE_PATH}/{_spec.name}", namespace_from_path, "namespace", ())
