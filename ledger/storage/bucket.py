"""Sealed ledgers and their sidecars as objects in a bucket (``BucketConfig``).

Layout, under the bucket's ``base`` (``ledger.storage.object_fs``):

* ``ledgers/<ledger_id:020d>``: a sealed ledger file, byte for byte (MAGIC, META, the
  ENTRY records, SEAL: ``ledger.storage.record``), so every check a local file gets, the
  object gets too;
* ``ledgers/<ledger_id:020d><suffix>``: its sidecars (``ledger.storage.sidecars``: the key
  index ``.kidx``), same bytes as the local ones.

Names are deterministic per ledger id: ids are never reused in a data dir (``prefix``
separates clusters sharing a bucket). An upload is atomic: an S3 PUT or completed
multipart upload shows a whole object or none; the ``filesystem`` driver writes a
temporary name (``TEMP_MARK``), syncs it and renames it. A copy is trusted only after
``verify`` read it back and found the local file's size and CRC32C; until the metadata
records it (``ledger.offload``) nobody reads it in place of the local file, and an object
nobody references is collected after a grace period.

``LedgerBucket`` turns every ``pyarrow`` I/O failure into ``LedgerIOError`` (retriable: a
network error, a 5xx, a timeout) and an object that is not there into ``None`` (reads) or
a no-op (deletes).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import crc32c

from ledger.errors import (
    CorruptLedgerError,
    LedgerError,
    LedgerIOError,
    LedgerNotFoundError,
    ObjectMismatchError,
)
from ledger.storage.byte_source import BlockCache, ObjectSource, SourceReader

if TYPE_CHECKING:  # pyarrow loads only with a bucket: a broker without one never imports it
    import pyarrow as pa
    import pyarrow.fs as pafs
from ledger.storage.file_io import fsync_dir
from ledger.storage.object_fs import BucketConfig
from ledger.storage.record import ScanResult, sealed_layout
from ledger.storage.sealed_file import SealedFile
from ledger.storage.sidecars import SIDECAR_SUFFIXES

__all__ = ["LEDGERS_DIR", "TEMP_MARK", "BucketObject", "LedgerBucket", "ledger_object_name", "parse_object_name"]

LEDGERS_DIR = "ledgers"
TEMP_MARK = ".uploading-"
"""In the name of a ``filesystem``-driver object being written (never a ledger's name)."""
_COPY_BLOCK_BYTES = 8 * 1024 * 1024
HEAD_BYTES = 64 * 1024
"""What is read of a ledger's first bytes to check MAGIC and its META record."""
TAIL_BYTES = 64
"""What is read of its last bytes to find the SEAL record."""
_T = TypeVar("_T")


def ledger_object_name(ledger_id: int, suffix: str = "") -> str:
    """The name, relative to the bucket's base, of ledger ``ledger_id`` (or a sidecar)."""
    return f"{LEDGERS_DIR}/{ledger_id:020d}{suffix}"


def parse_object_name(name: str) -> int | None:
    """The ledger id an object under ``ledgers/`` belongs to (a ledger, a sidecar, an
    abandoned temporary copy of either); None for a name compactd never writes."""
    base = name.rsplit("/", 1)[-1]
    digits = base[:20]
    if len(digits) == 20 and digits.isdigit():
        rest = base[20:]
        if rest == "" or rest in SIDECAR_SUFFIXES or rest.startswith(TEMP_MARK) or any(
                rest.startswith(suffix + TEMP_MARK) for suffix in SIDECAR_SUFFIXES):
            return int(digits)
    return None


@dataclass(frozen=True, slots=True)
class BucketObject:
    """One object under ``ledgers/``: its name (relative to base), size and mtime."""

    name: str
    ledger_id: int
    size: int
    modified_ms: int


class LedgerBucket:
    """Ledger objects in the bucket ``config``, read through ``cache``."""

    def __init__(self, config: BucketConfig, cache: BlockCache) -> None:
        self.config = config
        self.cache = cache
        self._fs: pafs.FileSystem | None = None

    @property
    def fs(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs = _io(f"cannot open {self.config.to_url()}", self.config.open)
        return self._fs

    def path(self, name: str) -> str:
        """``name``'s path on ``fs``."""
        return f"{self.config.base}/{name}"

    def url(self, name: str) -> str:
        """``name`` as a URL, for messages (no credentials)."""
        return f"{self.config.to_url()}/{name}"

    # -- reading ------------------------------------------------------------------------

    def size(self, name: str) -> int | None:
        """The size of object ``name``; None when there is none."""
        import pyarrow.fs as pafs

        info = _io(f"cannot stat {self.url(name)}", lambda: self.fs.get_file_info(self.path(name)))
        return None if info.type == pafs.FileType.NotFound else info.size

    def open(self, name: str) -> ObjectSource | None:
        """Object ``name`` for ranged reads through the cache; None when there is none."""
        def open_file() -> pa.NativeFile | None:
            try:
                return self.fs.open_input_file(self.path(name))
            except FileNotFoundError:
                return None

        file = _io(f"cannot open {self.url(name)}", open_file)
        return None if file is None else ObjectSource(file, self.url(name), file.size(), self.cache)

    def open_native(self, name: str) -> pa.NativeFile | None:
        """Object ``name`` as a random-access file ``pyarrow.parquet`` reads (through the
        cache); None when there is none."""
        import pyarrow as pa

        source = self.open(name)
        return None if source is None else pa.PythonFile(SourceReader(source), mode="r")

    def objects(self) -> list[BucketObject]:
        """Every object under ``ledgers/`` that belongs to a ledger id (by name), by name."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path(LEDGERS_DIR), allow_not_found=True)
        infos = _io(f"cannot list {self.url(LEDGERS_DIR)}", lambda: self.fs.get_file_info(selector))
        found = []
        for info in infos:
            ledger_id = parse_object_name(info.base_name)
            if info.type == pafs.FileType.File and ledger_id is not None:
                modified = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
                found.append(BucketObject(f"{LEDGERS_DIR}/{info.base_name}", ledger_id, info.size or 0, modified))
        return sorted(found, key=lambda found_object: found_object.name)

    # -- writing ------------------------------------------------------------------------

    def upload(self, local_path: str, name: str) -> None:
        """Copy the local file ``local_path`` to object ``name`` (atomic: see the module
        docstring). Raises ``LedgerIOError``; what a failed upload left is not ``name``
        (or is a copy ``verify`` refuses)."""
        self.cache.discard(self.url(name))
        if self.config.driver == "filesystem":
            self._upload_to_directory(local_path, name)
            return

        def put() -> None:
            self.fs.create_dir(self.path(LEDGERS_DIR), recursive=True)
            with open(local_path, "rb") as reader, self.fs.open_output_stream(self.path(name)) as writer:
                for block in iter(lambda: reader.read(_COPY_BLOCK_BYTES), b""):
                    writer.write(block)

        _io(f"cannot upload {local_path} to {self.url(name)}", put)

    def _upload_to_directory(self, local_path: str, name: str) -> None:
        """The ``filesystem`` driver: a temporary file, synced, renamed, directory synced."""
        final = self.path(name)
        directory = os.path.dirname(final)
        temporary = f"{final}{TEMP_MARK}{secrets.token_hex(6)}"

        def put() -> None:
            os.makedirs(directory, exist_ok=True)
            try:
                with open(local_path, "rb") as reader, open(temporary, "wb") as writer:
                    writer.writelines(iter(lambda: reader.read(_COPY_BLOCK_BYTES), b""))
                    writer.flush()
                    os.fsync(writer.fileno())
                os.replace(temporary, final)
                fsync_dir(directory)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise

        _io(f"cannot upload {local_path} to {self.url(name)}", put)

    def verify(self, local_path: str, name: str) -> tuple[int, int]:
        """Read object ``name`` back whole (not from the cache) and compare it with the
        local file: ``(size, crc32c)`` when they agree; ``ObjectMismatchError`` when the
        object is missing or differs, ``LedgerIOError`` when it cannot be read."""
        local = _file_digest(local_path)

        def remote() -> tuple[int, int] | None:
            if self.size(name) is None:
                return None
            with self.fs.open_input_stream(self.path(name)) as reader:
                return _digest(lambda: reader.read(_COPY_BLOCK_BYTES))

        found = _io(f"cannot read back {self.url(name)}", remote)
        if found != local:
            raise ObjectMismatchError(
                f"{self.url(name)} holds {'nothing' if found is None else f'{found[0]} bytes, CRC32C {found[1]:#010x}'}"
                f" where {local_path} holds {local[0]} bytes, CRC32C {local[1]:#010x}")
        return local

    # -- ledgers ------------------------------------------------------------------------

    def open_sealed(self, ledger_id: int) -> SealedFile | None:
        """Ledger ``ledger_id``'s object as a ``SealedFile`` through the cache; None when
        there is none, ``CorruptLedgerError`` when it is not a whole sealed ledger."""
        source = self.open(ledger_object_name(ledger_id))
        if source is None:
            return None
        sealed = SealedFile.over(source, ledger_id)  # closes the source when it is None
        if sealed is None:
            raise CorruptLedgerError(f"{source.name} is not a whole sealed ledger (truncated or damaged); "
                                     "it is not served", ledger_id=ledger_id)
        return sealed

    def load(self, ledger_id: int) -> tuple[ScanResult, ObjectSource] | None:
        """Ledger ``ledger_id``'s object, checked: MAGIC, META and SEAL records intact and
        the records' lengths adding up to the SEAL's counts (each entry's CRC32C is checked
        when read): what a store serves it by. None when there is no object;
        ``CorruptLedgerError`` when it is truncated or damaged."""
        sealed = self.open_sealed(ledger_id)
        if sealed is None:
            return None
        source = sealed.source
        assert isinstance(source, ObjectSource)
        try:
            offsets, lengths = sealed.walk()
            head = source.pread(0, min(source.size, HEAD_BYTES))
            tail = source.pread(max(0, source.size - TAIL_BYTES), TAIL_BYTES)
            scanned = sealed_layout(head, tail, source.size, offsets, lengths, source.name)
            if scanned is None or scanned.ledger_id != ledger_id:
                raise CorruptLedgerError(f"{source.name}: its META or SEAL record is damaged, or it holds "
                                         "another ledger; it is not served", ledger_id=ledger_id)
        except BaseException:
            source.discard_cached()
            source.close()
            raise
        return scanned, source

    def adopt(self, ledger_id: int, entry_offsets: array[int], entry_lengths: array[int]
              ) -> tuple[ScanResult, ObjectSource] | None:
        """Ledger ``ledger_id``'s object with the layout its writer recorded, checked
        against its META and SEAL records only (no walk); None when there is no object or
        the layout does not match."""
        source = self.open(ledger_object_name(ledger_id))
        if source is None:
            return None
        head = source.pread(0, min(source.size, HEAD_BYTES))
        tail = source.pread(max(0, source.size - TAIL_BYTES), TAIL_BYTES)
        scanned = sealed_layout(head, tail, source.size, entry_offsets, entry_lengths, source.name)
        if scanned is None or scanned.ledger_id != ledger_id:
            return None
        return scanned, source

    def upload_sealed(self, local_path: str, ledger_id: int) -> tuple[int, int]:
        """Copy the sealed ledger file ``local_path`` and its sidecars, then read each copy
        back (``verify``); ``(size, crc32c)`` of the ledger's file."""
        sealed = SealedFile.open(local_path, ledger_id)
        if sealed is None:
            if not os.path.exists(local_path):
                raise LedgerNotFoundError(f"ledger {ledger_id} has no local file to upload", ledger_id=ledger_id)
            raise LedgerError(f"ledger {ledger_id} is not sealed; only a sealed ledger is uploaded",
                              ledger_id=ledger_id)
        sealed.close()
        copies = [(local_path + suffix, ledger_object_name(ledger_id, suffix))
                  for suffix in SIDECAR_SUFFIXES if os.path.exists(local_path + suffix)]
        copies.append((local_path, ledger_object_name(ledger_id)))  # the ledger last
        for local, name in copies:
            self.upload(local, name)
        digest = (0, 0)
        for local, name in copies:
            digest = self.verify(local, name)
        return digest

    def upload_sidecar(self, ledger_id: int, suffix: str, local_path: str) -> None:
        """Copy the sidecar ``local_path`` as ledger ``ledger_id``'s ``suffix`` object and
        read it back."""
        if suffix not in SIDECAR_SUFFIXES:
            raise LedgerError(f"{suffix!r} is not a sidecar suffix ({', '.join(SIDECAR_SUFFIXES)})",
                              ledger_id=ledger_id)
        name = ledger_object_name(ledger_id, suffix)
        self.upload(local_path, name)
        self.verify(local_path, name)

    def delete(self, name: str) -> bool:
        """Delete object ``name``; False when there was none."""
        self.cache.discard(self.url(name))

        def remove() -> bool:
            try:
                self.fs.delete_file(self.path(name))
            except FileNotFoundError:
                return False
            return True

        if self.size(name) is None:
            return False
        return _io(f"cannot delete {self.url(name)}", remove)

    def delete_ledger(self, ledger_id: int) -> list[str]:
        """Delete ledger ``ledger_id``'s object and its sidecars' (sidecars first); the
        names of those that existed."""
        names = [ledger_object_name(ledger_id, suffix) for suffix in SIDECAR_SUFFIXES]
        names.append(ledger_object_name(ledger_id))
        return [name for name in names if self.delete(name)]


def _io(what: str, action: Callable[[], _T]) -> _T:
    """``action()``, its ``OSError`` (pyarrow's I/O errors) as a retriable ``LedgerIOError``."""
    try:
        return action()
    except LedgerIOError:
        raise
    except OSError as error:
        raise LedgerIOError(f"{what}: {error}") from error


def _digest(read: Callable[[], bytes]) -> tuple[int, int]:
    size, crc = 0, 0
    for block in iter(read, b""):
        size += len(block)
        crc = crc32c.crc32c(block, crc)
    return size, int(crc)


def _file_digest(path: str) -> tuple[int, int]:
    """``(size, crc32c)`` of the local file ``path``."""
    with open(path, "rb") as reader:
        return _digest(lambda: reader.read(_COPY_BLOCK_BYTES))

