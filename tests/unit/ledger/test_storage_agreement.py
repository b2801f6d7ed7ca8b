"""Agreement test (P12): every ledger store backend behaves like a dict of lists.

A ``RuleBasedStateMachine`` applies the same random operations to a ``MemoryLedgerStore``,
a ``FileLedgerStore`` and a trivial model, and after every step asserts that all three
agree on ``list()``, ``info()``, ``last_add_confirmed()``, the bytes of every ledger, and on
the errors they raise. The file store is also shut down and reopened on the same directory
("reopen"): nothing it confirmed may change, open ledgers included. The machine runs once
per ``SyncPolicy``, ``ALWAYS`` with fewer examples because it fsyncs every append.

Each backend allocates its own ledger ids, so the model keys ledgers by its own id and
keeps, per ledger, the id each backend handed out.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ledger.errors import LedgerNotFoundError, LedgerSealedError, PositionOutOfRangeError
from ledger.storage import FileLedgerStore, LedgerState, LedgerStore, MemoryLedgerStore, SyncPolicy

# How long a test waits for a group-commit future; far above any fsync, far below the
# pytest timeout, so a lost future fails the test instead of hanging it.
FUTURE_TIMEOUT_S = 10
# An id no backend hands out within one example (ids start at 1 and grow by one).
UNKNOWN_LEDGER_ID = 10**9

metadata_maps = st.dictionaries(
    st.text(max_size=6), st.text(max_size=8), max_size=3
)
entry_data = st.binary(max_size=48)  # includes b"": an empty entry is a legal entry
choices = st.integers(min_value=0, max_value=2**16)


@dataclass
class ModelLedger:
    """The model of one ledger, and its id in each backend."""

    memory_id: int
    file_id: int
    metadata: dict[str, str]
    entries: list[bytes] = field(default_factory=list)
    sealed: bool = False


def expect_error(error: type[BaseException], call: Callable[[], Any]) -> None:
    with pytest.raises(error):
        call()


class StorageAgreement(RuleBasedStateMachine):
    """Memory store, file store and model under one sequence of operations."""

    sync = SyncPolicy.GROUP
    max_open_files = 256

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="storage-agreement-")
        self.memory = MemoryLedgerStore()
        self.file = self._open_file_store()
        self.model: dict[int, ModelLedger] = {}
        self.deleted: list[ModelLedger] = []
        self.next_model_id = 1
        self.highest_id = {"memory": 0, "file": 0}

    def _open_file_store(self) -> FileLedgerStore:
        return FileLedgerStore(str(Path(self.root) / "ledgers"), sync=self.sync,
                               max_open_files=self.max_open_files)

    def teardown(self) -> None:
        self.file.shutdown()
        self.memory.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers ------------------------------------------------------------------------

    def backends(self, ledger: ModelLedger) -> list[tuple[LedgerStore, int]]:
        return [(self.memory, ledger.memory_id), (self.file, ledger.file_id)]

    def pick(self, choice: int) -> ModelLedger:
        ids = sorted(self.model)
        return self.model[ids[choice % len(ids)]]

    def pick_open(self, choice: int) -> ModelLedger:
        open_ids = sorted(model_id for model_id, ledger in self.model.items() if not ledger.sealed)
        return self.model[open_ids[choice % len(open_ids)]]

    def has_open(self) -> bool:
        return any(not ledger.sealed for ledger in self.model.values())

    def append_all(self, ledger: ModelLedger, payloads: list[bytes]) -> None:
        """Append ``payloads`` to both backends, waiting only at the end (group commit)."""
        futures: list[tuple[int, Future[int], Future[int]]] = []
        for data in payloads:
            expected = len(ledger.entries)
            ledger.entries.append(data)
            futures.append((expected, self.memory.append(ledger.memory_id, data),
                            self.file.append(ledger.file_id, data)))
        for expected, in_memory, on_file in futures:
            assert in_memory.result(timeout=FUTURE_TIMEOUT_S) == expected
            assert on_file.result(timeout=FUTURE_TIMEOUT_S) == expected

    # -- rules --------------------------------------------------------------------------

    @rule(metadata=metadata_maps)
    def create(self, metadata: dict[str, str]) -> None:
        memory_id = self.memory.create(metadata)
        file_id = self.file.create(metadata)
        # ids are unique and larger than every id handed out before, deleted ones included
        assert memory_id > self.highest_id["memory"]
        assert file_id > self.highest_id["file"]
        self.highest_id = {"memory": memory_id, "file": file_id}
        self.model[self.next_model_id] = ModelLedger(memory_id, file_id, dict(metadata))
        self.next_model_id += 1

    @precondition(lambda self: self.has_open())
    @rule(choice=choices, data=entry_data)
    def append(self, choice: int, data: bytes) -> None:
        self.append_all(self.pick_open(choice), [data])

    @precondition(lambda self: self.has_open())
    @rule(choice=choices, payloads=st.lists(entry_data, min_size=2, max_size=6))
    def append_several_then_wait(self, choice: int, payloads: list[bytes]) -> None:
        """Several appends in flight at once: their futures resolve in append order."""
        self.append_all(self.pick_open(choice), payloads)

    @precondition(lambda self: self.has_open())
    @rule(choice=choices, payloads=st.lists(entry_data, min_size=1, max_size=4))
    def close_with_appends_in_flight(self, choice: int, payloads: list[bytes]) -> None:
        """``close`` makes every pending append durable before it seals."""
        ledger = self.pick_open(choice)
        first = len(ledger.entries)
        ledger.entries.extend(payloads)
        pending = [(self.memory.append(ledger.memory_id, data), self.file.append(ledger.file_id, data))
                   for data in payloads]
        for store, ledger_id in self.backends(ledger):
            store.close(ledger_id)
        ledger.sealed = True
        for offset, (in_memory, on_file) in enumerate(pending):
            assert in_memory.result(timeout=FUTURE_TIMEOUT_S) == first + offset
            assert on_file.result(timeout=FUTURE_TIMEOUT_S) == first + offset

    @precondition(lambda self: bool(self.model))
    @rule(choice=choices)
    def close(self, choice: int) -> None:
        ledger = self.pick(choice)
        for store, ledger_id in self.backends(ledger):
            store.close(ledger_id)  # closing a sealed ledger again is a no-op
        ledger.sealed = True

    @precondition(lambda self: bool(self.model))
    @rule(choice=choices, data=entry_data)
    def append_to_sealed_is_refused(self, choice: int, data: bytes) -> None:
        sealed = [ledger for ledger in self.model.values() if ledger.sealed]
        if not sealed:
            return
        ledger = sealed[choice % len(sealed)]
        for store, ledger_id in self.backends(ledger):
            expect_error(LedgerSealedError, lambda s=store, i=ledger_id: s.append(i, data))

    @precondition(lambda self: bool(self.model))
    @rule(choice=choices)
    def delete(self, choice: int) -> None:
        ledger = self.pick(choice)
        for store, ledger_id in self.backends(ledger):
            store.delete(ledger_id)
            store.delete(ledger_id)  # deleting a missing ledger is a no-op
        self.model = {key: value for key, value in self.model.items() if value is not ledger}
        self.deleted.append(ledger)

    @precondition(lambda self: bool(self.model))
    @rule(choice=choices, first=st.integers(min_value=-2, max_value=12),
          count=st.integers(min_value=-1, max_value=12))
    def read_a_range(self, choice: int, first: int, count: int) -> None:
        """Any range: inside ``0..last_add_confirmed`` it reads, outside it is refused."""
        ledger = self.pick(choice)
        last = first + count - 1
        inside = 0 <= first <= last < len(ledger.entries)
        for store, ledger_id in self.backends(ledger):
            if inside:
                assert list(store.read(ledger_id, first, last)) == ledger.entries[first : last + 1]
            else:
                expect_error(PositionOutOfRangeError,
                             lambda s=store, i=ledger_id: s.read(i, first, last))

    @rule(choice=choices, data=entry_data)
    def unknown_and_deleted_ledgers_are_not_found(self, choice: int, data: bytes) -> None:
        targets = [(self.memory, UNKNOWN_LEDGER_ID), (self.file, UNKNOWN_LEDGER_ID)]
        if self.deleted:
            gone = self.deleted[choice % len(self.deleted)]
            targets += self.backends(gone)
        for store, ledger_id in targets:
            for call in (lambda s=store, i=ledger_id: s.info(i),
                         lambda s=store, i=ledger_id: s.last_add_confirmed(i),
                         lambda s=store, i=ledger_id: s.read(i, 0, 0),
                         lambda s=store, i=ledger_id: s.append(i, data),
                         lambda s=store, i=ledger_id: s.close(i)):
                expect_error(LedgerNotFoundError, call)

    @rule()
    def reopen_file_store(self) -> None:
        """Shut down and reopen on the same directory: confirmed state is unchanged, and
        ledgers that were open stay open (sealing them is the managed ledger's job)."""
        self.file.shutdown()
        self.file = self._open_file_store()

    @rule()
    def read_only_view_agrees(self) -> None:
        """A second, read-only store on the directory sees every confirmed entry."""
        view = FileLedgerStore(str(Path(self.root) / "ledgers"), sync=self.sync, read_only=True,
                               max_open_files=self.max_open_files)
        try:
            assert view.list() == sorted(ledger.file_id for ledger in self.model.values())
            for ledger in self.model.values():
                self.assert_ledger_agrees(view, ledger.file_id, ledger)
        finally:
            view.shutdown()

    # -- invariants ---------------------------------------------------------------------

    def assert_ledger_agrees(self, store: LedgerStore, ledger_id: int, ledger: ModelLedger) -> None:
        info = store.info(ledger_id)
        assert info.ledger_id == ledger_id
        assert info.state is (LedgerState.CLOSED if ledger.sealed else LedgerState.OPEN)
        assert info.sealed == ledger.sealed
        assert info.last_add_confirmed == len(ledger.entries) - 1
        assert info.entries == len(ledger.entries)
        assert info.size_bytes == sum(len(data) for data in ledger.entries)
        assert dict(info.metadata) == ledger.metadata
        assert store.last_add_confirmed(ledger_id) == len(ledger.entries) - 1
        if ledger.entries:
            assert list(store.read(ledger_id, 0, len(ledger.entries) - 1)) == ledger.entries

    @invariant()
    def backends_agree_with_the_model(self) -> None:
        assert self.memory.list() == sorted(ledger.memory_id for ledger in self.model.values())
        assert self.file.list() == sorted(ledger.file_id for ledger in self.model.values())
        for ledger in self.model.values():
            for store, ledger_id in self.backends(ledger):
                self.assert_ledger_agrees(store, ledger_id, ledger)


def _machine(sync: SyncPolicy, max_open_files: int) -> type[StorageAgreement]:
    return type(f"StorageAgreement{sync.name.title()}", (StorageAgreement,),
                {"sync": sync, "max_open_files": max_open_files})


@pytest.mark.parametrize(
    ("sync", "max_examples", "max_open_files"),
    [(SyncPolicy.GROUP, 40, 256), (SyncPolicy.NONE, 40, 256), (SyncPolicy.ALWAYS, 10, 256),
     (SyncPolicy.GROUP, 40, 1), (SyncPolicy.NONE, 20, 2)],
    ids=["group", "none", "always", "group-one-open-file", "none-two-open-files"],
)
def test_backends_agree_with_the_model(sync: SyncPolicy, max_examples: int, max_open_files: int) -> None:
    """``max_open_files`` of 1 or 2 closes and reopens ledger files all the time."""
    run_state_machine_as_test(
        _machine(sync, max_open_files),
        settings=settings(max_examples=max_examples, stateful_step_count=30, deadline=None),
    )
