"""Who a client is and what its role may do: one ``AccessControl`` per broker.

**Authentication** (``--authentication-enabled``) names a client's *role*:

* auth method ``token`` (``pulsar.AuthenticationToken``, REST ``Authorization: Bearer``):
  the ``sub`` of a token verified by ``api.auth.tokens.TokenVerifier``;
* auth method ``tls`` (``pulsar.AuthenticationTLS``), over a TLS port that required a
  trusted client certificate: the certificate's subject CN (Pulsar's TLS provider).

Anything else — no method, an unknown one, a bad token — is refused with
``AuthenticationError``. With authentication off every client is anonymous (role None) and
may do everything, as before.

**Authorization** (``--authorization-enabled``, which needs authentication) lets a
super-user (``--super-user-roles``) do everything; another role may produce to (consume
from) a topic only with a ``produce`` (``consume``) grant on the topic or its namespace
(``api.broker.grants``; listing a namespace's topics over the wire needs ``consume`` on
the namespace). Looking a topic up — its lookup, partitioned metadata and schema — needs
either (``LOOKUP_ACTIONS``, Pulsar's ``canLookup``); registering a schema needs
``produce``. Each door checks its own commands (``api.wire.connection``, ``api.auth.rest``).
No other admin operation is open to such a role: compactd has no tenant admins, so
the rest of the admin API is for super-users only. With authorization off, every authenticated role may
do everything (Pulsar's behaviour).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass

from api.auth.tokens import TokenError, TokenVerifier
from api.broker.errors import BrokerError
from api.broker.grants import GrantStore
from api.broker.topic_name import TopicName
from api.config import Settings
from ledger.database import Database

__all__ = [
    "LOOKUP_ACTIONS",
    "AccessControl",
    "AuthenticationError",
    "AuthorizationError",
    "Credentials",
    "exposure_warning",
]

log = logging.getLogger(__name__)

TOKEN_METHOD = "token"
TLS_METHOD = "tls"
LOOKUP_ACTIONS = ("produce", "consume")  # either grant lets a role look a topic up (Pulsar's canLookup)
# A partition of a partitioned topic shares the partitioned topic's grants.
_PARTITION_SUFFIX = re.compile(r"-partition-\d+$")


class AuthenticationError(BrokerError):
    """The client did not prove a role; the message never holds the credentials."""

    code = "AuthenticationError"


class AuthorizationError(BrokerError):
    """The role may not do what it asked."""

    code = "AuthorizationError"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client offered: its auth method and data, and its TLS certificate's CN."""

    method: str = ""
    data: str = ""
    certificate_cn: str | None = None


class AccessControl:
    """Authentication and authorization of one broker; see the module docstring.

    ``grants`` is None for an admin application built without a broker (tests): then only
    super-users pass an authorization check.
    """

    def __init__(self, settings: Settings, grants: GrantStore | None) -> None:
        self.authentication_enabled = settings.authentication_enabled
        self.authorization_enabled = settings.authorization_enabled
        self.super_users = frozenset(settings.super_user_roles)
        self.grants = grants
        self.verifier: TokenVerifier | None = None
        if settings.authentication_enabled:
            self.verifier = TokenVerifier.from_urls(settings.token_secret_key, settings.token_public_key)

    @classmethod
    def of_broker(cls, settings: Settings, database: Database) -> AccessControl:
        """The access control of a broker whose grants live on ``database``."""
        return cls(settings, GrantStore(database))

    # -- authentication --------------------------------------------------------------------

    def authenticate(self, credentials: Credentials) -> str | None:
        """The role ``credentials`` prove (None: authentication is off); ``AuthenticationError``."""
        if not self.authentication_enabled:
            return None
        if credentials.method == TOKEN_METHOD:
            assert self.verifier is not None
            try:
                return self.verifier.role_of(credentials.data)
            except TokenError as error:
                raise AuthenticationError(f"Unable to authenticate: {error}") from None
        if credentials.method == TLS_METHOD:
            if credentials.certificate_cn:
                return credentials.certificate_cn
            raise AuthenticationError("Unable to authenticate: no trusted client certificate with a CN")
        method = credentials.method or "none"
        raise AuthenticationError(f"Unable to authenticate: auth method {method!r} is not accepted")

    def role_of_bearer(self, authorization: str | None) -> str | None:
        """The role of an HTTP ``Authorization: Bearer <token>`` header; ``AuthenticationError``."""
        if not self.authentication_enabled:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("Unable to authenticate: no Authorization: Bearer token")
        return self.authenticate(Credentials(TOKEN_METHOD, token.strip()))

    # -- authorization ---------------------------------------------------------------------

    def is_super_user(self, role: str | None) -> bool:
        """True when ``role`` may do everything (always, with authorization off)."""
        return not self.authorization_enabled or (role is not None and role in self.super_users)

    def check_admin(self, role: str | None) -> None:
        """``AuthorizationError`` unless ``role`` may call admin operations."""
        if not self.is_super_user(role):
            raise AuthorizationError(f"role {role!r} is not authorized for admin operations (super-users only)")

    def check_topic(self, role: str | None, topic: str, *actions: str) -> None:
        """``AuthorizationError`` unless ``role`` holds one of ``actions`` (produce, consume)
        on ``topic`` (its own grants, its partitioned topic's or its namespace's)."""
        self._check(role, _scopes(topic), actions, topic)

    def check_namespace(self, role: str | None, namespace: str, action: str) -> None:
        """``AuthorizationError`` unless ``role`` holds ``action`` on ``namespace`` itself
        (listing a namespace's topics needs ``consume`` there, as in Pulsar)."""
        self._check(role, (namespace,), (action,), namespace)

    def _check(self, role: str | None, scopes: tuple[str, ...], actions: tuple[str, ...], target: str) -> None:
        if self.is_super_user(role):
            return
        if role is not None and self.grants is not None and not self.grants.actions_of(role, scopes).isdisjoint(actions):
            return
        refusal = AuthorizationError(f"role {role!r} is not authorized to {' or '.join(actions)} on {target}")
        log.info("refusing: %s", refusal)
        raise refusal


def _scopes(topic: str) -> tuple[str, ...]:
    """The grant scopes that cover ``topic``: the topic, its partitioned topic, its namespace."""
    try:
        name = TopicName.parse(topic)
    except BrokerError:
        return ()
    full = str(name)
    base = _PARTITION_SUFFIX.sub("", full)
    return (full, base, name.namespace_name) if base != full else (full, name.namespace_name)


def exposure_warning(settings: Settings) -> str | None:
    """The one warning ``compactd serve`` logs when it listens beyond loopback with
    authentication off (anyone who reaches the ports may do anything), else None."""
    if settings.authentication_enabled or _is_loopback(settings.bind):
        return None
    return (f"listening on {settings.bind}, not a loopback address, with authentication off: anyone who "
            "reaches the ports can produce, consume and administer; pass --authentication-enabled")


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
