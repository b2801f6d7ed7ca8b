"""A sealed ledger file read directly, by the record offsets a caller already knows.

``FileLedgerStore`` loads a ledger by scanning every record of its file (a CRC32C each)
to learn where its entries are: a few microseconds per entry in Python, the main cost of
reading a topic of small messages once. A sealed file never changes, so a reader that
kept the entries' offsets (``compactor.local.key_index`` records them) needs no scan:

* ``SealedFile.open`` checks the file's MAGIC and its trailing SEAL record (the file is
  sealed; the SEAL gives the entry count and size), nothing else;
* ``walk`` finds the offsets once, by the records' length fields alone (no CRC): a walk
  that does not land exactly on the SEAL, or whose counts differ from it, raises
  ``CorruptLedgerError`` (the caller falls back to the store's scan);
* ``read`` returns entries (any of them, ascending) by their offsets and lengths, each checked against its CRC32C
  as ``FileLedgerStore.read`` checks it (``ledger.storage.record.entry_payload``): a
  record that does not match raises ``CorruptEntryError`` and is never served.

The bytes come from a ``ByteSource`` (``ledger.storage.byte_source``): a local file
(``open``: ``os.pread``) or a ledger's object in a bucket read through the block cache
(``over``; ``LedgerFiles.open_sealed`` picks). They are only read, so any process may do
this while the store that owns the directory goes on with other ledgers.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence

from ledger.errors import CorruptEntryError, CorruptLedgerError
from ledger.storage.byte_source import ByteSource, FdSource
from ledger.storage.record import HEADER, MAGIC, RecordKind, entry_payload, seal_counts

__all__ = ["SealedFile"]

# Bytes read at a time while walking the records' headers.
_WALK_BLOCK_BYTES = 4 * 1024 * 1024
# Entries closer together than this are read with one pread.
_READ_SPAN_BYTES = 4 * 1024 * 1024


class SealedFile:
    """One sealed ledger, open for reading (see the module docstring)."""

    def __init__(self, source: ByteSource, ledger_id: int, entries: int, size_bytes: int, seal_offset: int) -> None:
        self.source = source
        self.path = source.name
        self.ledger_id = ledger_id
        self.entries = entries
        self.size_bytes = size_bytes
        self._seal_offset = seal_offset

    @classmethod
    def open(cls, path: str, ledger_id: int) -> SealedFile | None:
        """The sealed local file at ``path``; None when it is not sealed (or not there)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            source = FdSource(fd, path)
        except OSError:
            os.close(fd)
            raise
        return cls.over(source, ledger_id)

    @classmethod
    def over(cls, source: ByteSource, ledger_id: int) -> SealedFile | None:
        """The sealed ledger whose bytes ``source`` holds (the result owns it); None, with
        ``source`` closed, when they do not start with MAGIC and end with a SEAL record."""
        try:
            head = source.pread(0, len(MAGIC))
            counts = seal_counts(source.pread(max(0, source.size - 64), 64))
        except BaseException:
            source.close()
            raise
        if head != MAGIC or counts is None:
            source.close()
            return None
        entries, size_bytes, seal_bytes = counts
        return cls(source, ledger_id, entries, size_bytes, source.size - seal_bytes)

    def walk(self) -> tuple[array[int], array[int]]:
        """Every entry's record offset and payload length, by the length fields alone."""
        offsets, lengths = array("q"), array("q")
        offset = len(MAGIC)
        block, block_start = b"", offset
        kind_entry = int(RecordKind.ENTRY)
        while offset < self._seal_offset:
            if offset + HEADER.size > block_start + len(block):
                block_start = offset
                block = self.source.pread(offset, _WALK_BLOCK_BYTES)
                if len(block) < HEADER.size:
                    break
            length, _, kind = HEADER.unpack_from(block, offset - block_start)
            if kind == kind_entry:
                offsets.append(offset)
                lengths.append(length)
            elif kind != RecordKind.META or offsets:
                break
            offset += HEADER.size + length
        if offset != self._seal_offset or len(offsets) != self.entries or sum(lengths) != self.size_bytes:
            raise CorruptLedgerError(f"{self.path}: its records do not add up to its SEAL record",
                                     ledger_id=self.ledger_id)
        return offsets, lengths

    def read(self, entry_ids: Sequence[int], offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """The entries ``entry_ids`` (ascending) at ``offsets``, of ``lengths``, each
        checked against its CRC32C; entries close together are read in one piece."""
        entries: list[bytes] = []
        start = 0
        while start < len(entry_ids):
            end = start + 1
            while end < len(entry_ids) and offsets[end] + lengths[end] - offsets[start] < _READ_SPAN_BYTES:
                end += 1
            entries.extend(self._span(entry_ids[start:end], offsets[start:end], lengths[start:end]))
            start = end
        return entries

    def _span(self, entry_ids: Sequence[int], offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Entries read with one ``pread`` from the first's record to the last's end."""
        first = offsets[0]
        block = self.source.pread(first, offsets[-1] + HEADER.size + lengths[-1] - first)
        view = memoryview(block)
        entries = []
        for entry_id, offset, length in zip(entry_ids, offsets, lengths, strict=True):
            payload = entry_payload(view, offset - first, length)
            if payload is None:
                self.source.discard_cached()  # a bucket object's blocks: fetched afresh next time
                raise CorruptEntryError(
                    f"ledger {self.ledger_id}: entry {entry_id} fails its CRC32C check; it is not served",
                    ledger_id=self.ledger_id, entry_id=entry_id)
            entries.append(bytes(payload))
        return entries

    def close(self) -> None:
        self.source.close()
