"""The Pulsar port's authentication: CONNECT proves a role, or the connection is closed.

``admit(connection, connect)`` is called by ``api.wire.connection`` on CONNECT. It builds
the ``Credentials`` the client offered — ``auth_method_name`` and ``auth_data``
(``pulsar.AuthenticationToken`` sends method ``token`` and the token;
``pulsar.AuthenticationTLS`` sends method ``tls``) and, on a TLS connection that required a
trusted client certificate, that certificate's subject CN — and asks the broker's
``AccessControl`` for the role. Admitted: ``connection.role`` is set and True is returned.
Refused: the client gets ERROR ``AuthenticationError`` (what Pulsar's ``ServerCnx``
answers; the real client reports ``pulsar.AuthenticationError``), the connection is closed,
nothing was created, and one warning is logged naming the peer and the reason — never the
token.

Authorization is checked by each command that names a topic, in its handler
(``api.wire.connection.HANDLERS`` and ``api.wire.producing`` call ``AccessControl.check_topic``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from api.broker.access import AccessControl, AuthenticationError, Credentials
from api.wire.codec import U64_MAX, server_error
from message.proto import pulsar_api_pb2 as pb

__all__ = ["admit", "certificate_cn"]

log = logging.getLogger(__name__)


class _Connection(Protocol):
    role: str | None
    transport: asyncio.Transport | None

    def write(self, command: pb.BaseCommand) -> None: ...
    def close(self) -> None: ...


def certificate_cn(peercert: Any) -> str | None:
    """The subject common name of a verified peer certificate (``ssl`` dict form), or None."""
    if not isinstance(peercert, dict):
        return None
    for relative_name in peercert.get("subject", ()):
        for key, value in relative_name:
            if key == "commonName" and isinstance(value, str) and value:
                return value
    return None


def admit(connection: _Connection, access: AccessControl, connect: pb.CommandConnect) -> bool:
    """Authenticate CONNECT; True when admitted (``connection.role`` set), else refused and closed."""
    transport = connection.transport
    peercert = transport.get_extra_info("peercert") if transport is not None else None
    data = connect.auth_data.decode("utf-8", "replace") if connect.HasField("auth_data") else ""
    credentials = Credentials(connect.auth_method_name, data, certificate_cn(peercert))
    try:
        connection.role = access.authenticate(credentials)
    except AuthenticationError as error:
        peer = transport.get_extra_info("peername") if transport is not None else None
        log.warning("refusing connection from %s: %s", _peer(peer), error)
        refusal = pb.CommandError(request_id=U64_MAX, error=server_error(error.code), message=str(error))
        connection.write(pb.BaseCommand(type=pb.BaseCommand.ERROR, error=refusal))
        connection.close()
        return False
    return True


def _peer(peer: Any) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"
