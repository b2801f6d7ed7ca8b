"""The on-disk format of one ledger file, and the scan that recovers it.

A ledger file is append-only::

    file   := MAGIC record*
    MAGIC  := b"CDLEDGR1"                          (8 bytes)
    record := length:u32le crc:u32le kind:u8 payload[length]
    crc    := crc32c(kind:u8 · length:u32le · payload)

Kinds, in the order they appear:

* ``META`` (1), exactly once, first: UTF-8 JSON ``{"ledger_id", "created_at_ms",
  "metadata"}``; the ledger's custom metadata, never rewritten.
* ``ENTRY`` (2), zero or more: the entry bytes, verbatim. Entry ids are their order, from 0.
* ``SEAL`` (3), at most once, last: ``entries:u64le size_bytes:u64le``. A file with a SEAL
  record is a sealed ledger: immutable, and safe to read from any process.

Every read checks again (``entry_payload``): an ENTRY record whose header or CRC no longer
matches what the scan recorded is corrupt, and is never served.

Recovery (``scan``): records are read from the start; the first record that is cut short,
whose length exceeds ``RECORD_BYTES_MAX`` or whose CRC does not match ends the intact
prefix. Everything after it is a torn or corrupt tail: a writer truncates it, a reader
ignores it, and neither ever serves it. Bytes after a SEAL record are a tail too.

A file that *ends* with an intact SEAL record was sealed after everything before it was
synced, so no torn write can lie inside it: a record there that fails its check is damage
(bit rot, a stray write). The scan steps over it by its length field, the SEAL's counts
confirm the result, and the entry is listed in ``damaged_entries``; nothing is truncated.
"""

from __future__ import annotations

import enum
import functools
import json
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from ledger.errors import CorruptLedgerError

__all__ = [
    "HEADER",
    "MAGIC",
    "RECORD_BYTES_MAX",
    "RecordKind",
    "ScanResult",
    "encode_meta",
    "encode_record",
    "encode_seal",
    "entry_payload",
    "scan",
    "seal_counts",
]

MAGIC = b"CDLEDGR1"
HEADER = struct.Struct("<IIB")  # length, crc, kind
_CRC_PREFIX = struct.Struct("<BI")  # kind, length: what the crc covers before the payload
_SEAL = struct.Struct("<QQ")
_SEAL_RECORD_BYTES = HEADER.size + _SEAL.size
# Pulsar's default maxMessageSize is 5 MiB; a length above this bound can only be a corrupt
# header, and refusing it keeps a damaged length field from making the scan allocate gigabytes.
RECORD_BYTES_MAX = 64 * 1024 * 1024
# How often ``scan`` tells its caller which bytes it is done with: a mapped file's pages are
# released behind the scan, so scanning a ledger of any size adds at most this much to RSS.
SCAN_RELEASE_BYTES = 8 * 1024 * 1024


class RecordKind(enum.IntEnum):
    """What a record holds; see the module docstring."""

    META = 1
    ENTRY = 2
    SEAL = 3


def encode_record(kind: RecordKind, payload: bytes) -> bytes:
    """Frame ``payload`` as one record: header (length, crc, kind) then the payload."""
    crc = crc32c.crc32c(payload, crc32c.crc32c(_CRC_PREFIX.pack(kind, len(payload))))
    return HEADER.pack(len(payload), crc, kind) + payload


def encode_meta(ledger_id: int, created_at_ms: int, metadata: dict[str, str]) -> bytes:
    """The file's first bytes: MAGIC and the META record."""
    body = {"ledger_id": ledger_id, "created_at_ms": created_at_ms, "metadata": metadata}
    return MAGIC + encode_record(RecordKind.META, json.dumps(body, sort_keys=True).encode())


def encode_seal(entries: int, size_bytes: int) -> bytes:
    """The SEAL record closing a ledger of ``entries`` entries and ``size_bytes`` bytes."""
    return encode_record(RecordKind.SEAL, _SEAL.pack(entries, size_bytes))


def entry_payload(view: memoryview, offset: int, length: int) -> memoryview | None:
    """The payload of the ENTRY record of ``length`` bytes at ``offset`` in ``view``, or
    None when its header or CRC does not match (the bytes changed after they were written).

    The CRC is computed over ``view`` in place; nothing is copied.
    """
    start = offset + HEADER.size
    payload = view[start : start + length]
    crc = crc32c.crc32c(payload, _entry_prefix_crc(length))
    if len(payload) != length or HEADER.unpack_from(view, offset) != (length, crc, RecordKind.ENTRY):
        return None
    return payload


