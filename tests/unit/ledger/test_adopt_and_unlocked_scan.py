"""Loading a ledger holds up no other ledger: a sealed ledger written elsewhere is adopted
from its writer's layout (``FileLedgerStore.adopt_sealed``: no scan), and any other load
scans the file outside the store's lock (``_preload``).

Adopted ledgers must answer exactly what a scan would (property test over entries and
metadata), a layout that does not match the file is refused (the file is then scanned), and
a damaged entry of an adopted ledger is still refused when read.
"""

from __future__ import annotations

import os
import threading
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import CorruptEntryError, LedgerNotFoundError
from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage import file as file_module
from ledger.storage.sealed_writer import ledger_file_name, write_sealed_ledger

META = {"component": "compacted-ledger", "topic": "t", "compactedTo": "3:4"}
WAIT_S = 10.0


def answers(store: FileLedgerStore, ledger_id: int) -> tuple[object, ...]:
    lac = store.last_add_confirmed(ledger_id)
    entries = list(store.read(ledger_id, 0, lac)) if lac >= 0 else []
    return lac, entries, store.info(ledger_id), store.confirmed_length(ledger_id)


@settings(max_examples=60, deadline=None)
@given(entries=st.lists(st.binary(max_size=300), max_size=40),
       metadata=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))
def test_an_adopted_ledger_answers_what_a_scanned_one_does(tmp_path_factory: pytest.TempPathFactory,
                                                           entries: list[bytes], metadata: dict[str, str]) -> None:
    root = tmp_path_factory.mktemp("adopt")
    written = write_sealed_ledger(str(root), 5, metadata, iter(entries), created_at_ms=42)
    assert (written.entries, written.size_bytes) == (len(entries), sum(map(len, entries)))
    adopting, scanning = (FileLedgerStore(str(root), sync=SyncPolicy.NONE) for _ in range(2))
    try:
        assert adopting.adopt_sealed(5, written.entry_offsets, written.entry_lengths)
        assert not adopting.adopt_sealed(5, written.entry_offsets, written.entry_lengths)  # loaded already
        assert answers(adopting, 5) == answers(scanning, 5)
        adopted, scanned = adopting._ledgers[5].scanned, scanning._ledgers[5].scanned
        assert (adopted.entry_offsets, adopted.entry_lengths, adopted.intact_end, adopted.sealed) == (
            scanned.entry_offsets, scanned.entry_lengths, scanned.intact_end, scanned.sealed)
    finally:
        adopting.shutdown()
        scanning.shutdown()


def wrong_layouts(offsets: array[int], lengths: array[int]) -> Iterator[tuple[array[int], array[int]]]:
    yield offsets[:-1], lengths[:-1]  # an entry short
    yield array("q", [o + 1 for o in offsets]), lengths  # shifted
    yield offsets, array("q", [*lengths[:-1], lengths[-1] + 1])  # the last too long
    yield offsets, lengths[:-1]  # lengths and offsets disagree
    yield array("q"), array("q")  # no entries


def test_a_layout_that_does_not_match_the_file_is_refused_and_the_file_scanned(tmp_path: Path) -> None:
    entries = [b"a" * 10, b"bb", b"c" * 50]
    written = write_sealed_ledger(str(tmp_path), 3, META, iter(entries), created_at_ms=1)
    for offsets, lengths in wrong_layouts(written.entry_offsets, written.entry_lengths):
        store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE)
        try:
            assert not store.adopt_sealed(3, offsets, lengths)
            assert list(store.read(3, 0, 2)) == entries
        finally:
            store.shutdown()
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE)
    try:
        assert not store.adopt_sealed(4, written.entry_offsets, written.entry_lengths)  # no such file
        os.rename(tmp_path / ledger_file_name(3), tmp_path / ledger_file_name(9))
        assert not store.adopt_sealed(9, written.entry_offsets, written.entry_lengths)  # another ledger's file
    finally:
        store.shutdown()


def test_a_damaged_entry_of_an_adopted_ledger_is_never_served(tmp_path: Path) -> None:
    entries = [b"x" * 100, b"y" * 100, b"z" * 100]
    written = write_sealed_ledger(str(tmp_path), 2, META, iter(entries), created_at_ms=1)
    with open(tmp_path / ledger_file_name(2), "r+b") as ledger_file:
        ledger_file.seek(written.entry_offsets[1] + 20)
        ledger_file.write(b"Y")
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE)
    try:
        assert store.adopt_sealed(2, written.entry_offsets, written.entry_lengths)
        assert list(store.read(2, 0, 0)) == entries[:1]
        with pytest.raises(CorruptEntryError):
            store.read(2, 1, 1)
    finally:
        store.shutdown()


class HeldScans:
    """``scan_fd`` held until released: a scan of a very large file, which no small test
    file takes long enough to be."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        real = file_module.scan_fd

        def held(fd: int, path: str) -> object:
            self.started.set()
            self.release.wait(WAIT_S)
            return real(fd, path)
        monkeypatch.setattr(file_module, "scan_fd", held)


def test_loading_a_ledger_holds_up_no_append_or_read_of_another(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    write_sealed_ledger(str(tmp_path), 1, META, iter([b"old"] * 5), created_at_ms=1)
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    try:
        live = store.create()
        store.append(live, b"first").result(WAIT_S)
        scans = HeldScans(monkeypatch)
        loading = threading.Thread(target=store.read, args=(1, 0, 4))
        loading.start()
        assert scans.started.wait(WAIT_S)
        appended = store.append(live, b"second")  # the store's lock is free: this returns
        assert appended.result(WAIT_S) == 1
        assert list(store.read(live, 0, 1)) == [b"first", b"second"]
        assert loading.is_alive()  # still scanning
        scans.release.set()
        loading.join(WAIT_S)
        assert list(store.read(1, 0, 4)) == [b"old"] * 5
    finally:
        scans.release.set()
        store.shutdown()


def test_a_ledger_deleted_while_it_is_scanned_does_not_come_back(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    write_sealed_ledger(str(tmp_path), 1, META, iter([b"old"] * 3), created_at_ms=1)
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    outcome: list[BaseException | object] = []

    def load() -> None:
        try:
            outcome.append(store.last_add_confirmed(1))
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            outcome.append(error)
    try:
        scans = HeldScans(monkeypatch)
        loading = threading.Thread(target=load)
        loading.start()
        assert scans.started.wait(WAIT_S)
        store.delete(1)
        scans.release.set()
        loading.join(WAIT_S)
        assert len(outcome) == 1 and isinstance(outcome[0], LedgerNotFoundError)
        assert 1 not in store._ledgers and store.list() == []
    finally:
        scans.release.set()
        store.shutdown()


def test_a_torn_tail_found_by_an_unlocked_scan_is_still_cut(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.ALWAYS)
    ledger_id = store.create()
    for value in (b"a", b"b"):
        store.append(ledger_id, value).result(WAIT_S)
    store.shutdown()
    path = tmp_path / ledger_file_name(ledger_id)
    intact = path.stat().st_size
    with open(path, "ab") as ledger_file:
        ledger_file.write(b"\x07torn")
    reopened = FileLedgerStore(str(tmp_path), sync=SyncPolicy.ALWAYS)
    try:
        assert reopened.last_add_confirmed(ledger_id) == 1
        assert path.stat().st_size == intact
        assert reopened.append(ledger_id, b"c").result(WAIT_S) == 2
        assert list(reopened.read(ledger_id, 0, 2)) == [b"a", b"b", b"c"]
    finally:
        reopened.shutdown()
