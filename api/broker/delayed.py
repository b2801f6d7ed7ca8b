"""Delayed delivery for Shared and Key_Shared subscriptions: the delay index.

A message whose metadata carries ``deliver_at_time`` (milliseconds since the epoch, set by
the client's ``deliver_after`` / ``deliver_at``) is not delivered before that time on a
Shared or Key_Shared subscription (Exclusive and Failover deliver it at once, as Pulsar
does). Rules:

* ``DelayedDeliveryTracker`` owns a subscription's index: position -> due time. A read
  entry that is not yet due goes into the index and the read moves on, so a delayed
  message never holds back the ones after it.
* When the earliest due time comes, a timer on the event loop calls the subscription's
  dispatch, which takes the due positions (``pop_due``) and delivers them like replayed
  entries.
* The index lives in memory only. A delayed message stays unacknowledged in the log, so
  after a restart (or a rewind, which clears the index) the cursor reads it again from
  the mark-delete position and it is indexed again: nothing is lost, and it still waits
  for its time.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable

from ledger.position import Position
from message.entry import parse_header
from message.errors import MalformedEntryError

__all__ = ["DelayedDeliveryTracker", "deliver_at_ms"]


def deliver_at_ms(data: bytes) -> int | None:
    """The entry's ``deliver_at_time`` (ms since the epoch), or None when it has none."""
    try:
        metadata = parse_header(bytes(data))[0]
    except MalformedEntryError:
        return None
    return metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None


class DelayedDeliveryTracker:
    """The delay index of one subscription; ``on_due`` is called (on the event loop) when
    the earliest indexed entry becomes due. ``clock`` gives seconds since the epoch."""

    def __init__(self, on_due: Callable[[], None], clock: Callable[[], float] = time.time) -> None:
        self._on_due = on_due
        self._clock = clock
        self._due: dict[Position, int] = {}
        self._heap: list[tuple[int, Position]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None

    def __len__(self) -> int:
        return len(self._due)

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def defer(self, position: Position, due_ms: int) -> bool:
        """Index ``position`` when ``due_ms`` is still ahead; False when it is due now."""
        if due_ms <= self.now_ms():
            return False
        if position not in self._due:
            self._due[position] = due_ms
            heapq.heappush(self._heap, (due_ms, position))
            self._schedule()
        return True

    def pop_due(self) -> list[Position]:
        """The indexed positions whose time has come, in position order (removed)."""
        now = self.now_ms()
        out: list[Position] = []
        while self._heap and self._heap[0][0] <= now:
            due_ms, position = heapq.heappop(self._heap)
            if self._due.get(position) == due_ms:
                del self._due[position]
                out.append(position)
        self._schedule()
        return sorted(out)

    def discard(self, positions: list[Position]) -> None:
        """Forget acknowledged positions (their heap items are skipped when popped)."""
        for position in positions:
            self._due.pop(position, None)

    def clear(self) -> None:
        """Forget the index (a rewind or seek: the cursor reads the entries again)."""
        self._due.clear()
        self._heap.clear()
        self._cancel()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None

    def _schedule(self) -> None:
        """Keep one timer, at the earliest due time."""
        while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        if not self._heap:
            self._cancel()
            return
        first = self._heap[0][0]
        if self._timer_at == first:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a synchronous caller: it dispatches again itself
            return
        self._cancel()
        self._timer_at = first
        # a millisecond late rather than early: the loop's timers may fire a little ahead
        self._timer = loop.call_later(max(0.0, (first - self.now_ms() + 1) / 1000), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        self._on_due()
