"""Ledgers written whole outside the owning store (``ledger.storage.sealed_writer``) at ids
the owner reserved (``FileLedgerStore.reserve_ids``): the owner reads them as any sealed
ledger; a writer that dies leaves a temporary file that the next start removes; writing
the same ledger twice leaves one complete ledger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.data_dir import DataDir
from ledger.errors import LedgerSealedError
from ledger.storage import FileLedgerStore, LedgerState, SyncPolicy
from ledger.storage.sealed_writer import TEMP_PREFIX, ledger_file_name, write_sealed_ledger

ENTRIES = [b"one", b"", b"three" * 100, bytes(range(256))]
META = {"component": "compacted-ledger", "topic": "t", "compactedTo": "3:4"}


def test_reserved_ids_are_never_handed_out_again_even_after_a_restart(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.ALWAYS)
    first = store.create()
    reserved = store.reserve_ids(3)
    assert reserved == [first + 1, first + 2, first + 3]
    assert store.reserve_ids(0) == []
    after = store.create()
    store.shutdown()
    reopened = FileLedgerStore(str(tmp_path), sync=SyncPolicy.ALWAYS)
    try:
        assert after == first + 4
        assert reopened.create() == first + 5  # the sequence was bumped durably, files or not
    finally:
        reopened.shutdown()


def test_the_owning_store_reads_a_ledger_written_elsewhere_as_a_sealed_one(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    try:
        live = store.create()
        store.append(live, b"live").result()
        [ledger_id] = store.reserve_ids(1)
        written = write_sealed_ledger(store.root, ledger_id, META, iter(ENTRIES), created_at_ms=123)
        assert (written.entries, written.size_bytes) == (len(ENTRIES), sum(map(len, ENTRIES)))
        assert store.last_add_confirmed(ledger_id) == len(ENTRIES) - 1
        assert list(store.read(ledger_id, 0, len(ENTRIES) - 1)) == ENTRIES
        info = store.info(ledger_id)
        assert (info.state, info.metadata, info.created_at_ms) == (LedgerState.CLOSED, META, 123)
        with pytest.raises(LedgerSealedError):
            store.append(ledger_id, b"more")
        assert store.list() == [live, ledger_id]
        store.delete(ledger_id)
        assert store.list() == [live]
    finally:
        store.shutdown()
    reader = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE, read_only=True)
    try:
        assert list(reader.read(live, 0, 0)) == [b"live"]
    finally:
        reader.shutdown()


def test_an_empty_ledger_written_elsewhere_is_sealed_and_empty(tmp_path: Path) -> None:
    write_sealed_ledger(str(tmp_path), 7, META, [], created_at_ms=1)
    reader = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE, read_only=True)
    try:
        assert reader.last_add_confirmed(7) == -1
        assert reader.info(7).state is LedgerState.CLOSED
    finally:
        reader.shutdown()


def test_writing_the_same_ledger_twice_leaves_one_complete_identical_ledger(tmp_path: Path) -> None:
    write_sealed_ledger(str(tmp_path), 5, META, ENTRIES, created_at_ms=9)
    first = (tmp_path / ledger_file_name(5)).read_bytes()
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    try:
        assert list(store.read(5, 0, 3)) == ENTRIES  # the owner has it open while it is replaced
        write_sealed_ledger(str(tmp_path), 5, META, iter(ENTRIES), created_at_ms=9)
        assert list(store.read(5, 0, 3)) == ENTRIES
    finally:
        store.shutdown()
    assert (tmp_path / ledger_file_name(5)).read_bytes() == first
    assert sorted(os.listdir(tmp_path)) == [ledger_file_name(5)]


def test_a_failing_entry_source_leaves_no_file_at_all(tmp_path: Path) -> None:
    def entries() -> object:
        yield b"one"
        raise RuntimeError("the task failed")

    with pytest.raises(RuntimeError, match="the task failed"):
        write_sealed_ledger(str(tmp_path), 5, META, entries(), created_at_ms=9)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


_DYING_WRITER = """
import os, sys
from ledger.storage.sealed_writer import write_sealed_ledger
def entries():
    for index in range(5000):
        yield b"x" * 1000
    os._exit(3)  # the executor dies mid-ledger
write_sealed_ledger(sys.argv[1], int(sys.argv[2]), {}, entries(), created_at_ms=1)
"""


def test_a_writer_that_dies_leaves_a_temporary_file_that_the_next_start_removes(tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path), sync=SyncPolicy.NONE)
    [dead, written] = data_dir.ledgers.reserve_ids(2)  # type: ignore[attr-defined]
    root = data_dir.ledgers.root  # type: ignore[attr-defined]
    data_dir.close()
    result = subprocess.run([sys.executable, "-c", _DYING_WRITER, root, str(dead)], check=False, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == 3
    write_sealed_ledger(root, written, META, ENTRIES, created_at_ms=1)  # reserved, never referenced
    [temporary] = [name for name in os.listdir(root) if name.startswith(TEMP_PREFIX)]
    assert os.path.getsize(os.path.join(root, temporary)) > 0
    assert ledger_file_name(dead) not in os.listdir(root)

    reopened = DataDir.open(str(tmp_path), sync=SyncPolicy.NONE)
    try:
        assert reopened.collect_orphans() == [written]
        assert [name for name in os.listdir(root) if name != "LEDGER_ID_SEQUENCE"] == []
    finally:
        reopened.close()
