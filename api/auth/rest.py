"""The admin port's guards, applied to every route (those added later included).

``AccessMiddleware`` (added by ``api.http.create_app``), by path and method, before any
route runs or any body is read:

* ``/admin/v2/brokers/health`` is open to everyone (load balancers, probes);
* everything else needs ``Authorization: Bearer <token>`` when authentication is on:
  401 ``{"reason": …}`` with ``WWW-Authenticate: Bearer`` without one or with a bad one;
* ``/metrics``, ``/docs`` and ``/openapi.json`` are then open to any authenticated role
  (metrics name topics, so they are not public; like Pulsar's
  ``authenticateMetricsEndpoint=true``);
* a route declared with ``openapi_extra=topic_grant(*actions)`` is open, with
  authorization on, to a role holding one of ``actions`` on the topic its path names
  (``{domain}``, ``{tenant}``, ``{namespace}``, ``{topic}``; 403 otherwise) — as in Pulsar:
  the lookup, the partitioned metadata and reading a schema need produce or consume,
  uploading a schema produce. ``RouteGrants`` finds the route as the router will (the
  first full match), so the grant a route declares is the one checked, before any body
  is read;
* every other route is an admin operation: with authorization on, super-users only (403
  otherwise). compactd has no tenant admins, so reading and changing grants, policies,
  topics and compaction (and deleting a schema: Pulsar's tenant-admin operation) are all
  super-user operations.

``HostAllowListMiddleware`` (wrapped around the application by ``api.server``) refuses,
with 403, a request whose ``Host`` header names no address the listener answers for, so
a web page cannot reach the admin API by DNS rebinding: allowed are the bind address,
``localhost``, the loopback literals, the names of ``--http-allowed-hosts`` (``*``: any),
and — when the listener binds every interface — any IP literal (a rebinding attack needs
a DNS name).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.broker.access import AccessControl, AuthenticationError, AuthorizationError
from api.errors import reason_response

__all__ = [
    "AUTHENTICATED_PATHS",
    "GRANT_KEY",
    "OPEN_PATHS",
    "AccessMiddleware",
    "HostAllowListMiddleware",
    "RouteGrants",
    "host_of",
    "topic_grant",
]

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/admin/v2/brokers/health"})
AUTHENTICATED_PATHS = frozenset({"/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
LOOPBACK_NAME = "localhost"
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
GRANT_KEY = "x-compactd-topic-grant"  # in a route's OpenAPI operation: the grants that admit a role


def topic_grant(*actions: str) -> dict[str, Any]:
    """A route's ``openapi_extra``: a role holding one of ``actions`` (produce, consume) on
    the topic its path names may call it (documented in the OpenAPI operation too)."""
    return {GRANT_KEY: list(actions)}


class RouteGrants:
    """Which grant admits a role to each route: ``routes`` (the application's, in the order
    the router tries them) each matched as the router matches it, the first full match
    deciding, before the request reaches the router."""

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self._routes: list[tuple[Route, tuple[str, ...]]] = [
            (Route(route.path, _never_called, methods=sorted(route.methods or ())),
             tuple((route.openapi_extra or {}).get(GRANT_KEY, ())))
            for route in routes if isinstance(route, APIRoute)]

    def of(self, scope: Scope) -> tuple[str, tuple[str, ...]] | None:
        """The topic and the actions that admit a request to the route it reaches, or None
        when that route declares no ``topic_grant`` (an admin route) or none matches."""
        for matcher, actions in self._routes:
            match, child = matcher.matches(scope)
            if match is not Match.FULL:
                continue
            if not actions:
                return None
            params = child["path_params"]
            domain = params.get("domain", "persistent")
            return f"{domain}://{params['tenant']}/{params['namespace']}/{params['topic']}", actions
        return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _never_called() -> None:  # RouteGrants only matches paths; the router calls the route
    raise AssertionError("unreachable")


class AccessMiddleware:
    """Authentication and admin authorization of every request; see the module docstring."""

    def __init__(self, app: ASGIApp, access: AccessControl, routes: Iterable[BaseRoute] = ()) -> None:
        self.app = app
        self.access = access
        self.grants = RouteGrants(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        try:
            role = self.access.role_of_bearer(_header(scope, b"authorization"))
        except AuthenticationError as error:
            log.info("refusing %s %s: %s", scope["method"], scope["path"], error)
            await reason_response(401, str(error), {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        if scope["path"] not in AUTHENTICATED_PATHS:
            try:
                grant = self.grants.of(scope)
                if grant is None:
                    self.access.check_admin(role)
                else:
                    self.access.check_topic(role, grant[0], *grant[1])
            except AuthorizationError as error:
                log.info("refusing %s %s: %s", scope["method"], scope["path"], error)
                await reason_response(403, str(error))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def host_of(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` → ``::1``), lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class HostAllowListMiddleware:
    """403 for a request whose ``Host`` is not an address this listener answers for."""

    def __init__(self, app: ASGIApp, bind: str, allowed_hosts: tuple[str, ...]) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.any_ip = bind in WILDCARD_BINDS
        self.allowed = {LOOPBACK_NAME, bind.lower()} | {host.lower() for host in allowed_hosts}

    def allows(self, header: str | None) -> bool:
        """True when a request with this ``Host`` header may be served."""
        if self.any_host:
            return True
        if header is None:
            return False
        host = host_of(header)
        if host in self.allowed:
            return True
        address = _ip(host)
        return address is not None and (address.is_loopback or self.any_ip)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = _header(scope, b"host")
            if not self.allows(header):
                log.info("refusing %s %s: Host %r is not allowed", scope["method"], scope["path"], header)
                reason = (f"Host {header!r} is not an address of this broker; "
                          "add it to --http-allowed-hosts to allow it")
                await reason_response(403, reason)(scope, receive, send)
                return
        await self.app(scope, receive, send)
