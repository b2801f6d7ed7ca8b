"""What the Pulsar connections of one listener share: their limits, the bytes they hold, their set.

* ``WireLimits``: the limits the connections apply. Its field defaults are the defaults of
  the ``wire_*`` settings: ``api.config.Settings`` takes them from here, and the listener
  (``api.wire.listener.wire_limits``) builds a ``WireLimits`` from the settings.
* ``PartialFrameBudget``: the bytes every connection of one broker holds in frames it has
  started to receive but not completed. One connection holds at most one frame's worth
  (the decoder refuses a length prefix above the frame limit at once); the budget bounds
  the sum, so many connections each sending most of a large frame and then stalling
  cannot grow the broker without limit. A connection whose next bytes would take the sum
  over the budget is closed (its frame is lost; the client reconnects and resends) and
  its bytes are given back, as they are when any connection closes.
* ``Connections``: the open connections of one listener with the ``WireLimits``, the
  ``PartialFrameBudget`` and the ``ChunkDoor`` (``api.wire.chunk_door``) they share; each ``ServerConnection`` is handed it, adds itself
  when it is made and leaves when it is lost, and the listener closes them all at stop.
  At most ``max_connections`` are open (``api.fd_budget``: their descriptors are shared
  out from ``RLIMIT_NOFILE``): one more makes room by closing the oldest connection that
  has not sent CONNECT yet, else it is closed at once.
  The broker core (``api.broker.service``) knows none of this.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from api.wire.chunk_door import ChunkDoor

__all__ = [
    "CONNECT_TIMEOUT_S",
    "FRAME_TIMEOUT_S",
    "PARTIAL_FRAMES_BUDGET_BYTES",
    "Connection",
    "Connections",
    "PartialFrameBudget",
    "WireLimits",
]

CONNECT_TIMEOUT_S = 10.0
"""A connection that has not sent CONNECT by then is closed (the real client sends it at
once; Pulsar's own connect timeout is 10 s)."""
FRAME_TIMEOUT_S = 30.0
"""A frame that stays incomplete this long is closed with its connection: a 5 MiB frame
takes well under a second on any link a broker serves."""
PARTIAL_FRAMES_BUDGET_BYTES = 128 * 1024 * 1024
"""About 25 maximum-size (5 MiB) frames in flight at once across all connections."""


@dataclass(frozen=True, slots=True)
class WireLimits:
    """The limits every connection of one broker applies."""

    connect_timeout_s: float = CONNECT_TIMEOUT_S
    frame_timeout_s: float = FRAME_TIMEOUT_S
    partial_frames_budget_bytes: int = PARTIAL_FRAMES_BUDGET_BYTES


class PartialFrameBudget:
    """The partial-frame bytes of every connection of one broker (see the module docstring);
    used on the broker's event loop only."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0

    def resize(self, held: int, wanted: int) -> bool:
        """One connection's holding goes from ``held`` to ``wanted`` bytes: True when that
        fits the budget (it is then taken); False leaves the holding at ``held``. Shrinking
        always fits."""
        used = self.used_bytes - held + wanted
        if wanted > held and used > self.limit_bytes:
            return False
        self.used_bytes = used
        return True


log = logging.getLogger(__name__)


class Connection(Protocol):
    """An open connection as ``Connections`` holds it (``api.wire.connection.ServerConnection``)."""

    connected: bool  # CONNECT answered

    def close(self) -> None:
        """Close the connection; its consumers and producers go away with it."""


class Connections:
    """The open connections of one listener and what they share (see the module docstring);
    used on the broker's event loop only."""

    def __init__(self, limits: WireLimits, max_connections: int | None = None) -> None:
        self.limits = limits
        self.max_connections = max_connections
        self.partial_frames = PartialFrameBudget(limits.partial_frames_budget_bytes)
        from api.wire.chunk_door import ChunkDoor  # api.config imports this module first

        self.chunks: ChunkDoor = ChunkDoor()
        self._open: dict[Connection, None] = {}  # in the order they were made
        self._full = False  # at the cap since the last warning

    def add(self, connection: Connection) -> bool:
        """``connection`` is open (made by the listener). False when it must be closed at
        once: the listener is at ``max_connections`` and every connection has sent CONNECT;
        else the oldest that has not is closed to make room."""
        cap = self.max_connections
        if cap is not None and len(self._open) >= cap:
            if not self._full:
                log.warning("%d Pulsar connections are open, the most the file descriptors allow: "
                            "closing the oldest without CONNECT, or refusing new ones", len(self._open))
                self._full = True
            idle = next((each for each in self._open if not each.connected), None)
            if idle is None:
                return False
            self._open.pop(idle)
            idle.close()
        elif self._full and cap is not None and len(self._open) < cap // 2:
            self._full = False
        self._open[connection] = None
        return True

    def discard(self, connection: Connection) -> None:
        """``connection`` is gone (lost or closed); unknown ones are ignored."""
        self._open.pop(connection, None)

    def __iter__(self) -> Iterator[Connection]:
        return iter(self._open)

    def __len__(self) -> int:
        return len(self._open)

    def close_all(self) -> None:
        """Close every open connection (each leaves the set as it is lost)."""
        for connection in list(self._open):
            connection.close()
