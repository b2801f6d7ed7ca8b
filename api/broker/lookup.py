"""Where clients are sent: the broker service URL a lookup answers.

Both lookups, the binary LOOKUP (``api.wire.connection``) and the HTTP one
(``/lookup/v2/topic/…``, ``api.routers.tenants``), answer the URL ``broker_service_url``
makes from the local address the client reached and the Pulsar port, so the client comes
back to this broker on the address it already used.
"""

from __future__ import annotations

__all__ = ["broker_service_url"]


def broker_service_url(host: str, port: int) -> str:
    """``pulsar://host:port``, an IPv6 host in brackets."""
    return f"pulsar://{f'[{host}]' if ':' in host else host}:{port}"