@functools.lru_cache(maxsize=4096)
def _entry_prefix_crc(length: int) -> int:
    """CRC32C of an ENTRY record's ``kind · length`` (entries of a topic share few lengths)."""
    return int(crc32c.crc32c(_CRC_PREFIX.pack(RecordKind.ENTRY, length)))


@dataclass
class ScanResult:
    """What ``scan`` recovered from a file.

    Attributes:
        ledger_id, created_at_ms, metadata: from the META record (``ledger_id`` is -1 and
            ``valid`` is False when the file has no intact META record).
        entry_offsets: file offset of each ENTRY record's header, by entry id.
        entry_lengths: payload length of each ENTRY record, by entry id.
        size_bytes: sum of the entry lengths.
        sealed: a SEAL record ends the intact prefix.
        intact_end: offset just after the last intact record (where a writer appends).
        file_size: size of the file as scanned; ``> intact_end`` means a tail was found.
        damaged_entries: ids of entries of a sealed file whose record fails its check
            (reads of them raise ``CorruptEntryError``).
    """

    ledger_id: int = -1
    created_at_ms: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    entry_offsets: array[int] = field(default_factory=lambda: array("q"))
    entry_lengths: array[int] = field(default_factory=lambda: array("q"))
    size_bytes: int = 0
    sealed: bool = False
    intact_end: int = 0
    file_size: int = 0
    damaged_entries: list[int] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """The file starts with MAGIC and an intact META record."""
        return self.ledger_id >= 0

    @property
    def has_tail(self) -> bool:
        """Bytes past the intact prefix exist (torn write, corruption, or junk after SEAL)."""
        return self.file_size > self.intact_end


def scan(data: bytes | memoryview, path: str = "?", *, done_with: Callable[[int], object] | None = None) -> ScanResult:
    """Recover the intact prefix of a ledger file's bytes ``data``; never raises on a tail.

    Raises ``CorruptLedgerError`` only when the intact prefix contradicts itself (a SEAL
    record whose counts differ from the entries before it), which no torn write can cause.
    ``done_with(offset)`` is told, every ``SCAN_RELEASE_BYTES`` or so, that the bytes
    before ``offset`` will not be looked at again (a mapped file's caller releases them).
    """
    view = memoryview(data)
    result = ScanResult(file_size=len(view))
    if bytes(view[: len(MAGIC)]) != MAGIC:
        return result
    offset = len(MAGIC)
    first = _read_record(view, offset)
    if first is None or first[0] is not RecordKind.META:
        return result
    _apply_meta(result, first[1], path)
    offset = first[2]
    result.intact_end = offset
    seal_offset = _trailing_seal_offset(view)
    released = offset
    while True:
        record = _read_record(view, offset)
        if record is None:
            if seal_offset is None or offset >= seal_offset:
                break  # a torn or corrupt tail
            record = _damaged_entry(view, offset, seal_offset, path)
            result.damaged_entries.append(len(result.entry_offsets))
        kind, payload, end = record
        if kind is RecordKind.ENTRY:
            result.entry_offsets.append(offset)
            result.entry_lengths.append(len(payload))
            result.size_bytes += len(payload)
        elif kind is RecordKind.SEAL:
            _check_seal(result, payload, path)
            result.sealed = True
            result.intact_end = end
            break
        else:  # a second META record cannot come from our writer: treat as the tail
            break
        offset = end
        result.intact_end = offset
        if done_with is not None and offset - released >= SCAN_RELEASE_BYTES:
            done_with(offset)
            released = offset
    return result


