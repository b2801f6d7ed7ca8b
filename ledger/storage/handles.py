"""Open file descriptors of ledger files, bounded: at most ``max_open`` stay open unused.

A broker can hold many more ledgers than a process may open files (10,000 topics under the
common limit of 1,024 descriptors). ``FileHandles`` keeps the descriptors of recently used
ledger files open, closes the least recently used idle ones past ``max_open``, and
reopens a file when it is used again (a few microseconds; the page cache stays warm).

A descriptor is *pinned* while a thread uses it outside the store's lock (a read, a write,
a sync): a pinned descriptor is never closed, so the bound can be passed for a moment by
the number of threads at work, never more. Writes and their sync always happen within one
pin, on one descriptor, so a sync reports the errors of the writes it covers.

Not thread-safe by itself: the file store calls every method under its own lock.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["FileHandle", "FileHandles"]


@dataclass(eq=False)
class FileHandle:
    """One open descriptor; ``users`` pin it, ``discarded`` closes it at the last unpin."""

    fd: int
    users: int = 0
    discarded: bool = False


class FileHandles:
    """The open descriptors of one store's ledger files, keyed by ledger id."""

    def __init__(self, max_open: int, *, flags: int) -> None:
        assert max_open >= 1, "at least one ledger file must be open at a time"
        self.max_open = max_open
        self._flags = flags
        self._open: OrderedDict[int, FileHandle] = OrderedDict()  # least recently used first

    @property
    def open_count(self) -> int:
        """Descriptors open now (pinned or idle)."""
        return len(self._open)

    def adopt(self, key: int, fd: int) -> None:
        """Track ``fd``, just opened by the caller for ``key``, as open and idle."""
        assert key not in self._open, f"ledger {key} already has an open descriptor"
        self._open[key] = FileHandle(fd)
        self._evict()

    def pin(self, key: int, path: str) -> FileHandle:
        """``key``'s descriptor, opened on ``path`` if it was closed, pinned until ``unpin``.

        Raises what ``os.open`` raises (``FileNotFoundError`` once the file is gone).
        """
        handle = self._open.get(key)
        if handle is None:
            handle = FileHandle(os.open(path, self._flags))
            self._open[key] = handle
        else:
            self._open.move_to_end(key)
        handle.users += 1
        self._evict()
        return handle

    def unpin(self, handle: FileHandle) -> None:
        """The caller is done with ``handle``'s descriptor."""
        handle.users -= 1
        if handle.discarded:
            self._close_if_idle(handle)
        else:
            self._evict()

    def discard(self, key: int) -> None:
        """Forget ``key``'s descriptor (its file is deleted); it closes once idle."""
        handle = self._open.pop(key, None)
        if handle is not None:
            handle.discarded = True
            self._close_if_idle(handle)

    def close_all(self) -> None:
        """Discard every descriptor (pinned ones close at their last unpin)."""
        for key in list(self._open):
            self.discard(key)

    def _evict(self) -> None:
        """Close the least recently used idle descriptors past ``max_open``."""
        excess = len(self._open) - self.max_open
        if excess <= 0:
            return
        victims = []
        for key, handle in self._open.items():
            if handle.users == 0:
                victims.append(key)
                if len(victims) == excess:
                    break
        for key in victims:
            os.close(self._open.pop(key).fd)

    @staticmethod
    def _close_if_idle(handle: FileHandle) -> None:
        if handle.users == 0 and handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1
