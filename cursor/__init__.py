"""Managed cursors: mark-delete position, read position, acknowledged ranges, properties;
the durable cursors' tables on the shared metadata database (``CursorStore``)."""

from cursor.cursor import UNACKED_RANGES_PERSIST_MAX, InitialPosition, ManagedCursor
from cursor.errors import CursorError, InvalidMarkDeletePositionError, MarkDeleteBackwardsError
from cursor.ranges import AckedRanges
from cursor.store import CursorRecord, CursorStore

__all__ = [
    "UNACKED_RANGES_PERSIST_MAX",
    "AckedRanges",
    "CursorError",
    "CursorRecord",
    "CursorStore",
    "InitialPosition",
    "InvalidMarkDeletePositionError",
    "ManagedCursor",
    "MarkDeleteBackwardsError",
]
