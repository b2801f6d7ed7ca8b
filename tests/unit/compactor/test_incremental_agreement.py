"""Incremental runs agree with compacting the whole history at once (issue 30, point 4).

Over generated histories (``tests.unit.compactor.history``: produce steps of every kind of
entry — keys from a small alphabet, tombstones, key-less messages, batches of several slots,
markers, undecodable entries, chunked messages — and compact steps, some with merge-happy
settings; with and without ``deleteRetentionMs``, ``minCompactionLagMs`` and
``retain_null_key``; runs over the ledger files and their key indexes, or through the store),
on the local engine:

* after every incremental run, the logical view — what a read-compacted reader gets from
  the earliest message, message ids included, the horizon and ``get_last_message_id`` —
  equals that of a ``rewrite=True`` run over the whole history on a fresh copy of the data
  dir at the same clock; so does what a reader sought to each entry of it gets; the same
  view comes back after a restart (restored from the data dir), and no ledger is left over;
* kill -9 at any point of a run (any store operation, any metadata checkpoint: its
  publishes and its merges' included, counted on a dry run over a copy) leaves, after the
  restart, the old logical view or the new one, whole, and no stray ledger; the next run
  converges on the new one.

The Spark engine's incremental runs are checked on a few fixed histories in
``tests/integration/spark/test_spark_incremental_agreement.py``; the real pulsar-client over
an incremental view in ``tests/integration/compactor/test_incremental_view_wire.py``.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

from compactor.runs.runner import Compactor
from ledger import SimulatedCrash
from ledger.database import Database
from tests.unit.compactor.history import (
    Clock,
    Compact,
    Logical,
    Opened,
    Policy,
    Produce,
    Step,
    compact,
    copied,
    difference,
    entry_starts,
    histories,
    logical,
    logical_from,
    open_dir,
    produce,
    reference,
    stray_ledgers,
)

# An example costs up to a second or two (a data dir, a copy and a reference run per
# compaction): shrinking a failure would take Hypothesis its full five minutes, past the
# suite's 300 s test timeout, so a failure is reported as drawn (steps print compactly, and
# the assertion names the messages that differ).
UNSHRUNK = (Phase.explicit, Phase.reuse, Phase.generate)
AGREEMENT = settings(max_examples=30, deadline=None, phases=UNSHRUNK, suppress_health_check=[HealthCheck.too_slow])
CRASHES = settings(max_examples=20, deadline=None, phases=UNSHRUNK, suppress_health_check=[HealthCheck.too_slow])
STORE_OPERATIONS = ("read", "append", "create", "close", "delete")
SEEKS_MAX = 4  # seeks checked per compaction

pytestmark = pytest.mark.slow  # each property takes 10-40 s on two busy cores


def assert_agrees(opened: Opened, clock: Clock, policy: Policy, root: Path, name: str,
                  published: Clock) -> tuple[Opened, Logical]:
    """The topic of ``opened`` serves the logical view of the whole history compacted at
    once at the time its view was ``published`` (a run that found nothing to compact
    publishes nothing: the view stays what the last run made of the history, whose
    expired tombstones the next run with something to compact drops), before and after
    a restart, seeks included; returns the restarted process."""
    served = logical(opened.topic)
    opened = copied(opened, clock, root / name)
    assert logical(opened.topic) == served, "the view restored from the data dir differs from the published one"
    expected, seeks = reference_with_seeks(root / name, published, policy)
    assert served == expected, difference(served, expected)
    for start, messages in seeks.items():
        assert logical_from(opened.topic, start) == messages, f"a reader sought to {start}"
    assert stray_ledgers(opened) == set()
    shutil.rmtree(root / name)
    return opened, served


def reference_with_seeks(path: Path, clock: Clock, policy: Policy) -> tuple[Logical, dict[Any, Any]]:
    """``reference`` of the copy at ``path``, and what a reader sought to a few of its
    entries gets there."""
    seeks: dict[Any, Any] = {}

    def sought(opened: Opened, expected: Logical) -> None:
        starts = list(entry_starts(expected))
        for start in starts[:: max(1, len(starts) // SEEKS_MAX)]:
            seeks[start] = logical_from(opened.topic, start)

    return reference(path, clock, policy, then=sought), seeks


def run_history(opened: Opened, clock: Clock, policy: Policy, steps: list[Step], root: Path,
                check: bool = True, compactor_of: Callable[[int, Compact], Compactor] | None = None,
                ) -> tuple[Opened, int]:
    """Carry out ``steps`` on ``opened``, checking the agreement after each compaction
    (the n-th run by ``compactor_of(n, step)``, by default the local engine's); returns the
    restarted process and the time of the last run that published."""
    published_ms = clock.ms
    runs = 0
    for number, step in enumerate(steps):
        if isinstance(step, Produce):
            produce(opened, clock, step)
            continue
        clock.ms += step.advance_ms
        before = opened.topic.view
        compactor = None if compactor_of is None else compactor_of(runs, step)
        figures = compact(opened, clock, policy, merge=step.merge, compactor=compactor)
        runs += 1
        if opened.topic.view is not before:
            published_ms = clock.ms
        if figures.merged_ledgers:
            event("a run merged ledgers")
        if figures.dead_marked:
            event("a run marked messages dead")
        if check:
            opened, _ = assert_agrees(opened, clock, policy, root, f"copy-{number}", Clock(published_ms))
    return opened, published_ms


@AGREEMENT
@given(histories(), st.booleans())
def test_after_every_incremental_run_the_logical_view_is_that_of_compacting_the_whole_history_at_once(
    history: tuple[Policy, list[Step]], through_store: bool,
) -> None:
    note(f"history: {history!r}")  # Hypothesis prints the argument blank
    policy, steps = history
    clock = Clock()
    with TemporaryDirectory() as directory:
        root = Path(directory)
        opened = open_dir(root / "topic", clock, faulty=through_store)
        try:
            opened, _ = run_history(opened, clock, policy, steps, root)
        finally:
            opened.close()


# -- kill -9 at any point of a run --------------------------------------------------------------


class Checkpoints(dict[str, Callable[..., None]]):
    """``Database.fault_points`` that count every checkpoint a run passes (by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.passed: Counter[str] = Counter()

    def get(self, name: str, default: Any = None) -> Any:
        self.passed[name] += 1
        return super().get(name, default)


CrashPoint = tuple[str, str, int]
"""("store", operation, calls before it) or ("checkpoint", name, passes before it)."""


def crash_points(opened: Opened, clock: Clock, policy: Policy, step: Compact,
                 root: Path) -> tuple[Opened, list[CrashPoint], bool]:
    """Every point the run of ``step`` would pass on ``opened``'s data dir, and whether it
    publishes, found by a dry run over a copy (a run is deterministic over the same data
    dir)."""
    opened = copied(opened, clock, root / "dry-run")
    dry = open_dir(root / "dry-run", clock, faulty=True)
    try:
        assert dry.store is not None
        database = dry.data_dir.database
        database.fault_points = checkpoints = Checkpoints()
        before, view = dict(dry.store.calls), dry.topic.view
        figures = compact(dry, clock, policy, merge=step.merge)
        publishes = dry.topic.view is not view
        if figures.dead_marked:
            event("the run to crash marks messages dead")
        if figures.merged_ledgers:
            event("the run to crash merges")
        calls = {operation: dry.store.calls.get(operation, 0) - before.get(operation, 0)
                 for operation in STORE_OPERATIONS}
        passed = dict(checkpoints.passed)
    finally:
        dry.close()
        shutil.rmtree(root / "dry-run")
    points = [("store", operation, index) for operation, count in calls.items() for index in range(count)]
    points += [("checkpoint", name, index) for name, count in sorted(passed.items()) for index in range(count)]
    return opened, points, publishes


def arm(opened: Opened, point: CrashPoint) -> None:
    kind, name, index = point
    if kind == "store":
        assert opened.store is not None
        opened.store.crash_on(name, after=index)
        return
    database: Database = opened.data_dir.database
    passes = [0]

    def crash(**_: object) -> None:
        passes[0] += 1
        if passes[0] > index:
            raise SimulatedCrash(f"crash at checkpoint {name} (pass {index})")

    database.fault_points[name] = crash


@CRASHES
@given(histories(rounds_max=3), st.data())
def test_a_kill_at_any_point_of_a_run_leaves_the_old_or_the_new_view_whole_and_the_next_run_converges(
    history: tuple[Policy, list[Step]], data: st.DataObject,
) -> None:
    note(f"history: {history!r}")  # Hypothesis prints the argument blank
    policy, steps = history
    *before, drawn = steps
    assert isinstance(drawn, Compact)
    last = Compact(drawn.advance_ms, merge=True)  # an incremental step and a merge step: both publish
    clock = Clock()
    with TemporaryDirectory() as directory:
        root = Path(directory)
        opened = open_dir(root / "topic", clock, faulty=True)
        try:
            opened, published_ms = run_history(opened, clock, policy, before, root, check=False)
            old = logical(opened.topic)
            clock.ms += last.advance_ms
            opened, points, publishes = crash_points(opened, clock, policy, last, root)
            if not points:  # a run with nothing to do passes no store operation and no publish
                return
            published = Clock(clock.ms if publishes else published_ms)
            where = data.draw(st.sampled_from(sorted({point[:2] for point in points})), label="where")
            point = data.draw(st.sampled_from([p for p in points if p[:2] == where]), label="crash point")
            event(f"crash at {point[0]} {point[1]}")
            arm(opened, point)
            with pytest.raises(SimulatedCrash):
                compact(opened, clock, policy, merge=last.merge)
            opened.kill()

            opened = open_dir(root / "topic", clock, faulty=True)
            served = logical(opened.topic)
            assert stray_ledgers(opened) == set(), "the restart left a ledger nothing references"
            opened = copied(opened, clock, root / "reference")
            new = reference(root / "reference", published, policy)
            assert served in (old, new), "the restart serves neither the old view nor the new one"
            if served == new != old:
                event("the crashed run had published")

            compact(opened, clock, policy, merge=last.merge)
            assert logical(opened.topic) == new, "the next run did not converge"
            assert stray_ledgers(opened) == set()
        finally:
            opened.close()