def sealed_layout(
    head: bytes, tail: bytes, file_size: int, entry_offsets: array[int], entry_lengths: array[int], path: str = "?",
) -> ScanResult | None:
    """What ``scan`` would recover from a sealed file, from the layout its writer recorded
    (``entry_offsets``, ``entry_lengths``) and the file's first bytes ``head`` (MAGIC and
    the whole META record) and last bytes ``tail`` (the SEAL record), walking no record;
    None when they do not add up: META unreadable, no SEAL, or the layout's count, bytes,
    first offset or end differ from them. Each entry is still checked against its CRC32C
    when read (``entry_payload``)."""
    if head[: len(MAGIC)] != MAGIC or len(entry_offsets) != len(entry_lengths):
        return None
    meta = _read_record(memoryview(head), len(MAGIC))
    counts = seal_counts(tail)
    if meta is None or meta[0] is not RecordKind.META or counts is None:
        return None
    result = ScanResult(file_size=file_size, entry_offsets=entry_offsets, entry_lengths=entry_lengths,
                        sealed=True, intact_end=file_size)
    try:
        _apply_meta(result, meta[1], path)
    except CorruptLedgerError:
        return None
    entries, size_bytes, seal_bytes = counts
    result.size_bytes = sum(entry_lengths)
    if entries != len(entry_offsets) or size_bytes != result.size_bytes:
        return None
    first, end = (entry_offsets[0], entry_offsets[-1] + HEADER.size + entry_lengths[-1]) if entries else (meta[2],) * 2
    if first != meta[2] or end != file_size - seal_bytes:
        return None
    return result


def seal_counts(tail: bytes) -> tuple[int, int, int] | None:
    """When ``tail`` (the last bytes of a file, at least a SEAL record's) ends with an
    intact SEAL record: its ``(entries, size_bytes, record bytes)``; else None."""
    if len(tail) < _SEAL_RECORD_BYTES:
        return None
    view = memoryview(tail)
    record = _read_record(view, len(view) - _SEAL_RECORD_BYTES)
    if record is None or record[0] is not RecordKind.SEAL or record[2] != len(view):
        return None
    entries, size_bytes = _SEAL.unpack(record[1])
    return entries, size_bytes, _SEAL_RECORD_BYTES


def _trailing_seal_offset(view: memoryview) -> int | None:
    """Where the SEAL record starts when the file ends with an intact one, else None."""
    offset = len(view) - _SEAL_RECORD_BYTES
    if offset < len(MAGIC):
        return None
    record = _read_record(view, offset)
    if record is None or record[0] is not RecordKind.SEAL or record[2] != len(view):
        return None
    return offset


def _damaged_entry(
    view: memoryview, offset: int, seal_offset: int, path: str
) -> tuple[RecordKind, memoryview, int]:
    """A record before the SEAL of a sealed file fails its check: no torn write reaches
    there, so it is a damaged entry. Its length field locates the next record (the SEAL's
    counts verify the result); the read of that entry fails its CRC, the others still work.
    ``CorruptLedgerError`` when the length field cannot be right."""
    length = HEADER.unpack_from(view, offset)[0]
    end = offset + HEADER.size + length
    if length > RECORD_BYTES_MAX or end > seal_offset:
        raise CorruptLedgerError(
            f"{path}: sealed ledger damaged at offset {offset}; the records after it cannot be found"
        )
    return RecordKind.ENTRY, view[offset + HEADER.size : end], end


def _read_record(view: memoryview, offset: int) -> tuple[RecordKind, memoryview, int] | None:
    """The intact record at ``offset`` as (kind, payload, end offset), or None."""
    if offset + HEADER.size > len(view):
        return None
    length, crc, kind_byte = HEADER.unpack_from(view, offset)
    end = offset + HEADER.size + length
    if length > RECORD_BYTES_MAX or end > len(view):
        return None
    payload = view[offset + HEADER.size : end]
    if crc32c.crc32c(payload, crc32c.crc32c(_CRC_PREFIX.pack(kind_byte, length))) != crc:
        return None
    try:
        kind = RecordKind(kind_byte)
    except ValueError:
        return None
    return kind, payload, end


def _apply_meta(result: ScanResult, payload: memoryview, path: str) -> None:
    try:
        body = json.loads(bytes(payload))
        result.ledger_id = int(body["ledger_id"])
        result.created_at_ms = int(body["created_at_ms"])
        result.metadata = {str(k): str(v) for k, v in body["metadata"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptLedgerError(f"{path}: META record is not valid JSON: {error}") from None


def _check_seal(result: ScanResult, payload: memoryview, path: str) -> None:
    if len(payload) != _SEAL.size:
        raise CorruptLedgerError(f"{path}: SEAL record of {len(payload)} bytes")
    entries, size_bytes = _SEAL.unpack(payload)
    if entries != len(result.entry_offsets) or size_bytes != result.size_bytes:
        raise CorruptLedgerError(
            f"{path}: sealed with {entries} entries / {size_bytes} bytes but holds "
            f"{len(result.entry_offsets)} / {result.size_bytes}",
            ledger_id=result.ledger_id,
        )
