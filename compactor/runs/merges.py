"""The merge policy: which ledgers of a view a run's merge step rewrites.

Incremental runs append one ledger per run to the view and mark older data dead
(``compactor.view.marks``); left alone, a view would grow a ledger per run and keep dead
bytes forever. After its incremental step a run plans one merge step (``plan_merges``): groups
of adjacent ledgers, each rewritten as one new ledger holding the group's live entries
(positions never change, so the stream order holds). Two rules:

* **Dead ratio** (Kafka's ``min.cleanable.dirty.ratio``): a ledger whose dead messages /
  messages exceeds ``dead_ratio`` is rewritten, alone if no tier rule takes it.
* **Tiers** (size-tiered, as an LSM tree's): a ledger's tier is
  ``floor(log_F(max(live bytes, TIER_BASE_BYTES) / TIER_BASE_BYTES))`` with ``F`` the
  fan-in; the plan keeps tiers non-increasing along the view (older ledgers are the larger)
  and fewer than ``F`` ledgers per tier: a ledger of a higher tier than the one before it
  is merged with the smaller ones before it, and ``F`` ledgers of one tier are merged into
  one (of a higher tier: ``F`` ledgers of at least ``F**t`` base units make at least
  ``F**(t+1)``).

**The bound.** After the merge step a view of ``B`` live bytes holds at most
``(F - 1) * (T + 1)`` ledgers, ``T = floor(log_F(B / TIER_BASE_BYTES))`` (for ``F`` = 4 and
1 TiB: 4 tiers of bytes below 1 MiB to 1 TiB, 3 × 11 = 33 ledgers). **Write amplification:**
a byte is rewritten when its ledger merges into a higher tier, so at most ``T + 1`` times
over its life (``O(log N)``), plus once each time its ledger passes the dead ratio, against
once per run for a full rewrite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TIER_BASE_BYTES", "LedgerShape", "ledgers_max", "plan_merges", "tier"]

TIER_BASE_BYTES = 1 << 20
"""Ledgers of fewer live bytes are all of tier 0."""


@dataclass(frozen=True, slots=True)
class LedgerShape:
    """What the policy knows of one ledger of a view: its bytes stored and its dead ratio."""

    size_bytes: int
    dead_ratio: float = 0.0

    @property
    def live_bytes(self) -> int:
        """The bytes a rewrite of the ledger would keep (estimated from the dead ratio)."""
        return int(self.size_bytes * (1.0 - self.dead_ratio))


def tier(live_bytes: int, fan_in: int) -> int:
    """The tier of a ledger of ``live_bytes``."""
    units = max(live_bytes, TIER_BASE_BYTES) // TIER_BASE_BYTES
    level = 0
    while units >= fan_in:
        units //= fan_in
        level += 1
    return level


def ledgers_max(live_bytes: int, fan_in: int) -> int:
    """The most ledgers a view of ``live_bytes`` holds after a merge step (the bound)."""
    return (fan_in - 1) * (tier(live_bytes, fan_in) + 1)


def plan_merges(ledgers: Sequence[LedgerShape], *, dead_ratio: float, fan_in: int) -> list[tuple[int, int]]:
    """The groups ``(first, last)`` (inclusive places in ``ledgers``, ascending, disjoint) the
    merge step rewrites, each as one ledger (module docstring); empty: nothing to do."""
    if fan_in < 2:
        raise ValueError(f"compaction_merge_fan_in must be at least 2, not {fan_in}")
    # units: (first, last, live bytes, rewritten)
    units = [(place, place, shape.live_bytes, shape.dead_ratio > dead_ratio and not math.isclose(shape.dead_ratio, 0))
             for place, shape in enumerate(ledgers)]

    def merged(first: int, last: int) -> None:
        group = units[first:last + 1]
        units[first:last + 1] = [(group[0][0], group[-1][1], sum(unit[2] for unit in group), True)]

    while True:
        tiers = [tier(unit[2], fan_in) for unit in units]
        rising = next((place for place in range(1, len(units)) if tiers[place] > tiers[place - 1]), None)
        if rising is not None:
            first = rising - 1
            while first > 0 and tiers[first - 1] < tiers[rising]:
                first -= 1
            merged(first, rising)
            continue
        crowded = next((place for place in range(len(units) - fan_in + 1)
                        if len(set(tiers[place:place + fan_in])) == 1), None)
        if crowded is None:
            break
        merged(crowded, crowded + fan_in - 1)
    return [(first, last) for first, last, _, rewritten in units if rewritten]
