"""File backend: torn and corrupt tails, group commit, write failures, read-only views."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ledger.errors import LedgerError, LedgerFencedError, LedgerIOError
from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage.record import HEADER, MAGIC

ENTRIES = [b"first entry", b"second entry!", b"the third and last entry"]


def _ledger_file(root: Path, ledger_id: int) -> Path:
    return root / f"{ledger_id:020d}.ledger"


def _write_ledger(root: Path, *, seal: bool = False) -> tuple[int, int]:
    """A ledger holding ENTRIES; returns (ledger_id, offset where the last entry's record starts)."""
    store = FileLedgerStore(str(root), sync=SyncPolicy.ALWAYS)
    ledger_id = store.create({"topic": "t"})
    for data in ENTRIES:
        store.append(ledger_id, data).result()
    if seal:
        store.close(ledger_id)
    store.shutdown()
    size = _ledger_file(root, ledger_id).stat().st_size
    seal_bytes = HEADER.size + 16 if seal else 0
    return ledger_id, size - seal_bytes - HEADER.size - len(ENTRIES[-1])


def _recovered(root: Path, ledger_id: int) -> list[bytes]:
    store = FileLedgerStore(str(root), sync=SyncPolicy.ALWAYS)
    try:
        lac = store.last_add_confirmed(ledger_id)
        return list(store.read(ledger_id, 0, lac)) if lac >= 0 else []
    finally:
        store.shutdown()


def test_cut_at_every_byte_of_the_last_record_recovers_the_intact_prefix(tmp_path: Path) -> None:
    template, last_record = _write_ledger(tmp_path / "template")
    data = _ledger_file(tmp_path / "template", template).read_bytes()
    for cut in range(last_record, len(data)):
        root = tmp_path / f"cut{cut}"
        root.mkdir()
        _ledger_file(root, template).write_bytes(data[:cut])
        assert _recovered(root, template) == ENTRIES[:-1], f"cut at {cut}"
        # the torn tail was truncated at open, so the next append follows the intact prefix
        assert _ledger_file(root, template).stat().st_size == last_record


def test_corrupt_byte_anywhere_in_the_last_record_recovers_the_intact_prefix(tmp_path: Path) -> None:
    template, last_record = _write_ledger(tmp_path / "template")
    data = _ledger_file(tmp_path / "template", template).read_bytes()
    for index in range(last_record, len(data)):
        root = tmp_path / f"flip{index}"
        root.mkdir()
        damaged = bytearray(data)
        damaged[index] ^= 0xFF
        _ledger_file(root, template).write_bytes(bytes(damaged))
        assert _recovered(root, template) == ENTRIES[:-1], f"byte {index} flipped"


def test_garbage_after_the_last_record_is_never_served(tmp_path: Path) -> None:
    ledger_id, _ = _write_ledger(tmp_path)
    with _ledger_file(tmp_path, ledger_id).open("ab") as file:
        file.write(os.urandom(100))
    assert _recovered(tmp_path, ledger_id) == ENTRIES


def test_append_after_recovery_continues_the_intact_prefix(tmp_path: Path) -> None:
    ledger_id, last_record = _write_ledger(tmp_path)
    path = _ledger_file(tmp_path, ledger_id)
    path.write_bytes(path.read_bytes()[: last_record + 5])
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.ALWAYS)
    assert store.append(ledger_id, b"replacement").result() == 2
    store.shutdown()
    assert _recovered(tmp_path, ledger_id) == ENTRIES[:-1] + [b"replacement"]


def test_cut_seal_record_leaves_an_open_ledger_with_every_entry(tmp_path: Path) -> None:
    ledger_id, _ = _write_ledger(tmp_path, seal=True)
    path = _ledger_file(tmp_path, ledger_id)
    path.write_bytes(path.read_bytes()[:-3])
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE)
    assert not store.info(ledger_id).sealed
    assert store.info(ledger_id).entries == len(ENTRIES)
    store.shutdown()


def test_torn_create_is_not_a_ledger(tmp_path: Path) -> None:
    (tmp_path / f"{7:020d}.ledger").write_bytes(MAGIC[:5])
    store = FileLedgerStore(str(tmp_path))
    with pytest.raises(KeyError):
        store.info(7)
    assert store.create() == 8  # ids never collide with files already present
    store.shutdown()


def test_group_commit_resolves_futures_in_order_once_synced(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    ledger_ids = [store.create() for _ in range(3)]
    futures = [(lid, store.append(lid, b"%d" % i)) for i in range(300) for lid in ledger_ids]
    order: list[tuple[int, int]] = []
    lock = threading.Lock()
    for lid, future in futures:
        future.add_done_callback(lambda f, lid=lid: (lock.acquire(), order.append((lid, f.result())), lock.release()))
    for _, future in futures:
        future.result(timeout=10)
    for lid in ledger_ids:
        ids = [entry_id for ledger, entry_id in order if ledger == lid]
        assert ids == sorted(ids) == list(range(300))
        assert store.last_add_confirmed(lid) == 299
    store.shutdown()


def test_shutdown_makes_pending_appends_durable(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    ledger_id = store.create()
    futures = [store.append(ledger_id, b"x" * 100) for _ in range(1000)]
    store.shutdown()
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(LedgerFencedError):
        store.append(ledger_id, b"late")
    assert len(_recovered(tmp_path, ledger_id)) == 1000


def test_write_failure_fails_the_appends_and_fences_the_ledger(tmp_path: Path, monkeypatch) -> None:
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.ALWAYS)
    ledger_id = store.create()
    store.append(ledger_id, b"kept").result()

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)  # a disk error the real disk can't produce on cue
    with pytest.raises(LedgerIOError):
        store.append(ledger_id, b"lost")
    monkeypatch.undo()
    with pytest.raises(LedgerFencedError):
        store.append(ledger_id, b"after")
    assert store.last_add_confirmed(ledger_id) == 0
    store.shutdown()


def test_group_commit_failure_fails_every_pending_future(tmp_path: Path, monkeypatch) -> None:
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    ledger_id = store.create()
    monkeypatch.setattr(os, "fdatasync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left")))
    futures = [store.append(ledger_id, b"x") for _ in range(50)]
    for future in futures:
        assert isinstance(future.exception(timeout=10), LedgerIOError)
    monkeypatch.undo()
    assert store.last_add_confirmed(ledger_id) == -1
    store.shutdown()


def test_read_only_view_sees_sealed_and_intact_prefix_never_writes(tmp_path: Path) -> None:
    ledger_id, last_record = _write_ledger(tmp_path)
    path = _ledger_file(tmp_path, ledger_id)
    path.write_bytes(path.read_bytes()[: last_record + 4])
    before = path.read_bytes()
    reader = FileLedgerStore(str(tmp_path), read_only=True)
    assert list(reader.read(ledger_id, 0, 1)) == ENTRIES[:2]
    assert reader.last_add_confirmed(ledger_id) == 1
    with pytest.raises(LedgerError, match="read-only"):
        reader.append(ledger_id, b"x")
    reader.shutdown()
    assert path.read_bytes() == before  # the torn tail is the owner's to repair, not a reader's
