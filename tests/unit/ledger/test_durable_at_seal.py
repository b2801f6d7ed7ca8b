"""A ``durable_at_seal`` ledger (a compacted ledger) syncs once, at its seal, and is written
in blocks on the appending thread, never through the group-commit flusher that live
topics' appends wait on. The syncs are counted by standing in for ``os`` as the file store
sees it (only counting; every call goes to the real ``os``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledger.storage.file as file_module
from ledger.errors import LedgerError, LedgerIOError
from ledger.storage import FileLedgerStore, SyncPolicy, file_io

ENTRIES = 3000
BOUND_S = 10


class CountingOs:
    """``os`` for the file store, counting syncs per thread name; ``fail_writes`` makes
    ``pwrite`` fail with EIO."""

    def __init__(self) -> None:
        self.syncs: dict[str, int] = {}
        self.fail_writes = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _count(self) -> None:
        name = threading.current_thread().name
        self.syncs[name] = self.syncs.get(name, 0) + 1

    def fsync(self, fd: int) -> None:
        self._count()
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._count()
        os.fdatasync(fd)

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        if self.fail_writes:
            raise OSError(5, "Input/output error")
        return os.pwrite(fd, data, offset)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingOs:
    fake = CountingOs()
    monkeypatch.setattr(file_module, "os", fake)
    monkeypatch.setattr(file_io, "os", fake)  # the store's plain file operations
    return fake


@pytest.fixture
def store(tmp_path: Path, counting: CountingOs) -> Iterator[FileLedgerStore]:
    opened = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    yield opened
    opened.shutdown()


def _payload(i: int) -> bytes:
    return b"%06d" % i * 100  # 600 B: the entries fill a few blocks


def test_appends_to_a_durable_at_seal_ledger_never_sync_and_never_reach_the_flusher_and_the_seal_keeps_them(
    store: FileLedgerStore, counting: CountingOs, tmp_path: Path,
) -> None:
    ledger_id = store.create({"component": "compacted-ledger"}, durable_at_seal=True)
    created_syncs = sum(counting.syncs.values())
    futures = [store.append(ledger_id, _payload(i)) for i in range(ENTRIES)]
    assert all(f.done() for f in futures), "an append waited for a sync"
    assert [f.result() for f in futures] == list(range(ENTRIES))
    assert sum(counting.syncs.values()) == created_syncs, f"appends synced: {counting.syncs}"
    assert 0 <= store.last_add_confirmed(ledger_id) < ENTRIES - 1, "blocks are written as they fill"
    store.close(ledger_id)
    assert sum(counting.syncs.values()) > created_syncs, "the seal did not sync"
    assert counting.syncs.get("ledger-flusher", 0) == 0, "a compacted append went through the flusher"
    reopened = FileLedgerStore(str(tmp_path / "ledgers"), read_only=True)
    assert list(reopened.read(ledger_id, 0, ENTRIES - 1)) == [_payload(i) for i in range(ENTRIES)]
    assert reopened.info(ledger_id).sealed


def test_a_live_ledger_beside_it_still_syncs_each_group_through_the_flusher(
    store: FileLedgerStore, counting: CountingOs,
) -> None:
    live = store.create()
    store.append(live, b"live").result(BOUND_S)
    assert counting.syncs.get("ledger-flusher", 0) >= 1


def test_a_durable_at_seal_ledger_left_unsealed_by_a_crash_serves_only_an_intact_prefix(
    store: FileLedgerStore, tmp_path: Path,
) -> None:
    ledger_id = store.create(durable_at_seal=True)
    for i in range(ENTRIES):
        store.append(ledger_id, _payload(i))
    written = store.last_add_confirmed(ledger_id)  # the crash: nothing after this reached the file
    recovered = FileLedgerStore(str(tmp_path / "ledgers"), read_only=True)
    kept = recovered.last_add_confirmed(ledger_id)
    assert kept == written, "the recovery scan found other than the written blocks"
    assert list(recovered.read(ledger_id, 0, kept)) == [_payload(i) for i in range(kept + 1)]
    assert not recovered.info(ledger_id).sealed


def test_a_failed_block_write_fences_the_ledger_and_the_failure_reaches_the_appender(
    store: FileLedgerStore, counting: CountingOs,
) -> None:
    ledger_id = store.create(durable_at_seal=True)
    counting.fail_writes = True
    with pytest.raises(LedgerIOError):
        for i in range(ENTRIES):
            store.append(ledger_id, _payload(i))
    counting.fail_writes = False
    with pytest.raises(LedgerError, match="fenced"):
        store.append(ledger_id, b"after the failure")
