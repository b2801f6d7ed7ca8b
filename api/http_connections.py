"""The admin port's connections, bounded (``api.fd_budget``).

uvicorn keeps a connection that never sends a request open for as long as its peer does,
and takes every connection its listener accepts: a flood of idle connections holds a
descriptor each until the process has none left, and then neither port accepts anything.
``capped_http_protocol`` wraps uvicorn's HTTP protocol class so that

* a connection that has sent no request within ``first_request_s`` (uvicorn's keep-alive
  timeout) is closed, as uvicorn closes one idle between requests;
* at most ``max_connections`` are open: one more closes the oldest connection that has
  not sent a request yet to make room, else it is closed at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["capped_http_protocol"]

log = logging.getLogger(__name__)


def capped_http_protocol(base: type[Any], max_connections: int, first_request_s: float) -> type[Any]:
    """A subclass of uvicorn's protocol class ``base`` keeping the rules of the module docstring."""
    waiting: dict[Any, asyncio.TimerHandle] = {}  # connections without a request yet, oldest first

    class CappedHttpProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                oldest = next(iter(waiting), None)
                if oldest is None:
                    log.warning("%d admin connections are open, the most the file descriptors allow: "
                                "refusing a new one", len(self.connections) - 1)
                    transport.abort()
                    return
                oldest._stop_waiting()
                oldest.transport.abort()
            waiting[self] = self.loop.call_later(first_request_s, self._no_request)

        def data_received(self, data: bytes) -> None:
            self._stop_waiting()
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

        def _stop_waiting(self) -> None:
            timer = waiting.pop(self, None)
            if timer is not None:
                timer.cancel()

        def _no_request(self) -> None:
            waiting.pop(self, None)
            if not self.transport.is_closing():
                self.transport.close()

    CappedHttpProtocol.__name__ = CappedHttpProtocol.__qualname__ = f"Capped{base.__name__}"
    return CappedHttpProtocol
