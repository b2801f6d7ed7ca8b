"""The Pulsar protocol listener: the broker core served on a port.

``PulsarBroker`` is a ``BrokerService`` (the core, a topic registry that knows no sockets)
plus what the Pulsar port needs, which the wire package owns: the listener and
``connections`` (``api.wire.limits.Connections``: the open ``ServerConnection``s with the
``WireLimits`` and the partial-frame budget they share, built here from the ``wire_*``
settings by ``wire_limits``). ``start(host, port)`` binds the Pulsar port
(``api.listener``'s socket, which backs off when descriptors run out), accepts one
``ServerConnection`` per client, and starts the core's periodic work; ``start_tls`` adds the
``pulsar+ssl://`` listener (same connections, an SSL context from ``api.auth.tls``); ``stop``
closes the listeners and every connection (their consumers and producers go away), then stops the
core, which seals every topic.
"""

from __future__ import annotations

import asyncio
import ssl

from api.broker.service import BrokerService
from api.config import Settings
from api.fd_budget import fd_budget
from api.listener import listening_socket
from api.wire.connection import ServerConnection
from api.wire.limits import Connections, WireLimits
from ledger.data_dir import DataDir

__all__ = ["PULSAR_LISTEN_BACKLOG", "PulsarBroker", "wire_limits"]

# Pending connections the kernel queues on the Pulsar port (asyncio's default).
PULSAR_LISTEN_BACKLOG = 100


def wire_limits(settings: Settings) -> WireLimits:
    """The limits every Pulsar connection applies, from the ``wire_*`` settings."""
    return WireLimits(
        connect_timeout_s=settings.wire_connect_timeout_seconds,
        frame_timeout_s=settings.wire_frame_timeout_seconds,
        partial_frames_budget_bytes=settings.wire_partial_frames_budget_bytes,
    )


class PulsarBroker(BrokerService):
    """One broker over one data dir, listening for Pulsar clients; see the module docstring."""

    def __init__(self, data_dir: DataDir, settings: Settings) -> None:
        super().__init__(data_dir, settings)
        budget = fd_budget(settings.max_open_ledger_files)  # the descriptors connections may take
        self.connections = Connections(wire_limits(settings), budget.pulsar_connections)
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None  # --broker-port-tls (api.auth.tls)
        self.port = 0  # the bound Pulsar port, once started

    async def start(self, host: str, port: int) -> int:
        """Listen for Pulsar clients on ``host:port`` (0: any free port); returns the port."""
        self.loop = asyncio.get_running_loop()
        sock = listening_socket(host, port, PULSAR_LISTEN_BACKLOG)
        try:
            self._server = await self.loop.create_server(
                lambda: ServerConnection(self, self.connections), sock=sock, backlog=PULSAR_LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        self.start_tasks()
        bound: int = self._server.sockets[0].getsockname()[1]
        self.port = bound  # what an HTTP lookup answers (``api.routers.tenants``)
        return bound

    async def start_tls(self, host: str, port: int, context: ssl.SSLContext) -> int:
        """Listen for ``pulsar+ssl://`` clients on ``host:port`` too; returns the port."""
        sock = listening_socket(host, port, PULSAR_LISTEN_BACKLOG)
        try:
            self._tls_server = await asyncio.get_running_loop().create_server(
                lambda: ServerConnection(self, self.connections), sock=sock, backlog=PULSAR_LISTEN_BACKLOG,
                ssl=context)
        except BaseException:
            sock.close()
            raise
        bound: int = self._tls_server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        """Close the listener and connections, then stop the core (pending appends finish)."""
        self.stop_tasks()
        servers = [server for server in (self._server, self._tls_server) if server is not None]
        for server in servers:
            server.close()
        self.connections.close_all()
        for server in servers:
            await server.wait_closed()
        await super().stop()
