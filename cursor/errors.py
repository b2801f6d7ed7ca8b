"""Errors of the cursor layer::

    CompactionServiceError (ledger.errors)
    └── CursorError                          a cursor refused an operation
        ├── InvalidMarkDeletePositionError   ack past the last confirmed entry
        └── MarkDeleteBackwardsError         cumulative ack before the mark-delete position
"""

from __future__ import annotations

from ledger.errors import CompactionServiceError

__all__ = ["CursorError", "InvalidMarkDeletePositionError", "MarkDeleteBackwardsError"]


class CursorError(CompactionServiceError):
    """A cursor refused an operation; ``topic`` and ``cursor`` say which."""

    def __init__(self, message: str, *, topic: str = "", cursor: str = "") -> None:
        super().__init__(message)
        self.topic = topic
        self.cursor = cursor


class InvalidMarkDeletePositionError(CursorError, ValueError):
    """An acknowledgement named a position after the topic's last confirmed entry."""


class MarkDeleteBackwardsError(CursorError, ValueError):
    """A cumulative acknowledgement named a position before the mark-delete position."""
