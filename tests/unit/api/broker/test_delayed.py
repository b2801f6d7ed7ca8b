"""The delay index: each deferred position comes out once, when due, in position order."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from api.broker.delayed import DelayedDeliveryTracker
from ledger.position import Position


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(-2000, 5000)), max_size=40),
       st.lists(st.integers(0, 50), max_size=10), st.lists(st.integers(0, 6000), max_size=6))
def test_every_deferred_position_comes_out_once_when_due_and_in_order(
        deferrals: list[tuple[int, int]], acked: list[int], steps: list[int]) -> None:
    clock = _Clock()
    tracker = DelayedDeliveryTracker(lambda: None, clock)
    start_ms = tracker.now_ms()
    due: dict[Position, int] = {}
    for entry, offset_ms in deferrals:
        position = Position(1, entry)
        if tracker.defer(position, start_ms + offset_ms):
            due.setdefault(position, start_ms + offset_ms)
        else:
            assert offset_ms <= 0
    tracker.discard([Position(1, e) for e in acked])
    for e in acked:
        due.pop(Position(1, e), None)
    out: list[Position] = []
    for step in sorted(steps) + [6000]:
        clock.now = 1000.0 + step / 1000
        popped = tracker.pop_due()
        assert popped == sorted(popped)
        assert all(due[p] <= tracker.now_ms() for p in popped)
        out.extend(popped)
    assert sorted(out) == sorted(due) and len(out) == len(set(out))
    assert len(tracker) == 0


def test_the_timer_calls_back_when_the_earliest_is_due() -> None:
    async def main() -> None:
        fired = asyncio.Event()
        tracker = DelayedDeliveryTracker(fired.set)
        tracker.defer(Position(1, 2), tracker.now_ms() + 300)
        tracker.defer(Position(1, 1), tracker.now_ms() + 50)
        async with asyncio.timeout(5):
            await fired.wait()
        assert tracker.pop_due() == [Position(1, 1)]
        fired.clear()
        async with asyncio.timeout(5):
            await fired.wait()
        assert tracker.pop_due() == [Position(1, 2)]

    asyncio.run(main())
