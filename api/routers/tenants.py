"""Clusters, tenants, namespaces and the HTTP lookup, as Pulsar serves them.

::

    GET    /admin/v2/clusters                        [cluster_name]
    GET    /admin/v2/tenants                         tenant names
    GET    /admin/v2/tenants/{tenant}                its TenantInfo
    PUT    /admin/v2/tenants/{tenant}                body: optional TenantInfo → 204 (409 exists)
    DELETE /admin/v2/tenants/{tenant}                → 204 (404 missing, 409 has namespaces)
    GET    /admin/v2/namespaces/{tenant}             ``tenant/namespace`` names (404 missing tenant)
    PUT    /admin/v2/namespaces/{tenant}/{namespace} → 204 (404 missing tenant, 409 exists)
    DELETE /admin/v2/namespaces/{tenant}/{namespace} → 204 (404 missing, 409 has topics)
    GET    /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}
                                                     {"brokerUrl": …}: where the client connects

The lookup answers the Pulsar URL ``api.broker.advertised.broker_service_url`` makes of the
local address this request reached and the broker's Pulsar port, as the binary LOOKUP
does; a topic of a missing namespace answers 404, a non-persistent one 405.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Request
from pydantic import BaseModel, Field

from api.auth.rest import topic_grant
from api.broker.access import LOOKUP_ACTIONS
from api.broker.advertised import broker_service_url, web_service_url
from api.broker.off_loop import write_off_loop
from api.broker.topic_name import TopicName
from api.routers.common import AdminDependency, Namespace, Tenant, TopicPart, errors, no_content

__all__ = ["TenantInfo", "router"]

router = APIRouter()


class TenantInfo(BaseModel):
    """Pulsar's ``TenantInfo`` (compactd keeps it; it enforces neither field)."""

    adminRoles: list[str] = Field(default_factory=list, description="Roles that administer the tenant.")
    allowedClusters: list[str] = Field(default_factory=list,
                                       description="Clusters the tenant may use (default: this cluster).")


@router.get("/admin/v2/clusters", tags=["clusters"], response_model=list[str], summary="List the clusters",
            responses=errors())
async def list_clusters(admin: AdminDependency) -> list[str]:
    """The one cluster this broker is (`cluster_name`)."""
    return [admin.broker.tenants.cluster]


@router.get("/admin/v2/tenants", tags=["tenants"], response_model=list[str], summary="List the tenants",
            responses=errors())
async def list_tenants(admin: AdminDependency) -> list[str]:
    """Every tenant; `public` exists from the first start."""
    return admin.broker.tenants.list_tenants()


@router.get("/admin/v2/tenants/{tenant}", tags=["tenants"], response_model=TenantInfo, summary="Get a tenant",
            responses=errors(404, 412, c404="The tenant does not exist."))
async def get_tenant(admin: AdminDependency, tenant: Tenant) -> TenantInfo:
    """The tenant's admin roles and allowed clusters, as they were given."""
    return TenantInfo.model_validate(admin.broker.tenants.tenant(tenant))


@no_content(router.put, "/admin/v2/tenants/{tenant}", "Create a tenant",
            errors(400, 409, 412, c409="The tenant exists.", c412="The name is not valid."),
            done="Created.", tags=["tenants"])
async def create_tenant(admin: AdminDependency, tenant: Tenant,
                        info: Annotated[TenantInfo | None, Body()] = None) -> None:
    """Create the tenant; the body, Pulsar's `TenantInfo`, is optional."""
    await write_off_loop(admin.broker.tenants.create_tenant, tenant, (info or TenantInfo()).model_dump())


@no_content(router.delete, "/admin/v2/tenants/{tenant}", "Delete a tenant",
            errors(404, 409, 412, c404="The tenant does not exist.", c409="The tenant still has namespaces."),
            done="Deleted.", tags=["tenants"])
async def delete_tenant(admin: AdminDependency, tenant: Tenant) -> None:
    """Delete the tenant once it has no namespaces."""
    await write_off_loop(admin.broker.tenants.delete_tenant, tenant)


@router.get("/admin/v2/namespaces/{tenant}", tags=["namespaces"], response_model=list[str],
            summary="List the namespaces of a tenant",
            responses=errors(404, 412, c404="The tenant does not exist."))
async def list_namespaces(admin: AdminDependency, tenant: Tenant) -> list[str]:
    """The tenant's namespaces as `tenant/namespace`."""
    return admin.broker.tenants.list_namespaces(tenant)


@no_content(router.put, "/admin/v2/namespaces/{tenant}/{namespace}", "Create a namespace",
            errors(404, 409, 412, c404="The tenant does not exist.", c409="The namespace exists."),
            done="Created.", tags=["namespaces"])
async def create_namespace(admin: AdminDependency, tenant: Tenant, namespace: Namespace) -> None:
    """Create `tenant/namespace` (a request body, Pulsar's policies, is ignored)."""
    await write_off_loop(admin.broker.tenants.create_namespace, f"{tenant}/{namespace}")


@no_content(router.delete, "/admin/v2/namespaces/{tenant}/{namespace}", "Delete a namespace",
            errors(404, 409, 412, c404="The namespace does not exist.",
                   c409="The namespace still has topics or partitioned topics."),
            done="Deleted, with its namespace policies.", tags=["namespaces"])
async def delete_namespace(admin: AdminDependency, tenant: Tenant, namespace: Namespace) -> None:
    """Delete the empty namespace (Pulsar's delete without `force`)."""
    name = admin.namespace_scope(tenant, namespace)
    held = admin.list_topics(name) + admin.broker.partitioned.in_namespace(name)
    await write_off_loop(admin.broker.tenants.delete_namespace, name, topics=held)


@router.get("/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}", tags=["lookup"],
            openapi_extra=topic_grant(*LOOKUP_ACTIONS),
            summary="Look a topic up over HTTP",
            responses={200: {"description": "`brokerUrl`: the Pulsar URL of the broker serving the topic."},
                       **errors(404, 405, 412, c404="The namespace does not exist.",
                                c405="Non-persistent topics do not exist in compactd.")})
async def lookup_topic(admin: AdminDependency, request: Request,
                       domain: Annotated[str, Path(description="`persistent` (or `non-persistent`).")],
                       tenant: Tenant, namespace: Namespace, topic: TopicPart) -> dict[str, Any]:
    """Pulsar's `LookupData` for the topic: this broker, on the address the request reached."""
    name = TopicName.parse(f"{domain}://{tenant}/{namespace}/{topic}")
    admin.check_namespace(name)
    server = request.scope.get("server")
    host = server[0] if server else request.url.hostname or ""
    broker = request.app.state.broker
    # The bound Pulsar port (``PulsarBroker.port``); a core without a listener has the setting's.
    port = getattr(broker, "port", 0) or broker.settings.broker_port
    url = broker_service_url(broker.settings, host, port)
    http = (web_service_url(broker.settings, host, server[1] if server else 0) if broker.settings.advertised_address
            else f"{request.url.scheme}://{request.url.netloc}")
    return {"brokerUrl": url, "brokerUrlTls": "", "httpUrl": http, "httpUrlTls": "", "nativeUrl": url}
