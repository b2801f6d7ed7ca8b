"""The minimum compaction lag (Kafka's ``min.compaction.lag.ms``, the ``minCompactionLagMs``
policy), as pure functions over plain values.

A message published less than the lag ago is *young*: no run may compact it away, so a
consumer that is behind by less than the lag sees every update. A run therefore moves its
stop marker back: it covers the raw entries after the horizon up to, and not including,
the **first** young entry in position order; everything from that entry on waits for a
later run, even an older entry after it (publish times of different producers interleave;
like Kafka, which holds back a whole segment whose newest record is young, and every
segment after it). Older messages are compacted as before.

``young_after_ms`` is the run's cut-off: ``now − lag``; an entry whose ``publish_time`` is
greater than it is young (a message exactly the lag old is not). A lag of 0 or less holds
nothing back (``young_after``: None). The runner (``compactor.runs.runner``) reads the clock once
per run and feeds the raw entries' publish times here; an entry whose metadata cannot be
read counts as published at 0 (old), as a marker does, since neither holds a message a
consumer could miss.
"""

from __future__ import annotations

from collections.abc import Iterable

from ledger.position import Position

__all__ = ["stop_before_young", "young_after"]


def young_after(now_ms: int, min_compaction_lag_ms: int) -> int | None:
    """The cut-off of a run at ``now_ms``: entries published after it are young; None
    when the lag is off (0 or less)."""
    return now_ms - min_compaction_lag_ms if min_compaction_lag_ms > 0 else None


def stop_before_young(
    publish_times: Iterable[tuple[Position, int]], young_after_ms: int | None, *, horizon: Position,
) -> Position:
    """The stop marker the lag allows: the last of ``publish_times`` (``(position,
    publish_time)`` of the raw entries after ``horizon``, in position order, up to the
    run's stop marker) before the first young one; ``horizon`` when the first is young
    (or there is none). With no cut-off, the last position given."""
    stop = horizon
    for position, publish_time in publish_times:
        if young_after_ms is not None and publish_time > young_after_ms:
            break
        stop = position
    return stop
