"""The Pulsar protocol listener: the broker core served on a port.

``PulsarBroker`` is a ``BrokerService`` (the core, which knows no sockets) plus the
listener: ``start(host, port)`` binds the Pulsar port (``api.listener``'s socket, which
backs off when descriptors run out), accepts one ``ServerConnection`` per client, and
starts the core's periodic work; ``stop`` closes the listener and every connection
(their consumers and producers go away), then stops the core, which seals every topic.
"""

from __future__ import annotations

import asyncio

from api.broker.service import BrokerService
from api.listener import listening_socket
from api.wire.connection import ServerConnection

__all__ = ["PULSAR_LISTEN_BACKLOG", "PulsarBroker"]

# Pending connections the kernel queues on the Pulsar port (asyncio's default).
PULSAR_LISTEN_BACKLOG = 100


class PulsarBroker(BrokerService):
    """One broker over one data dir, listening for Pulsar clients; see the module docstring."""

    _server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen for Pulsar clients on ``host:port`` (0: any free port); returns the port."""
        self.loop = asyncio.get_running_loop()
        sock = listening_socket(host, port, PULSAR_LISTEN_BACKLOG)
        try:
            self._server = await self.loop.create_server(
                lambda: ServerConnection(self), sock=sock, backlog=PULSAR_LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        self.start_tasks()
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        """Close the listener and connections, then stop the core (pending appends finish)."""
        self.stop_tasks()
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
        await super().stop()
