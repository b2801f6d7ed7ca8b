"""The data-dir lock: one compactd process per data dir.

``DataDirLock.acquire(path)`` takes an exclusive, non-blocking ``flock`` on
``path/LOCK``. A second process fails at once with ``DataDirLockedError`` naming the
holder's pid, before it has created, truncated or written anything (opening the lock file
without truncating it is all it does). The kernel drops the lock when the holder dies, so
a ``kill -9`` never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os

from ledger.errors import DataDirLockedError

__all__ = ["LOCK_FILE", "DataDirLock"]

LOCK_FILE = "LOCK"


class DataDirLock:
    """An acquired lock on a data dir; ``release()`` (or process exit) gives it up."""

    def __init__(self, data_dir: str, fd: int) -> None:
        self.data_dir = data_dir
        self._fd = fd

    @classmethod
    def acquire(cls, data_dir: str) -> DataDirLock:
        """Lock ``data_dir`` (created if missing) or raise ``DataDirLockedError`` at once."""
        data_dir = os.path.abspath(data_dir)
        os.makedirs(data_dir, mode=0o700, exist_ok=True)  # owner-only: message data is private
        fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirLockedError(
                f"data dir {data_dir} is in use by another compactd process (pid {holder}); "
                "stop it or choose another --data-dir",
                data_dir=data_dir,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        return cls(data_dir, fd)

    def release(self) -> None:
        """Give the lock up; idempotent."""
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
