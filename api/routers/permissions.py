"""Permissions: the produce/consume grants of roles on a namespace or a topic (Pulsar's paths).

::

    GET    /admin/v2/namespaces/{tenant}/{namespace}/permissions           {"role": ["consume", …]}
    POST   /admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}    body ["produce", "consume"]
    DELETE /admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}
    GET    /admin/v2/persistent/{tenant}/{namespace}/{topic}/permissions
    POST   /admin/v2/persistent/{tenant}/{namespace}/{topic}/permissions/{role}
    DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}/permissions/{role}

A POST replaces the role's actions on that scope; DELETE takes them all away (204 also when
it had none). The topic need not exist yet: a grant may come before the first producer. A
topic's grants go with the topic when it is deleted; a namespace's stay. The grants are
``api.broker.grants`` on the broker's metadata database; ``api.broker.access`` enforces
them when ``--authorization-enabled``. Like every admin route these are super-user only
then (``api.auth.rest``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Path, Request

from api.broker.access import AccessControl
from api.broker.grants import ACTIONS, GrantStore, InvalidActionError
from api.broker.off_loop import write_off_loop
from api.broker.topic_name import TopicName, parse_namespace
from api.routers.common import TOPIC_PATH, Namespace, Tenant, TopicFromPath, errors, no_content

__all__ = ["router"]

router = APIRouter(tags=["permissions"])

NAMESPACE_PERMISSIONS = "/admin/v2/namespaces/{tenant}/{namespace}/permissions"
TOPIC_PERMISSIONS = TOPIC_PATH + "/permissions"
Role = Annotated[str, Path(description="The role (a token's `sub`, a client certificate's CN).", min_length=1)]
Actions = Annotated[list[str], Body(description=f"Actions to grant: any of {', '.join(ACTIONS)}.",
                                    examples=[["produce", "consume"]])]


def _grants(request: Request) -> GrantStore:
    access = getattr(request.app.state.broker, "access", None)
    if not isinstance(access, AccessControl) or access.grants is None:
        raise HTTPException(503, "The broker service is not available")
    return access.grants


async def _grant(grants: GrantStore, scope: str, role: str, actions: list[str]) -> None:
    try:
        await write_off_loop(grants.grant, scope, role, actions)
    except InvalidActionError as error:
        raise HTTPException(400, str(error)) from None


@router.get(NAMESPACE_PERMISSIONS, summary="The grants on a namespace", responses=errors(412))
async def namespace_permissions(request: Request, tenant: Tenant, namespace: Namespace) -> dict[str, list[str]]:
    """Role -> actions granted on the namespace (its topics' own grants not included)."""
    return _grants(request).of_scope(parse_namespace(f"{tenant}/{namespace}"))


@no_content(router.post, NAMESPACE_PERMISSIONS + "/{role}", "Grant a role actions on a namespace", errors(400, 412))
async def grant_namespace(request: Request, tenant: Tenant, namespace: Namespace, role: Role,
                          actions: Actions) -> None:
    """Set the role's actions on every topic of the namespace."""
    await _grant(_grants(request), parse_namespace(f"{tenant}/{namespace}"), role, actions)


@no_content(router.delete, NAMESPACE_PERMISSIONS + "/{role}", "Revoke a role's grant on a namespace", errors(412))
async def revoke_namespace(request: Request, tenant: Tenant, namespace: Namespace, role: Role) -> None:
    """Take every action of the role on the namespace away."""
    await write_off_loop(_grants(request).revoke, parse_namespace(f"{tenant}/{namespace}"), role)


@router.get(TOPIC_PERMISSIONS, summary="The grants on a topic", responses=errors(412))
async def topic_permissions(request: Request, topic: TopicFromPath) -> dict[str, list[str]]:
    """Role -> actions granted on the topic itself (its namespace's grants not included)."""
    return _grants(request).of_scope(str(TopicName.parse(topic)))


@no_content(router.post, TOPIC_PERMISSIONS + "/{role}", "Grant a role actions on a topic", errors(400, 412))
async def grant_topic(request: Request, topic: TopicFromPath, role: Role, actions: Actions) -> None:
    """Set the role's actions on the topic (and its partitions)."""
    scope = str(TopicName.parse(topic))
    await _grant(_grants(request), scope, role, actions)


@no_content(router.delete, TOPIC_PERMISSIONS + "/{role}", "Revoke a role's grant on a topic", errors(412))
async def revoke_topic(request: Request, topic: TopicFromPath, role: Role) -> None:
    """Take every action of the role on the topic away."""
    await write_off_loop(_grants(request).revoke, str(TopicName.parse(topic)), role)
