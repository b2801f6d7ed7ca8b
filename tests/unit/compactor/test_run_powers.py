"""What a run asks of the topic's ledger and of its store (``compactor.runs.runner``).

* A run plans with one ``ManagedLedger.snapshot``: its stop marker, the entries it will read
  and the per-ledger ranges of every round come from it, never from separate questions that
  appends in between could make disagree.
* A run asks the store for its file powers (``LedgerStore.file_powers``) and goes by the
  answer: the spark engine refuses a store without ledger files before it starts a job, and
  rounds over files run only where the store has them (a faulty store has none, so its
  fault points see every operation).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compactor.engine import KEY_MAP_BYTES_PER_KEY, OutputLedgers, RewriteInput, RewriteResult
from compactor.errors import SparkEngineError
from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.view.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.storage import FaultyLedgerStore, LedgerStore
from tests.unit.compactor.test_crash import _append, _workload

TOPIC = "persistent://public/default/run-powers"
RUNNER = "compactor/runs/runner.py"
QUESTIONS = ("snapshot", "ledger_list", "last_confirmed_position", "entries_between", "current_ledger_id")


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often the runner's own code asks the managed ledger each planning question."""
    counts: Counter[str] = Counter()

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def ask(self: ManagedLedger, *args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_code.co_filename.endswith(RUNNER):
                counts[name] += 1
            return real(self, *args, **kwargs)
        return ask

    for name in QUESTIONS:
        real = getattr(ManagedLedger, name)
        if isinstance(real, property):
            assert real.fget is not None
            monkeypatch.setattr(ManagedLedger, name, property(counting(name, real.fget)))
        else:
            monkeypatch.setattr(ManagedLedger, name, counting(name, real))
    return counts


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Callable[[Callable[[LedgerStore], LedgerStore] | None], CompactedTopic]]:
    made: list[DataDir] = []

    def open_topic(wrap: Callable[[LedgerStore], LedgerStore] | None = None) -> CompactedTopic:
        data_dir = DataDir.open(str(tmp_path / f"data-{len(made)}"))
        made.append(data_dir)
        collect_orphans(data_dir)
        store = data_dir.ledgers if wrap is None else wrap(data_dir.ledgers)
        ledger = ManagedLedger.open(TOPIC, store, data_dir.metadata, ManagedLedgerConfig(max_entries_per_ledger=8))
        return CompactedTopic.restore(ledger, CursorStore(data_dir.database))

    yield open_topic
    for data_dir in made:
        data_dir.close()


@pytest.mark.parametrize("key_index", [True, False], ids=["rounds-over-files", "rounds-through-the-store"])
def test_a_run_in_several_rounds_plans_with_one_snapshot(
    asked: Counter[str], opened: Callable[..., CompactedTopic], key_index: bool,
) -> None:
    topic = opened()
    compactor = Compactor(CompactionConfig(engine="local", read_batch_entries=4, key_index=key_index,
                                           memory_budget_bytes=3 * KEY_MAP_BYTES_PER_KEY))
    for seed in (1, 2):
        _append(topic.ledger, _workload(seed, 40))
        figures = compactor.compact(topic)
        assert figures.rounds > 1  # the budget makes the run go in rounds: each plans from the snapshot
    assert topic.view is not None and topic.view.horizon == topic.ledger.last_confirmed_position()
    assert asked == Counter(snapshot=2)


def test_an_empty_run_takes_its_snapshot_and_writes_nothing(
    asked: Counter[str], opened: Callable[..., CompactedTopic],
) -> None:
    topic = opened()
    assert Compactor(CompactionConfig(engine="local")).compact(topic).ledger_id == -1
    assert asked == Counter(snapshot=1)


class NeverRun:
    """A ``RewriteEngine`` that records being asked to run."""

    driver_bytes_per_key = 1

    def __init__(self) -> None:
        self.requests: list[RewriteInput] = []

    def compact(self, request: RewriteInput, ledgers: OutputLedgers) -> RewriteResult:
        self.requests.append(request)
        raise AssertionError("the spark engine must not run over a store without ledger files")


def test_the_spark_engine_refuses_a_store_without_file_powers(opened: Callable[..., CompactedTopic]) -> None:
    topic = opened(FaultyLedgerStore)  # ledger files underneath, but the faulty store shows none
    _append(topic.ledger, _workload(3, 10))
    engine = NeverRun()
    compactor = Compactor(CompactionConfig(engine="spark"), spark_engine=engine)
    with pytest.raises(SparkEngineError, match="reads and writes ledger files, and this store has none"):
        compactor.compact(topic)
    assert engine.requests == []
    assert topic.view is None


def test_rounds_through_a_faulty_store_pass_its_fault_points(opened: Callable[..., CompactedTopic]) -> None:
    """Over files, a round would read and write them in another place; through a store
    without file powers every read and append of the run is the store's."""
    faulty: list[FaultyLedgerStore] = []

    def wrap(store: LedgerStore) -> LedgerStore:
        faulty.append(FaultyLedgerStore(store))
        return faulty[0]

    topic = opened(wrap)
    _append(topic.ledger, _workload(4, 30))
    reads_before, appends_before = faulty[0].calls.get("read", 0), faulty[0].calls.get("append", 0)
    figures = Compactor(CompactionConfig(engine="local", key_index=True)).compact(topic)
    assert faulty[0].calls["read"] > reads_before
    assert faulty[0].calls["append"] - appends_before == figures.entries_written > 0
