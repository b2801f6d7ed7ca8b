"""What the routers share: the ``Admin`` dependency, path parameters, documented errors,
the form of a route that answers 204.

A route on ``TOPIC_PATH`` takes the topic as ``topic: TopicFromPath``: the full name
(``persistent://tenant/namespace/topic``) built from the three path parameters, which the
OpenAPI description documents as ``Tenant``, ``Namespace`` and ``TopicPart``; a route on a
namespace takes it as ``NamespaceFromPath`` (``tenant/namespace``, both parts validated).
A route whose success is an empty 204 (Pulsar's answer to a change) is declared with
``no_content``; its handler returns None.

The admin core is reached through ``AdminDependency`` (``broker.admin`` of the broker
service on ``app.state``), so tests may swap it with ``app.dependency_overrides``. Route
handlers and dependencies are ``async`` and call the core directly: the application runs
on the broker's event loop (``api.server``), where the core must be called (FastAPI would
run a plain ``def`` in a worker thread); what commits (a topic's load, a metadata write)
the core moves off the loop and the handler awaits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request, Response
from fastapi.types import DecoratedCallable

from api.broker.admin import Admin
from api.schemas import ErrorBody

__all__ = [
    "PERSISTENT_PREFIX",
    "TOPIC_PATH",
    "AdminDependency",
    "Namespace",
    "NamespaceFromPath",
    "Tenant",
    "TopicFromPath",
    "TopicPart",
    "errors",
    "get_admin",
    "namespace_from_path",
    "no_content",
    "topic_name",
]

PERSISTENT_PREFIX = "/admin/v2/persistent"
TOPIC_PATH = PERSISTENT_PREFIX + "/{tenant}/{namespace}/{topic}"

Tenant = Annotated[str, Path(description="Tenant, e.g. `public`.")]
Namespace = Annotated[str, Path(description="Namespace within the tenant, e.g. `default`.")]
TopicPart = Annotated[str, Path(description="Local name of the persistent topic.")]

_ERROR_DESCRIPTIONS = {
    400: "Malformed request: the body is not JSON of the expected type.",
    404: "The topic (or subscription) does not exist.",
    405: "The operation is not allowed on this topic or subscription.",
    406: "The value is not acceptable (e.g. a partition count of 0 or less).",
    409: "Conflict with the current state.",
    412: "A name or value is not valid (e.g. `Topic name is not valid`, a negative threshold), "
         "or a precondition failed.",
    500: "Internal error (logged by the broker).",
    503: "The broker service is not available.",
}


def errors(*codes: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for error ``codes``, each with Pulsar's ``{"reason"}`` body;
    ``descriptions`` (``c409="…"``) override the generic text of a code."""
    return {
        code: {"model": ErrorBody, "description": descriptions.get(f"c{code}", _ERROR_DESCRIPTIONS[code])}
        for code in (*codes, 500)
    }


def no_content(route: Callable[..., Callable[[DecoratedCallable], DecoratedCallable]], path: str, summary: str,
               responses: dict[int | str, dict[str, Any]], *, done: str | None = None,
               **options: Any) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """The decorator of a route that answers 204 with no body when it succeeds (its handler
    returns None): ``route`` is the router's method (``router.put``), ``responses`` its error
    answers (``errors(…)``), ``done`` what its 204 means (FastAPI's default text when None);
    ``options`` go to ``route`` as they are (``tags``, ``openapi_extra``)."""
    described: dict[int | str, dict[str, Any]] = {204: {"description": done}} if done is not None else {}
    return route(path, status_code=204, response_class=Response, summary=summary,
                 responses={**described, **responses}, **options)


async def get_admin(request: Request) -> Admin:
    """The broker's admin core; 503 when the application was built without a broker. On a
    topic's path, the topic (a partitioned parent's opened partitions) is loaded first, off
    the event loop (``Admin.preload``), so that the operation finds it loaded."""
    admin = getattr(request.app.state.broker, "admin", None)
    if not isinstance(admin, Admin):
        raise HTTPException(503, "The broker service is not available")
    params = request.path_params
    if "tenant" in params and "namespace" in params and "topic" in params:
        await admin.preload(topic_name(params["tenant"], params["namespace"], params["topic"]))
    return admin


AdminDependency = Annotated[Admin, Depends(get_admin)]


def topic_name(tenant: str, namespace: str, topic: str) -> str:
    """The full name of the persistent topic a path names (validated by the core)."""
    return f"persistent://{tenant}/{namespace}/{topic}"


async def _topic_from_path(tenant: Tenant, namespace: Namespace, topic: TopicPart) -> str:
    return topic_name(tenant, namespace, topic)


TopicFromPath = Annotated[str, Depends(_topic_from_path)]


async def namespace_from_path(tenant: Tenant, namespace: Namespace) -> str:
    """``tenant/namespace`` of the path, both parts validated (412 when one is not valid)."""
    return Admin.namespace_scope(tenant, namespace)


NamespaceFromPath = Annotated[str, Depends(namespace_from_path)]
