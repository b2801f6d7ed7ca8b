"""Tenants and namespaces, as Pulsar has them: a topic lives in an existing namespace.

``Tenants`` owns the ``tenants`` component of the metadata database: the tenants (with
Pulsar's ``TenantInfo``: ``adminRoles``, ``allowedClusters``) and the namespaces
(``tenant/namespace``). At every start it makes sure that ``public`` and
``public/default`` exist and that the namespace of every stored topic does (a data dir from
before namespaces existed keeps serving its topics).

Rules, with Pulsar's answers:

* a topic is created only in an existing namespace: PARTITIONED_METADATA, LOOKUP,
  PRODUCER and SUBSCRIBE of a topic in a missing tenant or namespace answer TopicNotFound
  ("Namespace not found"), which the client raises at once as ``TopicNotFound``; admin
  creation answers 404;
* create a tenant or namespace that exists: 409; a namespace of a missing tenant: 404;
* delete a tenant that still has namespaces, or a namespace that still has topics or
  partitioned topics: 409; deleting a namespace removes its namespace policies.

Reads are answered from memory (the sets are small and change only here); writes are the
named transactions ``tenants.*`` (fault points: ``ledger.database``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from api.broker.errors import BrokerError, TopicExistsError, TopicNotFoundError
from api.broker.topic_name import TopicName, parse_namespace
from ledger.database import Database, load_migrations

__all__ = [
    "COMPONENT",
    "DEFAULT_NAMESPACE",
    "MIGRATIONS",
    "NamespaceNotFoundError",
    "NotEmptyError",
    "Tenants",
]

COMPONENT = "tenants"
MIGRATIONS = load_migrations("api.broker", COMPONENT)
DEFAULT_NAMESPACE = "public/default"


def _namespace_of(topic: str) -> str | None:
    """``tenant/namespace`` of a stored topic name; None for one that does not parse."""
    try:
        return TopicName.parse(topic).namespace_name
    except BrokerError:
        return None


class NamespaceNotFoundError(TopicNotFoundError):
    """A missing tenant or namespace (TopicNotFound on the wire, HTTP 404)."""


class NotEmptyError(TopicExistsError):
    """A tenant with namespaces, or a namespace with topics, cannot be deleted (HTTP 409)."""


class Tenants:
    """The tenants and namespaces kept in ``database``; see the module docstring."""

    def __init__(self, database: Database, *, cluster: str, topics: Iterable[str] = ()) -> None:
        self.database = database
        self.cluster = cluster
        database.register(COMPONENT, MIGRATIONS)
        self._tenants: dict[str, dict[str, Any]] = {
            name: json.loads(info) for name, info in database.query("SELECT name, info FROM tenants")}
        self._namespaces: set[str] = {row[0] for row in database.query("SELECT name FROM namespaces")}
        wanted = {DEFAULT_NAMESPACE} | {namespace for namespace in map(_namespace_of, topics) if namespace}
        for namespace in sorted(wanted - self._namespaces):
            tenant = namespace.split("/")[0]
            if tenant not in self._tenants:
                self.create_tenant(tenant, {})
            self.create_namespace(namespace)

    # -- tenants ------------------------------------------------------------------------

    def list_tenants(self) -> list[str]:
        return sorted(self._tenants)

    def tenant(self, name: str) -> dict[str, Any]:
        """The tenant's ``TenantInfo``; ``NamespaceNotFoundError`` when it does not exist."""
        if name not in self._tenants:
            raise NamespaceNotFoundError(f"Tenant {name} does not exist")
        return self._tenants[name]

    def create_tenant(self, name: str, info: dict[str, Any]) -> None:
        parse_namespace(f"{name}/x")  # validates the name as a topic name part
        if name in self._tenants:
            raise TopicExistsError(f"Tenant {name} already exists")
        stored = {"adminRoles": list(info.get("adminRoles") or []),
                  "allowedClusters": list(info.get("allowedClusters") or [self.cluster])}
        with self.database.transaction("tenants.create_tenant", tenant=name) as db:
            db.execute("INSERT INTO tenants (name, info) VALUES (?, ?)", (name, json.dumps(stored)))
        self._tenants[name] = stored

    def delete_tenant(self, name: str) -> None:
        self.tenant(name)
        if self.list_namespaces(name):
            raise NotEmptyError(f"The tenant {name} still has namespaces: {', '.join(self.list_namespaces(name))}")
        with self.database.transaction("tenants.delete_tenant", tenant=name) as db:
            db.execute("DELETE FROM tenants WHERE name = ?", (name,))
        del self._tenants[name]

    # -- namespaces ---------------------------------------------------------------------

    def list_namespaces(self, tenant: str) -> list[str]:
        """The namespaces of ``tenant`` as ``tenant/namespace``; 404 for a missing tenant."""
        self.tenant(tenant)
        # a snapshot first (one C-level copy): the metadata writer thread adds to the set
        return sorted(ns for ns in list(self._namespaces) if ns.split("/")[0] == tenant)

    def namespace_exists(self, namespace: str) -> bool:
        return namespace in self._namespaces

    def check_namespace(self, name: TopicName) -> None:
        """``NamespaceNotFoundError`` unless the namespace of topic ``name`` exists."""
        if name.namespace_name not in self._namespaces:
            raise NamespaceNotFoundError(f"Namespace not found: {name.namespace_name} (topic {name})")

    def create_namespace(self, namespace: str) -> None:
        parse_namespace(namespace)
        tenant = namespace.split("/")[0]
        self.tenant(tenant)
        if namespace in self._namespaces:
            raise TopicExistsError(f"Namespace {namespace} already exists")
        with self.database.transaction("tenants.create_namespace", namespace=namespace) as db:
            db.execute("INSERT INTO namespaces (name, tenant) VALUES (?, ?)", (namespace, tenant))
        self._namespaces.add(namespace)

    def delete_namespace(self, namespace: str, *, topics: list[str]) -> None:
        """Delete the empty ``namespace`` (``topics``: what it still holds, refused if any)
        and its namespace policies."""
        parse_namespace(namespace)
        if namespace not in self._namespaces:
            raise NamespaceNotFoundError(f"Namespace {namespace} does not exist")
        if topics:
            raise NotEmptyError(f"Cannot delete non empty namespace {namespace}: it has {len(topics)} topics "
                                f"({', '.join(topics[:3])}{', …' if len(topics) > 3 else ''})")
        with self.database.transaction("tenants.delete_namespace", namespace=namespace) as db:
            db.execute("DELETE FROM namespaces WHERE name = ?", (namespace,))
            db.execute("DELETE FROM policies WHERE scope = ?", (namespace,))
        self._namespaces.discard(namespace)
