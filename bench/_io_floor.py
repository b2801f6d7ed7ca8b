"""The I/O floor of a compaction run: plain file I/O over the run's own input and output.

``io_floor(inputs, output, scratch)`` times, in the process that just ran the compaction
and on the same files, what no compactor can avoid: reading every input ledger file once
(``readinto`` of 1 MiB chunks, no parsing) and writing the output's bytes once to a new
file in the same directory, then ``fsync`` (the compacted ledger is durable before it is
published). The output's bytes are read into memory before the write is timed, so the
write is timed alone. ``scratch`` is removed afterwards.

Both reads come from wherever the kernel has the files (after the run: usually the page
cache, as the run's own second read was), so the floor is what this machine's plain file
I/O costs for the run's bytes, not a cold-disk figure.
"""

from __future__ import annotations

import os
import time

__all__ = ["io_floor", "ledger_files"]

_CHUNK_BYTES = 1 << 20
_SUFFIX = ".ledger"


def ledger_files(directory: str) -> list[str]:
    """The ledger files in ``directory``, sorted by name (= by ledger id)."""
    return sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(_SUFFIX))


def io_floor(inputs: list[str], output: str, scratch: str) -> dict[str, float]:
    """Seconds to read ``inputs`` and to write ``output``'s bytes to ``scratch`` with fsync."""
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    read_bytes = 0
    started = time.perf_counter()
    for path in inputs:
        with open(path, "rb", buffering=0) as file:
            while count := file.readinto(view):
                read_bytes += count
    read_s = time.perf_counter() - started
    with open(output, "rb") as file:
        chunks = list(iter(lambda: file.read(_CHUNK_BYTES), b""))
    started = time.perf_counter()
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in chunks:
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    write_s = time.perf_counter() - started
    os.remove(scratch)
    return {
        "io_floor_s": read_s + write_s, "io_read_s": read_s, "io_write_s": write_s,
        "io_read_bytes": read_bytes, "io_write_bytes": sum(len(chunk) for chunk in chunks),
    }
