"""A connection's outgoing frames, gathered so that one turn of the event loop makes one write.

Writing each frame to the transport on its own costs a ``send`` system call per frame:
per MESSAGE dispatched, per SEND_RECEIPT, per answer. ``Outbox`` owns the frames a
``ServerConnection`` has written but not yet handed to its transport, and hands them over
joined:

* while **corked** (the connection handles the frames of one ``data_received``, or the
  receipts of the sends a group commit completed: ``producing.SendCompletions``), frames
  wait and go out together when it uncorks, so a command's answers are written before
  ``data_received`` returns;
* otherwise (a dispatch round), the first frame schedules one flush for the end of the
  current turn of the event loop;
* past ``FLUSH_BYTES`` the frames go out at once, so the transport's own flow control
  (``pause_writing`` above its high-water mark) still sees what waits, within that much.

Order is kept: frames reach the transport in the order they were put. ``flush`` before
closing the transport; ``drop`` when the connection is gone. Event loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["FLUSH_BYTES", "Outbox"]

FLUSH_BYTES = 64 * 1024
"""Frames waiting beyond this many bytes are written at once."""


class Outbox:
    """The frames of one connection on their way to ``write`` (the transport's)."""

    __slots__ = ("_bytes", "_corked", "_loop", "_parts", "_scheduled", "_write")

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Callable[[bytes], None]) -> None:
        self._loop = loop
        self._write = write
        self._parts: list[bytes] = []
        self._bytes = 0
        self._corked = False
        self._scheduled = False

    def put(self, frame: bytes) -> None:
        """Queue ``frame``; it is written at the latest at the end of this loop turn."""
        self._parts.append(frame)
        self._bytes += len(frame)
        if self._bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._corked and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_scheduled)

    def cork(self) -> None:
        """Hold frames until ``uncork`` (the frames of one read are being handled)."""
        self._corked = True

    def uncork(self) -> None:
        """Write what the corked stretch gathered."""
        self._corked = False
        self.flush()

    def flush(self) -> None:
        """Write every queued frame now, as one write."""
        parts = self._parts
        if not parts:
            return
        self._parts = []
        self._bytes = 0
        self._write(parts[0] if len(parts) == 1 else b"".join(parts))

    def drop(self) -> None:
        """Forget what is queued (the connection is gone)."""
        self._parts = []
        self._bytes = 0

    def _flush_scheduled(self) -> None:
        self._scheduled = False
        self.flush()
