"""``compactor.runs.held``: what a Spark run holds in the bucket stays held until its block
ends, holds are counted across runs, and the broker's orphan collection spares them."""

from __future__ import annotations

import threading

import pytest

from compactor.runs.held import HeldLedgers, HoldingOutput


class _Store:
    def __init__(self) -> None:
        self.next_id = 10
        self.deleted: list[int] = []

    def reserve_ids(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    def delete(self, ledger_id: int) -> None:
        self.deleted.append(ledger_id)


def test_ids_are_held_until_the_block_ends_even_when_it_fails() -> None:
    held = HeldLedgers()
    store = _Store()
    with pytest.raises(RuntimeError), held.holding([1, 2]) as hold:
        output = HoldingOutput(store, hold)
        assert output.reserve_ids(2) == [10, 11]
        assert held.ids() == {1, 2, 10, 11}
        output.delete(10)
        assert store.deleted == [10]
        raise RuntimeError("the run failed")
    assert held.ids() == set()


def test_two_runs_holding_one_id_both_keep_it() -> None:
    held = HeldLedgers()
    with held.holding([5]):
        with held.holding([5, 6]):
            assert held.ids() == {5, 6}
        assert held.ids() == {5}
    assert held.ids() == set()


def test_holds_from_many_threads_add_up_and_all_end() -> None:
    held = HeldLedgers()
    start = threading.Barrier(8)

    def run(index: int) -> None:
        start.wait()
        for _ in range(200):
            with held.holding([index % 3, 100 + index]) as hold:
                hold([7])

    threads = [threading.Thread(target=run, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert held.ids() == set()
