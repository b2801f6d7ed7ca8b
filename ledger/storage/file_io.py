"""Plain file operations on ledger files, shared by the store and the writers beside it.

``FileLedgerStore`` (``ledger.storage.file``) owns the ledger directory and its locks; the
sealed-ledger writer (``ledger.storage.sealed_writer``) and backups (``ledger.backup``)
write files beside it. What they all do to a file descriptor or a directory, with no lock
and no state, lives here: writing every byte, syncing a directory, creating a ledger file
durably, scanning one through a mapping, and checking entries read in one block.

Every file and directory compactd creates is its owner's only (``FILE_MODE``,
``DIR_MODE``: they hold messages and their keys), whatever the process umask:
``open_private``, ``copy_private`` and ``make_private_dirs`` create them so.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
from collections.abc import Sequence
from typing import BinaryIO

from ledger.errors import CorruptEntryError, CorruptLedgerError, LedgerIOError
from ledger.storage.record import ScanResult, entry_payload, scan

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "copy_private",
    "create_file",
    "fsync_dir",
    "make_private_dirs",
    "open_private",
    "scan_fd",
    "verified_entries",
    "write_all",
]

FILE_MODE = 0o600  # every file compactd creates: read and written by its owner only
DIR_MODE = 0o700  # every directory compactd creates


def open_private(path: str, *, exclusive: bool = False) -> BinaryIO:
    """``path`` opened for writing, created ``FILE_MODE`` if missing (else truncated;
    ``exclusive``: ``FileExistsError`` instead)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    return open(os.open(path, flags, FILE_MODE), "wb")


def copy_private(source: str, target: str) -> None:
    """Copy the file ``source`` to ``target`` (created ``FILE_MODE``)."""
    with open(source, "rb") as reader, open_private(target) as writer:
        shutil.copyfileobj(reader, writer)


def make_private_dirs(path: str, *, exist_ok: bool = False) -> None:
    """``os.makedirs`` whose new directories are ``DIR_MODE``."""
    head = os.path.dirname(os.path.abspath(path))
    if head and not os.path.isdir(head):
        make_private_dirs(head, exist_ok=True)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not exist_ok or not os.path.isdir(path):
            raise


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
