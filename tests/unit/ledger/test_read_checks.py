"""Every read re-checks each record's CRC32C: a damaged entry is an error, never data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledger.errors import CorruptEntryError, CorruptLedgerError
from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage.record import HEADER, scan

ENTRIES = [b"entry %d: " % i + bytes([65 + i]) * (20 + i) for i in range(6)]
DAMAGED = 3
# Byte positions inside a record, from its start: the CRC field, the kind byte, the
# first and the last payload byte (the length field is covered separately below).
CRC_BYTE, KIND_BYTE, FIRST_PAYLOAD_BYTE = 5, 8, HEADER.size


def _ledger_file(root: Path, ledger_id: int) -> Path:
    return root / f"{ledger_id:020d}.ledger"


def _sealed_ledger(root: Path) -> tuple[FileLedgerStore, int]:
    store = FileLedgerStore(str(root), sync=SyncPolicy.GROUP)
    ledger_id = store.create()
    for future in [store.append(ledger_id, data) for data in ENTRIES]:
        future.result(timeout=10)
    store.close(ledger_id)
    return store, ledger_id


def _flip(path: Path, entry_id: int, byte_in_record: int) -> None:
    """Flip one byte of entry ``entry_id``'s record in place (a stray write, bit rot)."""
    offset = scan(path.read_bytes()).entry_offsets[entry_id] + byte_in_record
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 0x5A]), offset)
    finally:
        os.close(fd)


def _assert_only_the_damaged_entry_fails(store: FileLedgerStore, ledger_id: int) -> None:
    with pytest.raises(CorruptEntryError) as raised:
        store.read(ledger_id, DAMAGED, DAMAGED)
    assert (raised.value.ledger_id, raised.value.entry_id) == (ledger_id, DAMAGED)
    assert f"entry {DAMAGED}" in str(raised.value)
    with pytest.raises(CorruptEntryError):
        store.read(ledger_id, 0, len(ENTRIES) - 1)  # a range over it fails as a whole
    assert list(store.read(ledger_id, 0, DAMAGED - 1)) == ENTRIES[:DAMAGED]
    assert list(store.read(ledger_id, DAMAGED + 1, len(ENTRIES) - 1)) == ENTRIES[DAMAGED + 1 :]


@pytest.mark.parametrize(
    "byte_in_record",
    [0, CRC_BYTE, KIND_BYTE, FIRST_PAYLOAD_BYTE, HEADER.size + len(ENTRIES[DAMAGED]) - 1],
    ids=["length", "crc", "kind", "first-payload-byte", "last-payload-byte"],
)
def test_a_damaged_entry_of_an_already_scanned_sealed_ledger_is_never_served(
    tmp_path: Path, byte_in_record: int
) -> None:
    store, ledger_id = _sealed_ledger(tmp_path)
    assert list(store.read(ledger_id, 0, len(ENTRIES) - 1)) == ENTRIES  # loaded and scanned
    _flip(_ledger_file(tmp_path, ledger_id), DAMAGED, byte_in_record)
    _assert_only_the_damaged_entry_fails(store, ledger_id)
    store.shutdown()


@pytest.mark.parametrize("read_only", [False, True], ids=["owner", "read-only-view"])
@pytest.mark.parametrize(
    "byte_in_record",
    [CRC_BYTE, KIND_BYTE, FIRST_PAYLOAD_BYTE, HEADER.size + len(ENTRIES[DAMAGED]) - 1],
    ids=["crc", "kind", "first-payload-byte", "last-payload-byte"],
)
def test_a_damaged_entry_of_a_reopened_sealed_ledger_is_never_served_nor_truncated(
    tmp_path: Path, byte_in_record: int, read_only: bool
) -> None:
    store, ledger_id = _sealed_ledger(tmp_path)
    store.shutdown()
    path = _ledger_file(tmp_path, ledger_id)
    _flip(path, DAMAGED, byte_in_record)
    damaged = path.read_bytes()
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP, read_only=read_only)
    info = store.info(ledger_id)
    assert info.sealed and info.entries == len(ENTRIES)  # damage inside a sealed file is no torn tail
    assert info.size_bytes == sum(map(len, ENTRIES))
    _assert_only_the_damaged_entry_fails(store, ledger_id)
    store.shutdown()
    assert path.read_bytes() == damaged  # nothing after the damage was cut off


def test_a_damaged_length_field_in_a_sealed_ledger_is_a_clear_error_at_load(tmp_path: Path) -> None:
    store, ledger_id = _sealed_ledger(tmp_path)
    store.shutdown()
    path = _ledger_file(tmp_path, ledger_id)
    _flip(path, DAMAGED, 1)  # the length's second byte: the next record cannot be located
    damaged = path.read_bytes()
    store = FileLedgerStore(str(tmp_path), sync=SyncPolicy.GROUP)
    with pytest.raises(CorruptLedgerError, match="sealed ledger damaged"):
        store.read(ledger_id, 0, 0)
    store.shutdown()
    assert path.read_bytes() == damaged
