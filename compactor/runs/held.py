"""The ledger ids runs hold in object storage before their publish, so orphan collection spares them.

A Spark run through a bucket puts objects there that nothing records yet: the input
ledgers staging uploads (until each one's offload record) and the group ledgers the
executors write (until the publish names them). The broker's orphan collection
(``ledger.offload.Offloader.collect_orphan_objects``) deletes objects that no record, no
manifest and no in-flight offload names; ``HeldLedgers.ids`` is what it must add for runs
in flight, so that a grace period shorter than a run can never take a run's objects.

``holding()`` is a context manager around one run: the ids it is given, and those later
added through the ``hold`` function it yields (``HoldingOutput`` adds each id a Spark engine
reserves), stay held until the block ends — after the publish, or after the failure whose
clean-up deleted them. Holds are counted, so two runs holding one id both keep it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from compactor.engine import OutputLedgers

__all__ = ["HeldLedgers", "HoldingOutput"]


class HeldLedgers:
    """The ids held by the runs in flight (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[int] = Counter()

    def ids(self) -> set[int]:
        """Every id some run holds now."""
        with self._lock:
            return set(self._counts)

    @contextmanager
    def holding(self, ids: Iterable[int] = ()) -> Iterator[Callable[[Iterable[int]], None]]:
        """Hold ``ids`` and whatever the yielded ``hold`` adds, until the block ends."""
        held: list[int] = []

        def hold(more: Iterable[int]) -> None:
            more = list(more)
            with self._lock:
                self._counts.update(more)
            held.extend(more)

        hold(ids)
        try:
            yield hold
        finally:
            with self._lock:
                self._counts.subtract(held)
                for ledger_id in set(held):
                    if self._counts[ledger_id] <= 0:
                        del self._counts[ledger_id]


class HoldingOutput:
    """An engine's ``OutputLedgers`` that holds each id it reserves (``hold``)."""

    def __init__(self, ledgers: OutputLedgers, hold: Callable[[Iterable[int]], None]) -> None:
        self._ledgers = ledgers
        self._hold = hold

    def reserve_ids(self, count: int) -> list[int]:
        ids = self._ledgers.reserve_ids(count)
        self._hold(ids)
        return ids

    def delete(self, ledger_id: int) -> None:
        self._ledgers.delete(ledger_id)
