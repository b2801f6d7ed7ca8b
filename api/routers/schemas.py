"""Schemas of a topic and the schema compatibility strategy of a topic and a namespace.

Pulsar's schema paths (the registry entry of a partition is its base topic's)::

    GET    /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema            the latest version
    GET    /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema/{version}  one version
    POST   /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema            register (as a producer)
    DELETE /admin/v2/schemas/{tenant}/{namespace}/{topic}/schema            delete every version

A POST is checked as a producer's schema is: 409 when the strategy refuses it, 400 when an
AVRO or JSON definition is not an Avro schema. A GET or DELETE of a topic without (live)
schema answers 404. The strategy, a JSON string of Pulsar's names (``FULL`` by default)::

    GET|PUT|POST|DELETE /admin/v2/namespaces/{tenant}/{namespace}/schemaCompatibilityStrategy
    GET|PUT|POST|DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}/schemaCompatibilityStrategy

GET answers 204 with no body when none is set at that level. The topic need not exist (a
schema or strategy may be set before the first producer, and on a partitioned topic).

FastAPI resolves the annotations of the strategy handlers, closures made per scope, when
they are defined: so this module does without ``from __future__ import annotations``.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Response
from fastapi.responses import JSONResponse

from api.auth.rest import topic_grant
from api.broker.access import LOOKUP_ACTIONS
from api.broker.off_loop import write_off_loop
from api.broker.schemas import (
    STRATEGY_POLICY,
    TYPE_NAMES,
    IncompatibleSchemaError,
    InvalidSchemaError,
    SchemaData,
    SchemaRegistry,
    StoredSchema,
    schema_base,
)
from api.broker.topic_name import TopicName
from api.routers.common import (
    TOPIC_PATH,
    AdminDependency,
    TopicFromPath,
    errors,
    namespace_from_path,
)
from api.schemas import SchemaInfo, SchemaStrategyName, SchemaUpload, SchemaVersion

__all__ = ["router"]

router = APIRouter()

SCHEMA_PATH = "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema"
NAMESPACE_STRATEGY_PATH = "/admin/v2/namespaces/{tenant}/{namespace}/" + STRATEGY_POLICY
TOPIC_STRATEGY_PATH = f"{TOPIC_PATH}/{STRATEGY_POLICY}"
_TYPE_NUMBERS = {name: number for number, name in TYPE_NAMES.items()}
_C404 = "The topic has no (live) schema, or not that version."


async def _registry(admin: AdminDependency) -> SchemaRegistry:
    registry = getattr(admin.broker, "schemas", None)
    if not isinstance(registry, SchemaRegistry):
        raise HTTPException(503, "The schema registry is not available")
    return registry


Registry = Annotated[SchemaRegistry, Depends(_registry)]


def _name(topic: str) -> TopicName:
    return TopicName.parse(topic)  # 412 for a bad name


def _info(stored: StoredSchema) -> SchemaInfo:
    return SchemaInfo(version=stored.version, type=stored.schema.type_name, timestamp=stored.timestamp_ms,
                      data=stored.schema.data.decode("utf-8", "replace"), properties=stored.schema.properties)


@router.get(SCHEMA_PATH, response_model=SchemaInfo, tags=["schemas"], summary="Get the latest schema",
            openapi_extra=topic_grant(*LOOKUP_ACTIONS),
            responses={200: {"description": "The latest live version."}, **errors(404, 412, c404=_C404)})
async def get_schema(registry: Registry, topic: TopicFromPath) -> SchemaInfo:
    """The latest version of the topic's schema."""
    return _info(registry.get(_name(topic)))


@router.get(SCHEMA_PATH + "/{version}", response_model=SchemaInfo, tags=["schemas"],
            openapi_extra=topic_grant(*LOOKUP_ACTIONS),
            summary="Get one version of the schema",
            responses={200: {"description": "That version."}, **errors(400, 404, 412, c404=_C404)})
async def get_schema_version(registry: Registry, topic: TopicFromPath,
                             version: Annotated[int, Path(ge=0, le=2**63 - 1, description="The version.")]
                             ) -> SchemaInfo:
    """Version ``version`` of the topic's schema."""
    return _info(registry.get(_name(topic), version))


