"""Ledger file descriptors are bounded: idle ones close least recently used first, pinned
ones never close, and a file is reopened on its next use."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage.handles import FileHandles


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _files(tmp_path: Path, count: int) -> list[str]:
    paths = [str(tmp_path / f"f{i}") for i in range(count)]
    for path in paths:
        Path(path).write_bytes(b"x")
    return paths


def test_idle_descriptors_past_the_bound_close_least_recently_used_first(tmp_path: Path) -> None:
    paths = _files(tmp_path, 4)
    handles = FileHandles(2, flags=os.O_RDONLY)
    fds = {}
    for key in (0, 1):
        handle = handles.pin(key, paths[key])
        fds[key] = handle.fd
        handles.unpin(handle)
    handles.unpin(handles.pin(0, paths[0]))  # 0 is now the most recently used
    handles.unpin(handles.pin(2, paths[2]))
    assert handles.open_count == 2
    assert not _is_open(fds[1]) and _is_open(fds[0])
    reopened = handles.pin(1, paths[1])  # reopened on demand
    assert os.pread(reopened.fd, 1, 0) == b"x"
    handles.unpin(reopened)
    handles.close_all()
    assert handles.open_count == 0


def test_a_pinned_descriptor_is_never_closed_and_a_discarded_one_closes_at_its_last_unpin(tmp_path: Path) -> None:
    paths = _files(tmp_path, 3)
    handles = FileHandles(1, flags=os.O_RDONLY)
    first = handles.pin(0, paths[0])
    second = handles.pin(1, paths[1])  # both in use: the bound is passed for the moment
    assert handles.open_count == 2 and _is_open(first.fd) and _is_open(second.fd)
    handles.unpin(second)
    assert handles.open_count == 1 and not _is_open(second.fd) and _is_open(first.fd)
    handles.discard(0)  # deleted while a reader holds it
    assert _is_open(first.fd)
    fd = first.fd
    handles.unpin(first)
    assert not _is_open(fd) and handles.open_count == 0


def test_a_store_holds_at_most_max_open_files_idle_and_reopens_them_on_demand(tmp_path: Path) -> None:
    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP, max_open_files=3)
    before = descriptors()
    ledger_ids = [store.create() for _ in range(20)]
    for round_ in range(3):
        futures = [store.append(ledger_id, b"%d:%d" % (ledger_id, round_)) for ledger_id in ledger_ids]
        for future in futures:
            future.result(timeout=10)
        assert descriptors() <= before + 3
    for ledger_id in ledger_ids[::2]:
        store.close(ledger_id)
    for ledger_id in ledger_ids:
        assert list(store.read(ledger_id, 0, 2)) == [b"%d:%d" % (ledger_id, r) for r in range(3)]
        assert descriptors() <= before + 3
    store.shutdown()
    assert descriptors() <= before
    reopened = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP, max_open_files=3)
    for ledger_id in ledger_ids:
        assert reopened.info(ledger_id).sealed == (ledger_id in ledger_ids[::2])
        assert reopened.info(ledger_id).entries == 3
    reopened.shutdown()
