"""Plain file operations on ledger files, shared by the store and the writers beside it.

``FileLedgerStore`` (``ledger.storage.file``) owns the ledger directory and its locks; the
sealed-ledger writer (``ledger.storage.sealed_writer``) and backups (``ledger.backup``)
write files beside it. What they all do to a file descriptor or a directory, with no lock
and no state, lives here: writing every byte, syncing a directory, creating a ledger file
durably, scanning one through a mapping, and checking entries read in one block.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence

from ledger.errors import CorruptEntryError, CorruptLedgerError, LedgerIOError
from ledger.storage.record import ScanResult, entry_payload, scan

__all__ = ["create_file", "fsync_dir", "scan_fd", "verified_entries", "write_all"]


def verified_entries(
    ledger_id: int, first_entry_id: int, block: bytes, start: int,
    offsets: Sequence[int], lengths: Sequence[int],
) -> list[bytes]:
    """The payloads of the records in ``block`` (read from file offset ``start``), each
    checked against its CRC32C; ``CorruptEntryError`` names the first that fails."""
    view = memoryview(block)
    entries = []
    for entry_id, (offset, length) in enumerate(zip(offsets, lengths, strict=True), first_entry_id):
        payload = entry_payload(view, offset - start, length)
        if payload is None:
            raise CorruptEntryError(
                f"ledger {ledger_id}: entry {entry_id} fails its CRC32C check; it is not served",
                ledger_id=ledger_id, entry_id=entry_id,
            )
        entries.append(bytes(payload))
    return entries


def scan_fd(fd: int, path: str) -> ScanResult:
    """Scan the ledger file open as ``fd`` (``ledger.storage.record.scan``) through a
    read-only mapping whose pages are released behind the scan."""
    size = os.fstat(fd).st_size
    if size == 0:
        return ScanResult()
    failure: CorruptLedgerError | None = None
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)

        def done_with(offset: int) -> None:
            """Drop the scanned pages from this process (they stay in the page cache)."""
            mapped.madvise(mmap.MADV_DONTNEED, 0, offset - offset % mmap.PAGESIZE)

        try:
            return scan(view, path, done_with=done_with)
        except CorruptLedgerError as error:  # its traceback's frames hold views of the mapping
            failure = error.with_traceback(None)
        finally:
            view.release()
    assert failure is not None
    raise failure


def create_file(path: str, header: bytes, ledger_id: int) -> int:
    """Create the ledger file holding ``header``, durably (file and directory); its fd.
    ``LedgerIOError`` (and no file left behind) when the disk refuses."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise LedgerIOError(f"ledger {ledger_id}: cannot create {path}: {error}", ledger_id=ledger_id) from error
    try:
        write_all(fd, header)
        os.fsync(fd)
        fsync_dir(os.path.dirname(path))
    except OSError as error:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise LedgerIOError(f"ledger {ledger_id}: cannot create {path}: {error}", ledger_id=ledger_id) from error
    return fd


def write_all(fd: int, data: bytes | bytearray, offset: int | None = None) -> None:
    """Write every byte of ``data`` (at ``offset`` when given), retrying short writes."""
    view = memoryview(data)
    position = offset
    while view:
        written = os.write(fd, view) if position is None else os.pwrite(fd, view, position)
        view = view[written:]
        if position is not None:
            position += written


def fsync_dir(path: str) -> None:
    """Make the directory ``path``'s entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
