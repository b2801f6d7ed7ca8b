"""``compactd admin`` verbs for partitioned topics, tenants and namespaces (as pulsar-admin).

Registered on ``api.admin_cli``'s groups when that module is loaded::

    compactd admin topics create-partitioned-topic -p N TOPIC
    compactd admin topics update-partitioned-topic -p N TOPIC
    compactd admin topics get-partitioned-topic-metadata TOPIC
    compactd admin topics delete-partitioned-topic TOPIC
    compactd admin topics list-partitioned-topics NAMESPACE
    compactd admin topics partitioned-stats TOPIC
    compactd admin tenants list | create TENANT | delete TENANT
    compactd admin namespaces list TENANT | create NAMESPACE | delete NAMESPACE

Each is one request to the admin REST API (``api.routers.partitions``,
``api.routers.tenants``); failures print ``error: <reason> (HTTP <code>)`` and exit 1.

(No ``from __future__ import annotations``: typer reads the annotations as live objects.)
"""

import re
from typing import Annotated

import typer

from api.admin_cli import (
    Namespace,
    Topic,
    _add_request_verb,
    _call,
    _namespace,
    _parsed,
    _target_argument,
    _topic,
    app,
    namespace_topics_path,
    namespaces,
    topics,
)

__all__ = ["parse_partitions", "tenant_path", "tenants"]

_PART = re.compile(r"^[A-Za-z0-9_.=:\-]+$")

tenants = typer.Typer(name="tenants", no_args_is_help=True, help="Operations on tenants.")
app.add_typer(tenants)

Partitions = Annotated[str, typer.Option("--partitions", "-p", metavar="N",
                                         help="The number of partitions (1 or more).")]
TenantName = Annotated[str, _target_argument("tenant")]


def tenant_path(text: str) -> str:
    """``/admin/v2/tenants/<tenant>`` of a valid tenant name; ``ValueError`` otherwise."""
    name = text.strip()
    if not _PART.match(name):
        raise ValueError(f"invalid tenant {text!r}: expected a name of letters, digits and _ . = : -")
    return f"/admin/v2/tenants/{name}"


def parse_partitions(text: str) -> int:
    """The partition count ``text``: a whole number, 1 or more; ``ValueError`` otherwise."""
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"invalid number of partitions {text!r}: expected a whole number, 1 or more")
    return int(text)


def _partitions(text: str) -> int:
    return _parsed(parse_partitions, text, "'--partitions'")


def _tenant(text: str) -> str:
    return _parsed(tenant_path, text, "'TENANT'")


# -- partitioned topics ----------------------------------------------------------------


@topics.command("create-partitioned-topic")
def create_partitioned_topic(ctx: typer.Context, topic: Topic, partitions: Partitions) -> None:
    """Create a partitioned topic with N partitions (HTTP 409 when it exists)."""
    _call(ctx, "PUT", f"{_topic(topic)}/partitions", body=_partitions(partitions), has_body=True)


@topics.command("update-partitioned-topic")
def update_partitioned_topic(ctx: typer.Context, topic: Topic, partitions: Partitions) -> None:
    """Raise the number of partitions of a partitioned topic (it never shrinks)."""
    _call(ctx, "POST", f"{_topic(topic)}/partitions", body=_partitions(partitions), has_body=True)


_add_request_verb(topics, "get-partitioned-topic-metadata", "GET", "topic", _topic, "/partitions", printed=True,
                  help_text='Print {"partitions": N} (0 for a topic that is not partitioned).')
_add_request_verb(topics, "delete-partitioned-topic", "DELETE", "topic", _topic, "/partitions",
                  help_text="Delete a partitioned topic and all its partitions.")


@topics.command("list-partitioned-topics")
def list_partitioned_topics(ctx: typer.Context, namespace: Namespace) -> None:
    """List the partitioned topics of a namespace, one a line."""
    path: str = _parsed(namespace_topics_path, namespace, "'NAMESPACE'")
    for name in _call(ctx, "GET", f"{path}/partitioned") or []:
        typer.echo(name)


_add_request_verb(topics, "partitioned-stats", "GET", "topic", _topic, "/partitioned-stats", printed=True,
                  help_text="Print the partitioned topic's stats, summed and per partition.")


# -- tenants -----------------------------------------------------------------------------


@tenants.command("list")
def list_tenants(ctx: typer.Context) -> None:
    """List the tenants, one a line."""
    for name in _call(ctx, "GET", "/admin/v2/tenants") or []:
        typer.echo(name)


@tenants.command("create")
def create_tenant(ctx: typer.Context, tenant: TenantName) -> None:
    """Create a tenant (HTTP 409 when it exists)."""
    _call(ctx, "PUT", _tenant(tenant), body={}, has_body=True)


_add_request_verb(tenants, "delete", "DELETE", "tenant", _tenant, help_text="Delete a tenant that has no namespaces.")


# -- namespaces --------------------------------------------------------------------------


@namespaces.command("list")
def list_namespaces(ctx: typer.Context, tenant: TenantName) -> None:
    """List the namespaces of a tenant, one a line."""
    path = _tenant(tenant).replace("/admin/v2/tenants/", "/admin/v2/namespaces/", 1)
    for name in _call(ctx, "GET", path) or []:
        typer.echo(name)


_add_request_verb(namespaces, "create", "PUT", "namespace", _namespace,
                  help_text="Create a namespace tenant/namespace (its tenant must exist).")
_add_request_verb(namespaces, "delete", "DELETE", "namespace", _namespace,
                  help_text="Delete a namespace that has no topics.")
