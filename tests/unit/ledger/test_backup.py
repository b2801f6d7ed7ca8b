"""Backups of an open data dir (``ledger.backup``): what they keep, and what they refuse.

The end-to-end test with a running ``compactd serve`` and a real producer is
``tests/integration/api/test_backup_e2e.py``; these tests pin the storage rules: sealed
ledgers linked, open ledgers cut at their confirmed entry, unreferenced ledgers being
written left out, and a damaged backup refused naming the file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.backup import (
    MANIFEST,
    BackupError,
    extract_backup,
    remove_staged,
    restore_backup,
    stage_backup,
    take_backup,
    tar_chunks,
    verify_backup,
)
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage import SyncPolicy

TOPIC = "persistent://public/default/backed-up"


def _open_topic(data_dir: DataDir) -> ManagedLedger:
    return ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, ManagedLedgerConfig(max_entries_per_ledger=4))


def _append(ledger: ManagedLedger, values: range) -> list[Position]:
    return [ledger.append(b"v%d" % value).result(timeout=10) for value in values]


def _all_entries(ledger: ManagedLedger) -> list[bytes]:
    first = ledger.first_position()
    return [entry.data for entry in ledger.read_entries(first, 1000)]


def test_a_backup_of_an_open_data_dir_restores_every_confirmed_entry_and_nothing_written_after(
        tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path / "data"), sync=SyncPolicy.ALWAYS)
    ledger = _open_topic(data_dir)
    _append(ledger, range(10))  # two sealed ledgers of 4, an open one holding 2
    in_progress = data_dir.ledgers.create()  # a compaction run's ledger: unreferenced, open
    data_dir.ledgers.append(in_progress, b"half-written").result(timeout=10)
    summary = take_backup(data_dir, str(tmp_path / "backup"))
    _append(ledger, range(10, 13))  # after the backup: not in it
    assert list(summary.open_ledgers.values()) == [2]
    names = os.listdir(tmp_path / "backup" / "ledgers")
    assert f"{in_progress:020d}.ledger" not in names
    ledger.close()
    data_dir.close()

    restore_backup(str(tmp_path / "backup"), str(tmp_path / "restored"))
    restored = DataDir.open(str(tmp_path / "restored"))
    try:
        assert _all_entries(_open_topic(restored)) == [b"v%d" % value for value in range(10)]
    finally:
        restored.close()


def test_a_backup_is_refused_when_a_file_was_changed(tmp_path: Path) -> None:
    backup = _backed_up(tmp_path)
    ledger_file = next((backup / "ledgers").glob("*.ledger"))
    ledger_file.chmod(0o644)
    data = bytearray(ledger_file.read_bytes())
    data[-3] ^= 0xFF
    ledger_file.unlink()  # a hard link to the live file: replace it, never write through it
    ledger_file.write_bytes(bytes(data))
    with pytest.raises(BackupError, match=f"{ledger_file.name} does not match its SHA-256"):
        restore_backup(str(backup), str(tmp_path / "restored"))
    assert not (tmp_path / "restored").exists()


@pytest.mark.parametrize("damage", ["missing file", "extra file", "no manifest", "truncated", "foreign manifest"])
def test_a_damaged_backup_is_refused_with_a_clear_error(tmp_path: Path, damage: str) -> None:
    backup = _backed_up(tmp_path)
    ledger_file = next((backup / "ledgers").glob("*.ledger"))
    expected = {
        "missing file": f"{ledger_file.name} is missing",
        "extra file": "00000000000000099999.ledger is not in its manifest",
        "no manifest": "not a complete compactd backup",
        "truncated": "metadata.db has 10 bytes, its manifest says",
        "foreign manifest": "is not a compactd backup manifest",
    }[damage]
    if damage == "missing file":
        ledger_file.unlink()
    elif damage == "extra file":
        (backup / "ledgers" / "00000000000000099999.ledger").write_bytes(b"x")
    elif damage == "no manifest":
        (backup / MANIFEST).unlink()
    elif damage == "truncated":
        database = backup / "metadata.db"
        database.write_bytes(database.read_bytes()[:10])
    else:
        (backup / MANIFEST).write_text(json.dumps({"format": "tarball"}))
    with pytest.raises(BackupError, match=expected):
        verify_backup(str(backup))


def test_a_backup_never_goes_into_a_non_empty_directory_nor_restores_over_a_data_dir(tmp_path: Path) -> None:
    backup = _backed_up(tmp_path)
    data_dir = DataDir.open(str(tmp_path / "data"))
    try:
        with pytest.raises(BackupError, match="exists and is not empty"):
            take_backup(data_dir, str(backup))
        with pytest.raises(BackupError, match="inside the data dir"):
            take_backup(data_dir, str(tmp_path / "data" / "backup"))
    finally:
        data_dir.close()
    with pytest.raises(BackupError, match="exists and is not empty: restore into a new one"):
        restore_backup(str(backup), str(tmp_path / "data"))


def _backed_up(tmp_path: Path) -> Path:
    data_dir = DataDir.open(str(tmp_path / "data"))
    try:
        ledger = _open_topic(data_dir)
        _append(ledger, range(6))
        take_backup(data_dir, str(tmp_path / "backup"))
        ledger.close()
    finally:
        data_dir.close()
    return tmp_path / "backup"


def test_a_staged_backup_streams_as_a_tar_that_extracts_to_the_same_verified_files(tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path / "data"))
    try:
        ledger = _open_topic(data_dir)
        _append(ledger, range(9))
        staged = stage_backup(data_dir)
        assert staged.startswith(str(tmp_path / "data" / "backup-staging"))
        chunks = list(tar_chunks(staged))
        manifest = extract_backup(iter(chunks), str(tmp_path / "copy"))
        assert [entry["path"] for entry in manifest["files"]] == [
            entry["path"] for entry in verify_backup(staged)["files"]]
        remove_staged(staged)
        assert not os.path.exists(staged)
        ledger.close()
    finally:
        data_dir.close()
    cut = b"".join(chunks)[: len(b"".join(chunks)) // 2]
    with pytest.raises(BackupError, match="is damaged or cut short: unexpected end of data"):
        extract_backup(iter([cut]), str(tmp_path / "cut"))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.integers(0, 30), after=st.integers(0, 10), per_ledger=st.integers(1, 8),
       topics=st.integers(1, 3), restart=st.booleans())
def test_a_restored_backup_holds_exactly_the_entries_confirmed_when_it_was_taken(
        tmp_path: Path, before: int, after: int, per_ledger: int, topics: int, restart: bool) -> None:
    """Whatever the roll-overs, the number of topics, and whether the data dir was reopened
    (leaving ledgers open in the metadata that the store has not loaded): a restored
    backup reads back exactly what was confirmed before it, in order, nothing after."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        root = Path(scratch)
        config = ManagedLedgerConfig(max_entries_per_ledger=per_ledger)
        names = [f"persistent://public/default/t{index}" for index in range(topics)]
        data_dir = DataDir.open(str(root / "data"), sync=SyncPolicy.NONE)
        ledgers = [ManagedLedger.open(name, data_dir.ledgers, data_dir.metadata, config) for name in names]
        for number in range(before):
            ledgers[number % topics].append(b"b%d" % number).result(timeout=10)
        if restart:  # the current ledgers stay open in the metadata; reopened, nothing is loaded
            data_dir.close()
            data_dir = DataDir.open(str(root / "data"), sync=SyncPolicy.NONE)
        take_backup(data_dir, str(root / "backup"))
        if not restart:
            for number in range(after):
                ledgers[number % topics].append(b"a%d" % number).result(timeout=10)
        data_dir.close()
        restore_backup(str(root / "backup"), str(root / "restored"))
        restored = DataDir.open(str(root / "restored"))
        try:
            for index, name in enumerate(names):
                ledger = ManagedLedger.open(name, restored.ledgers, restored.metadata, config)
                read = [entry.data for entry in ledger.read_entries(ledger.first_position(), 1000)] \
                    if ledger.number_of_entries else []
                assert read == [b"b%d" % number for number in range(before) if number % topics == index]
        finally:
            restored.close()
