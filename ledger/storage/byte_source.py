"""Bytes of a sealed ledger (or a sidecar) read by offset, wherever they live.

A sealed ledger is read the same way whether its file is on the local disk or an object
in a bucket (``ledger.storage.bucket``): through a ``ByteSource``, ``pread(offset,
length)`` and ``size``. Every record read through one is still checked against its CRC32C
by the reader (``ledger.storage.record.entry_payload``); a source only moves bytes.

* ``FdSource``: an open local file (``os.pread``).
* ``ObjectSource``: an object of a ``pyarrow.fs`` filesystem, read by ranged reads through
  a ``BlockCache``: the object is cut into blocks of ``block_bytes`` (1 MiB, Pulsar's
  ``s3ManagedLedgerOffloadReadBufferSizeInBytes``); a read fetches the blocks it covers
  that are not cached, each run of missing blocks in one ranged GET, and keeps them.
* ``BlockCache``: one per store, bounded to ``capacity_bytes`` (least recently used
  blocks are dropped first; 0 caches nothing). An object name is never reused for other
  bytes (ledger ids are never reused), so a cached block never goes stale; ``discard``
  drops an object's blocks all the same when it is deleted or found damaged.
* ``SourceReader``: a source as a read-only, seekable Python file, which
  ``pyarrow.PythonFile`` turns into the random-access file ``pyarrow.parquet`` reads.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from typing import Any, Protocol

from ledger.errors import LedgerIOError

__all__ = ["BLOCK_BYTES", "BlockCache", "ByteSource", "FdSource", "ObjectSource", "SourceReader"]

BLOCK_BYTES = 1024 * 1024
"""The cache's block: the unit of a ranged read of an object."""


class ByteSource(Protocol):
    """Bytes read by offset; ``name`` names them in errors (a path, an object's URL)."""

    name: str
    size: int

    def pread(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer only at the end)."""
        ...

    def discard_cached(self) -> None:
        """Forget any cached bytes (they were found damaged): the next read fetches them."""
        ...

    def close(self) -> None: ...


class FdSource:
    """A local file open as ``fd`` (owned: ``close`` closes it)."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name
        self.size = os.fstat(fd).st_size

    def pread(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def discard_cached(self) -> None:
        """Nothing is cached: the page cache is the kernel's."""

    def close(self) -> None:
        os.close(self.fd)


class BlockCache:
    """Blocks of objects, least recently used dropped first past ``capacity_bytes``.
    Thread-safe; fetching happens outside its lock (two readers may fetch one block)."""

    def __init__(self, capacity_bytes: int, block_bytes: int = BLOCK_BYTES) -> None:
        assert block_bytes > 0, "a block holds at least one byte"
        self.capacity_bytes = max(0, capacity_bytes)
        self.block_bytes = block_bytes
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def get(self, key: str, index: int) -> bytes | None:
        with self._lock:
            block = self._blocks.get((key, index))
            if block is None:
                self.misses += 1
                return None
            self.hits += 1
            self._blocks.move_to_end((key, index))
            return block

    def put(self, key: str, index: int, block: bytes) -> None:
        if len(block) > self.capacity_bytes:
            return
        with self._lock:
            old = self._blocks.pop((key, index), None)
            if old is not None:
                self.used_bytes -= len(old)
            self._blocks[(key, index)] = block
            self.used_bytes += len(block)
            while self.used_bytes > self.capacity_bytes:
                _, dropped = self._blocks.popitem(last=False)
                self.used_bytes -= len(dropped)

    def discard(self, key: str) -> None:
        """Drop every block of object ``key``."""
        with self._lock:
            for cached in [cached for cached in self._blocks if cached[0] == key]:
                self.used_bytes -= len(self._blocks.pop(cached))


class ObjectSource:
    """An object of ``size`` bytes open as ``file`` (a ``pyarrow`` random-access file,
    whose ``read_at`` is thread-safe), read through ``cache`` under the key ``name``."""

    def __init__(self, file: Any, name: str, size: int, cache: BlockCache) -> None:
        self._file = file
        self.name = name
        self.size = size
        self._cache = cache

    def pread(self, offset: int, length: int) -> bytes:
        stop = min(self.size, offset + max(0, length))
        if offset >= stop:
            return b""
        block_bytes = self._cache.block_bytes
        first, last = offset // block_bytes, (stop - 1) // block_bytes
        blocks: list[bytes | None] = [self._cache.get(self.name, index) for index in range(first, last + 1)]
        index = first
        while index <= last:
            if blocks[index - first] is not None:
                index += 1
                continue
            run_end = index
            while run_end + 1 <= last and blocks[run_end + 1 - first] is None:
                run_end += 1
            fetched = self._fetch(index * block_bytes, min(self.size, (run_end + 1) * block_bytes))
            for at in range(index, run_end + 1):
                block = fetched[(at - index) * block_bytes : (at - index + 1) * block_bytes]
                blocks[at - first] = block
                self._cache.put(self.name, at, block)
            index = run_end + 1
        parts = []
        for index, held in enumerate(blocks, first):  # only the bytes asked for are copied
            assert held is not None
            base = index * block_bytes
            parts.append(held[max(offset, base) - base : min(stop, base + len(held)) - base])
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _fetch(self, start: int, stop: int) -> bytes:
        try:
            data = bytes(self._file.read_at(stop - start, start))
        except OSError as error:
            raise LedgerIOError(f"{self.name}: ranged read of {start}..{stop} failed: {error}") from error
        if len(data) != stop - start:  # the object changed under its name: never served
            raise LedgerIOError(f"{self.name}: short ranged read ({len(data)} of {stop - start} bytes)")
        return data

    def discard_cached(self) -> None:
        """Drop this object's cached blocks (its bytes were found damaged)."""
        self._cache.discard(self.name)

    def close(self) -> None:
        self._file.close()


class SourceReader(io.RawIOBase):
    """``source`` as a read-only, seekable file (wrap it in ``pyarrow.PythonFile``)."""

    def __init__(self, source: ByteSource) -> None:
        super().__init__()
        self._source = source
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._source.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        data = self._source.pread(self._position, len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        self._position += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._source.size - self._position)
        data = self._source.pread(self._position, size)
        self._position += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            self._source.close()
        super().close()
