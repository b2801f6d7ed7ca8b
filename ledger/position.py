"""Positions and message ids: where an entry, or a message inside a batch, lives.

A ``Position`` is Pulsar's ``MessageId``: ``(ledger_id, entry_id)`` plus ``batch_index``
(the slot inside a batch entry, ``-1`` when the entry is not a batch or the whole entry is
meant) and ``partition`` (``-1`` for a non-partitioned topic).

Order: totally ordered by ``(ledger_id, entry_id, batch_index)``. ``partition`` takes no
part in the order or in equality, exactly as in Pulsar, where message ids of one topic are
only compared within one partition.

Conventions carried over from Pulsar's managed ledger:

* ``(L, -1)`` means "just before the first entry of ledger L"; it is a legal
  mark-delete position.
* ``EARLIEST = (-1, -1)`` sorts before every real position and ``LATEST =
  (2**63-1, 2**63-1)`` after every one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EARLIEST", "LATEST", "MessageId", "Position"]

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """One place in a topic's log.

    Attributes:
        ledger_id: id of the ledger holding the entry; ``-1`` only in ``EARLIEST``.
        entry_id: dense index of the entry inside its ledger, from 0; ``-1`` = before entry 0.
        batch_index: slot inside a batch entry; ``-1`` = the entry as a whole.
        partition: partition index of the topic; ``-1`` when not partitioned. Not ordered.
    """

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = field(default=-1, compare=False)

    def entry_position(self) -> Position:
        """This position without a batch index: the entry that holds the message."""
        if self.batch_index == -1:
            return self
        return Position(self.ledger_id, self.entry_id, -1, self.partition)

    def with_batch_index(self, batch_index: int) -> Position:
        """The same entry, slot ``batch_index``."""
        return Position(self.ledger_id, self.entry_id, batch_index, self.partition)

    def __str__(self) -> str:
        """``"ledger:entry"`` as Pulsar's admin API writes positions (batch index appended)."""
        if self.batch_index == -1:
            return f"{self.ledger_id}:{self.entry_id}"
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Inverse of ``str()``: ``"L:E"`` or ``"L:E:B"``; raises ``ValueError`` otherwise."""
        parts = text.strip().split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"not a position: {text!r} (expected 'ledger:entry')")
        try:
            numbers = [int(part) for part in parts]
        except ValueError:
            raise ValueError(f"not a position: {text!r} (expected integers)") from None
        return cls(*numbers)


MessageId = Position
"""Pulsar's name for a position on the wire; the same value type."""

EARLIEST = Position(-1, -1)
LATEST = Position(_INT64_MAX, _INT64_MAX)
