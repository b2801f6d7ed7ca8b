"""The URLs this broker gives clients to reach it: what lookups answer.

Every answer that names this broker — the binary LOOKUP (``api.wire.connection``) and the
HTTP lookup — computes the URL here, so ``advertised_address`` (``--advertised-address``:
the host name or IP clients must use behind NAT or in a container) applies to all of them
in one place. Without it a client is told the address it reached (the connection's local
address), which is right whenever nothing translates addresses. The port is always the one
the listener bound.
"""

from __future__ import annotations

from api.config import Settings

__all__ = ["advertised_host", "broker_service_url", "web_service_url"]


def advertised_host(settings: Settings, local_host: str) -> str:
    """``advertised_address`` when set, else ``local_host`` (the address the client reached)."""
    return settings.advertised_address or local_host


def broker_service_url(settings: Settings, local_host: str, port: int, *, tls: bool = False) -> str:
    """``pulsar://HOST:PORT`` for the binary protocol, ``pulsar+ssl://`` on the TLS port
    (IPv6 hosts in brackets)."""
    return _url("pulsar+ssl" if tls else "pulsar", advertised_host(settings, local_host), port)


def web_service_url(settings: Settings, local_host: str, port: int) -> str:
    """``http://HOST:PORT`` for the admin REST API (IPv6 hosts in brackets)."""
    return _url("http", advertised_host(settings, local_host), port)


def _url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
