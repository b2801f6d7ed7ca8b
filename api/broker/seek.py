"""Seek by publish time: the first entry of a topic published at or after a time.

Entries are in publish order per producer and roughly so across producers; like Pulsar's
``asyncFindNewestMatching``, a binary search over the whole log (across ledgers) finds the
first entry whose ``publish_time`` is at least the target, reading ``O(log n)`` entries.
"""

from __future__ import annotations

from ledger.managed_ledger import ManagedLedger
from ledger.position import Position
from message.entry import parse_entry
from message.errors import MalformedEntryError

__all__ = ["find_by_publish_time", "publish_time"]


def publish_time(data: bytes) -> int:
    """The entry's ``publish_time`` (ms), or 0 when its metadata cannot be read."""
    return _publish_time(data)


def _publish_time(data: bytes) -> int:
    try:
        return int(parse_entry(data).metadata.publish_time)
    except MalformedEntryError:
        return 0


def find_by_publish_time(ledger: ManagedLedger, publish_time_ms: int) -> Position:
    """Position of the first entry with ``publish_time >= publish_time_ms``, or the position
    just after the last entry when there is none."""
    spans = [(record.ledger_id, record.entries) for record in ledger.ledger_list() if record.entries]
    total = sum(entries for _, entries in spans)

    def position_at(index: int) -> Position:
        for ledger_id, entries in spans:
            if index < entries:
                return Position(ledger_id, index)
            index -= entries
        raise IndexError(index)

    low, high = 0, total
    while low < high:
        middle = (low + high) // 2
        entry = ledger.read_entries(position_at(middle), 1)[0]
        if _publish_time(entry.data) < publish_time_ms:
            low = middle + 1
        else:
            high = middle
    if low == total:
        return ledger.next_valid_position(ledger.last_confirmed_position())
    return position_at(low)