@router.post(SCHEMA_PATH, response_model=SchemaVersion, tags=["schemas"], summary="Upload a schema",
             openapi_extra=topic_grant("produce"),
             responses={200: {"description": "The version registered, or the existing equal one."},
                        **errors(400, 409, 412, c409="The topic's compatibility strategy refuses the schema.",
                                 c400="Malformed body, or an AVRO/JSON definition that is not an Avro schema.")})
async def upload_schema(registry: Registry, topic: TopicFromPath,
                        payload: SchemaUpload) -> SchemaVersion:
    """Register a schema as a producer with it would; an equal live version is reused."""
    schema = SchemaData(_TYPE_NUMBERS[payload.type], payload.schema_.encode("utf-8"), payload.properties)
    try:
        return SchemaVersion(version=await write_off_loop(registry.put_if_absent, _name(topic), schema))
    except InvalidSchemaError:
        raise
    except IncompatibleSchemaError as error:
        raise HTTPException(409, str(error)) from None


@router.delete(SCHEMA_PATH, response_model=SchemaVersion, tags=["schemas"], summary="Delete the schema",
               responses={200: {"description": "Every version is deleted; the last version number."},
                          **errors(404, 412, c404=_C404)})
async def delete_schema(registry: Registry, topic: TopicFromPath) -> SchemaVersion:
    """Delete every version; the next schema is registered as if the topic had none."""
    return SchemaVersion(version=await write_off_loop(registry.delete, _name(topic)))


async def _topic_scope(topic: TopicFromPath) -> str:
    return schema_base(_name(topic))  # a partition's strategy is its base topic's


def _add_strategy_routes(path: str, where: str, scope_of: Callable[..., Awaitable[str]]) -> None:
    Scope = Annotated[str, Depends(scope_of)]
    common: dict[str, Any] = {"tags": [f"{where} policies"], "response_class": Response}

    async def get(registry: Registry, scope: Scope) -> Response:
        value = registry.policies.get_policy(scope, STRATEGY_POLICY)
        return Response(status_code=204) if value is None else JSONResponse(value)

    async def put(registry: Registry, scope: Scope,
                  value: Annotated[SchemaStrategyName, Body(description="The strategy name.")]) -> Response:
        await write_off_loop(registry.policies.set_policy, scope, STRATEGY_POLICY, value)
        return Response(status_code=204)

    async def remove(registry: Registry, scope: Scope) -> Response:
        await write_off_loop(registry.policies.remove_policy, scope, STRATEGY_POLICY)
        return Response(status_code=204)

    router.add_api_route(path, get, methods=["GET"], **common, name=f"get_{where}_schema_strategy",
                         summary=f"Get the {where} schema compatibility strategy",
                         description="Pulsar's name of the strategy set at this level, as a JSON string.",
                         responses={200: {"description": "The strategy set.",
                                          "content": {"application/json": {"schema": {"type": "string"}}}},
                                    204: {"description": "None is set at this level."}, **errors(412)})
    for method in ("PUT", "POST"):
        router.add_api_route(path, put, methods=[method], status_code=204, **common,
                             name=f"set_{where}_schema_strategy_{method.lower()}",
                             summary=f"Set the {where} schema compatibility strategy",
                             description="The body is a JSON string: one of Pulsar's strategy names.",
                             responses={204: {"description": "Set."}, **errors(400, 412)})
    router.add_api_route(path, remove, methods=["DELETE"], status_code=204, **common,
                         name=f"remove_{where}_schema_strategy",
                         summary=f"Remove the {where} schema compatibility strategy",
                         description="Unset it: the next level's strategy (broker default FULL) applies.",
                         responses={204: {"description": "Removed (also when none was set)."}, **errors(412)})


_add_strategy_routes(NAMESPACE_STRATEGY_PATH, "namespace", namespace_from_path)
_add_strategy_routes(TOPIC_STRATEGY_PATH, "topic", _topic_scope)
