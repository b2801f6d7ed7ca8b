"""Listening sockets for both doors (Pulsar and admin REST) that survive running out of
file descriptors.

asyncio's accept loop (3.11) handles EMFILE/ENFILE/ENOBUFS/ENOMEM by logging the error
with its traceback, pausing the listener and retrying after ``ACCEPT_RETRY_DELAY`` (1 s) —
but it keeps calling ``accept()`` up to ``backlog`` more times in the same wake-up, each
failing, logging and scheduling one more retry (uvicorn's backlog is 2048): a full log
disk, not a back-off. ``listening_socket`` returns a socket whose ``accept`` fails once per
wake-up and then reports "nothing to accept" until the loop's next iteration, so asyncio
stops at the first failure and retries a second later; the socket logs the first failure
of an episode (one warning, no traceback) and the recovery. ``quiet_accept_errors``
installs a loop exception handler that drops asyncio's own log of those failures (for
our sockets only; everything else goes to the default handler).

The same socket accepts at most ``ACCEPTS_PER_ITERATION`` connections per loop iteration
(asyncio would take up to ``backlog`` at once, each a descriptor, before any protocol has
seen one): the connection caps of ``api.fd_budget`` are applied as connections are made,
so what a flood takes beyond a cap in one go stays this small, and the descriptors the
broker keeps for itself stay free.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

__all__ = ["OUT_OF_RESOURCES", "BackoffListener", "listening_socket", "quiet_accept_errors"]

log = logging.getLogger(__name__)

OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""The accept errors asyncio pauses a listener for (and retries after a second)."""
ACCEPTS_PER_ITERATION = 8
"""Connections one listener accepts in one event-loop iteration, at most."""


class BackoffListener(socket.socket):
    """A listening socket whose ``accept`` fails at most once per event-loop iteration for
    lack of resources, and logs once per episode; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures = 0  # accept failures in the current episode
        self._paused = False  # a failure happened in this loop iteration
        self._accepted = 0  # connections accepted in this loop iteration

    def accept(self) -> tuple[socket.socket, Any]:
        if self._paused:
            raise BlockingIOError(errno.EAGAIN, "accepting paused after a failure")
        if self._accepted >= ACCEPTS_PER_ITERATION:
            raise BlockingIOError(errno.EAGAIN, "enough accepted in this loop iteration")
        try:
            accepted = super().accept()
        except OSError as error:
            if error.errno not in OUT_OF_RESOURCES:
                raise
            self._pause(error)
            raise
        self._count_accepted()
        if self.failures:
            log.warning("listener %s accepts connections again after %d failed attempts",
                        _address(self), self.failures)
            self.failures = 0
        return accepted

    def _pause(self, error: OSError) -> None:
        if not self.failures:
            log.warning("listener %s cannot accept connections: %s; retrying every second "
                        "(logged again only when it recovers)", _address(self), error.strerror)
        self.failures += 1
        self._paused = True
        try:
            asyncio.get_running_loop().call_soon(self._resume)
        except RuntimeError:  # not on a loop (plain blocking use): nothing to pause for
            self._paused = False

    def _resume(self) -> None:
        self._paused = False

    def _count_accepted(self) -> None:
        self._accepted += 1
        if self._accepted == 1:
            try:
                asyncio.get_running_loop().call_soon(self._next_iteration)
            except RuntimeError:  # not on a loop: no iteration to count in
                self._accepted = 0

    def _next_iteration(self) -> None:
        self._accepted = 0


def _address(sock: socket.socket) -> str:
    try:
        host, port = sock.getsockname()[:2]
    except OSError:
        return "(closed)"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listening_socket(host: str, port: int, backlog: int) -> BackoffListener:
    """A ``BackoffListener`` bound to ``host:port`` (0: a free port), listening, non-blocking.

    Raises ``OSError`` when the address cannot be bound.
    """
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    sock = BackoffListener(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Drop asyncio's log of an accept that failed for lack of resources on a
    ``BackoffListener`` (which logs it itself); keep every other report."""
    previous = loop.get_exception_handler()

    def handler(event_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exception = context.get("exception")
        transport_socket = context.get("socket")
        raw = getattr(transport_socket, "_sock", None)  # asyncio.TransportSocket wraps it
        if isinstance(exception, OSError) and exception.errno in OUT_OF_RESOURCES \
                and isinstance(raw, BackoffListener):
            return
        if previous is not None:
            previous(event_loop, context)
        else:
            event_loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
