"""Managed cursors: mark-delete position, read position, acknowledged ranges, properties."""

from cursor.cursor import UNACKED_RANGES_PERSIST_MAX, InitialPosition, ManagedCursor
from cursor.errors import CursorError, InvalidMarkDeletePositionError, MarkDeleteBackwardsError
from cursor.ranges import AckedRanges

__all__ = [
    "UNACKED_RANGES_PERSIST_MAX",
    "AckedRanges",
    "CursorError",
    "InitialPosition",
    "InvalidMarkDeletePositionError",
    "ManagedCursor",
    "MarkDeleteBackwardsError",
]
