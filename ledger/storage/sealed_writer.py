"""A whole sealed ledger written in one go, outside the store that owns the directory.

A Spark executor rewriting part of a topic into a compacted ledger (``compactor.spark.rewrite``)
has no ``FileLedgerStore`` it may write through: the broker's store owns the ledger
directory. It writes the ledger whole instead, at an id the owner reserved beforehand
(``FileLedgerStore.reserve_ids``), in the same format as the store (``ledger.storage.record``:
MAGIC, META, one ENTRY record per entry, SEAL), so the owner reads it as any sealed ledger:

1. the records go to a temporary file in the ledger directory, named
   ``TEMP_PREFIX`` + ``<ledger file name>.<random>`` (never a ledger file name, so
   ``FileLedgerStore.list`` does not see it);
2. the file is fsynced, then renamed atomically to the ledger's file name, then the
   directory is fsynced.

So the ledger's file either does not exist or is complete and sealed. Writing the same
ledger again (a retried or speculative task) replaces the file with another complete one;
given the same entries, metadata and ``created_at_ms`` its bytes are identical. A writer
that dies leaves only its temporary file, which ``remove_temp_files`` deletes (the owner
calls it at start, before anything can be writing: ``ledger.data_dir.DataDir.collect_orphans``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ledger.errors import LedgerError, LedgerIOError
from ledger.storage.file_io import fsync_dir, write_all
from ledger.storage.record import (
    RECORD_BYTES_MAX,
    RecordKind,
    encode_meta,
    encode_record,
    encode_seal,
)

__all__ = ["TEMP_PREFIX", "SealedLedger", "ledger_file_name", "remove_temp_files", "write_sealed_ledger"]

TEMP_PREFIX = ".writing-"
# Records are gathered into blocks of about this size before each write.
WRITE_BLOCK_BYTES = 1 << 20
_SUFFIX = ".ledger"  # ledger.storage.file's naming


@dataclass(frozen=True, slots=True)
class SealedLedger:
    """What ``write_sealed_ledger`` wrote: the ledger's id, entries and entry bytes, and
    its layout: each entry's record offset and payload length (what the owning store
    would learn by scanning the file: ``FileLedgerStore.adopt_sealed``)."""

    ledger_id: int
    entries: int
    size_bytes: int
    entry_offsets: array[int] = field(default_factory=lambda: array("q"))
    entry_lengths: array[int] = field(default_factory=lambda: array("q"))


def ledger_file_name(ledger_id: int) -> str:
    """The file name of ledger ``ledger_id`` in a ledger directory (``FileLedgerStore``'s)."""
    return f"{ledger_id:020d}{_SUFFIX}"


def write_sealed_ledger(
    root: str, ledger_id: int, metadata: Mapping[str, str], entries: Iterable[bytes], *, created_at_ms: int,
    placed: Callable[[int, int], object] | None = None,
) -> SealedLedger:
    """Write ``entries`` as the sealed ledger ``ledger_id`` in the directory ``root`` (see
    the module docstring). ``placed``, if given, is called with each entry's record offset
    and payload length as the writer takes the entry, before it asks ``entries`` for the
    next one. ``LedgerError`` for an entry over ``RECORD_BYTES_MAX``,
    ``LedgerIOError`` when the disk refuses; either way no ledger file is left changed and
    the temporary file is removed."""
    final = os.path.join(root, ledger_file_name(ledger_id))
    temporary = os.path.join(root, f"{TEMP_PREFIX}{ledger_file_name(ledger_id)}.{secrets.token_hex(6)}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise LedgerIOError(f"ledger {ledger_id}: cannot create {temporary}: {error}", ledger_id=ledger_id) from error
    try:
        try:
            offsets, lengths = _write_records(fd, ledger_id, metadata, entries, created_at_ms, placed)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, final)
        fsync_dir(root)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise LedgerIOError(f"ledger {ledger_id}: cannot write {final}: {error}", ledger_id=ledger_id) from error
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return SealedLedger(ledger_id, len(offsets), sum(lengths), offsets, lengths)


def _write_records(
    fd: int, ledger_id: int, metadata: Mapping[str, str], entries: Iterable[bytes], created_at_ms: int,
    placed: Callable[[int, int], object] | None,
) -> tuple[array[int], array[int]]:
    """MAGIC, META, the ENTRY records and SEAL, written in blocks: each entry's record
    offset and payload length."""
    block = bytearray(encode_meta(ledger_id, created_at_ms, dict(metadata)))
    flushed = 0  # bytes of the file written before ``block``
    offsets, lengths = array("q"), array("q")
    for data in entries:
        if len(data) > RECORD_BYTES_MAX:
            raise LedgerError(f"entry of {len(data)} bytes exceeds {RECORD_BYTES_MAX}", ledger_id=ledger_id)
        offsets.append(flushed + len(block))
        lengths.append(len(data))
        if placed is not None:
            placed(offsets[-1], lengths[-1])
        block += encode_record(RecordKind.ENTRY, data)
        if len(block) >= WRITE_BLOCK_BYTES:
            write_all(fd, block)
            flushed += len(block)
            block.clear()
    block += encode_seal(len(offsets), sum(lengths))
    write_all(fd, block)
    return offsets, lengths


def remove_temp_files(root: str) -> list[str]:
    """Delete the temporary files writers left in the ledger directory ``root`` (their
    names); call it only while no writer can be running."""
    removed = []
    for name in sorted(os.listdir(root)):
        if name.startswith(TEMP_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, name))
                removed.append(name)
    if removed:
        fsync_dir(root)
    return removed
