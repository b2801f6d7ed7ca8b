"""What one broker lets Pulsar connections hold and how long it waits for them.

* ``WireLimits``: the settings (``api/config.py``) the connections apply, with defaults for
  a broker built without settings (tests).
* ``PartialFrameBudget``: the bytes every connection of one broker holds in frames it has
  started to receive but not completed. One connection holds at most one frame's worth
  (the decoder refuses a length prefix above the frame limit at once); the budget bounds
  the sum, so many connections each sending most of a large frame and then stalling
  cannot grow the broker without limit. A connection whose next bytes would take the sum
  over the budget is closed (its frame is lost; the client reconnects and resends) and
  its bytes are given back, as they are when any connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONNECT_TIMEOUT_S",
    "FRAME_TIMEOUT_S",
    "PARTIAL_FRAMES_BUDGET_BYTES",
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

    @classmethod
    def from_settings(cls, settings: Any) -> WireLimits:
        """The limits of ``settings`` (an ``api.config.Settings``, or None: the defaults)."""
        return cls(
            connect_timeout_s=float(getattr(settings, "wire_connect_timeout_seconds", CONNECT_TIMEOUT_S)),
            frame_timeout_s=float(getattr(settings, "wire_frame_timeout_seconds", FRAME_TIMEOUT_S)),
            partial_frames_budget_bytes=int(getattr(
                settings, "wire_partial_frames_budget_bytes", PARTIAL_FRAMES_BUDGET_BYTES)),
        )


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
