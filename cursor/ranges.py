"""The set of individually acknowledged entries of a cursor.

Entries are acknowledged out of order; the cursor keeps those after its mark-delete
position as disjoint, sorted, inclusive runs of entry ids per ledger: ``{ledger_id:
[(first, last), ...]}``. Adjacent runs in one ledger merge on insert. Pulsar writes the
same set as half-open ranges, ``"[(3:4..3:9], (5:-1..5:0]]"``; ``to_pulsar_string``
produces that form for internal stats. Whether two runs in *different* ledgers are
contiguous depends on the ledger list, so that question belongs to the cursor, which asks
its managed ledger for the next valid position.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from ledger.position import Position

__all__ = ["AckedRanges"]


class AckedRanges:
    """Disjoint inclusive runs of acknowledged entry ids, per ledger; a value-like object."""

    def __init__(self, runs: Iterable[tuple[int, int, int]] = ()) -> None:
        self._runs: dict[int, list[tuple[int, int]]] = {}
        for ledger_id, first, last in runs:
            self._add_run(ledger_id, first, last)

    def copy(self) -> AckedRanges:
        clone = AckedRanges()
        clone._runs = {ledger_id: list(runs) for ledger_id, runs in self._runs.items()}
        return clone

    def _add_run(self, ledger_id: int, first: int, last: int) -> None:
        runs = self._runs.setdefault(ledger_id, [])
        index = bisect.bisect_left(runs, (first, first))
        # merge with a run that ends at or after first - 1 before the insertion point
        if index > 0 and runs[index - 1][1] >= first - 1:
            index -= 1
            first = min(first, runs[index][0])
        stop = index
        while stop < len(runs) and runs[stop][0] <= last + 1:
            last = max(last, runs[stop][1])
            stop += 1
        runs[index:stop] = [(first, last)]

    def add(self, position: Position) -> None:
        """Mark the entry at ``position`` acknowledged."""
        self._add_run(position.ledger_id, position.entry_id, position.entry_id)

    def run_containing(self, position: Position) -> tuple[int, int] | None:
        """The inclusive run holding ``position``'s entry, or None."""
        return self.run_at(position.ledger_id, position.entry_id)

    def run_at(self, ledger_id: int, entry_id: int) -> tuple[int, int] | None:
        """The inclusive run holding entry ``entry_id`` of ledger ``ledger_id``, or None."""
        runs = self._runs.get(ledger_id)
        if not runs:
            return None
        index = bisect.bisect_right(runs, (entry_id, 2**63)) - 1
        if index >= 0 and runs[index][0] <= entry_id <= runs[index][1]:
            return runs[index]
        return None

    def any_after(self, position: Position) -> bool:
        """True when some acknowledged entry lies after ``position`` (entry level)."""
        if not self._runs:
            return False
        last_ledger = max(self._runs)  # every listed ledger holds a run
        if last_ledger != position.ledger_id:
            return last_ledger > position.ledger_id
        return self._runs[last_ledger][-1][1] > position.entry_id

    def __contains__(self, position: object) -> bool:
        return isinstance(position, Position) and self.run_containing(position) is not None

    def drop_through(self, position: Position) -> None:
        """Forget every acknowledged entry at or before ``position`` (entry level)."""
        for ledger_id in [lid for lid in self._runs if lid < position.ledger_id]:
            del self._runs[ledger_id]
        runs = self._runs.get(position.ledger_id)
        if runs is None:
            return
        kept = [(max(first, position.entry_id + 1), last) for first, last in runs if last > position.entry_id]
        if kept:
            self._runs[position.ledger_id] = kept
        else:
            del self._runs[position.ledger_id]

    def count_between(self, after: Position, upto: Position) -> int:
        """Acknowledged entries ``p`` with ``after < p <= upto``."""
        count = 0
        for ledger_id, first, last in self.runs():
            low = max(first, after.entry_id + 1) if ledger_id == after.ledger_id else first
            high = min(last, upto.entry_id) if ledger_id == upto.ledger_id else last
            if after.ledger_id <= ledger_id <= upto.ledger_id and high >= low:
                count += high - low + 1
        return count

    def runs(self) -> Iterator[tuple[int, int, int]]:
        """Every run as ``(ledger_id, first_entry_id, last_entry_id)``, ascending."""
        for ledger_id in sorted(self._runs):
            for first, last in self._runs[ledger_id]:
                yield ledger_id, first, last

    def __len__(self) -> int:
        """The number of runs (Pulsar's ``totalNonContiguousDeletedMessagesRange``)."""
        return sum(len(runs) for runs in self._runs.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AckedRanges) and list(self.runs()) == list(other.runs())

    def __repr__(self) -> str:
        return f"AckedRanges({list(self.runs())})"

    def to_pulsar_string(self) -> str:
        """Pulsar's form: ``"[(L:first-1..L:last], …]"``."""
        parts = [f"({lid}:{first - 1}..{lid}:{last}]" for lid, first, last in self.runs()]
        return "[" + ", ".join(parts) + "]"
