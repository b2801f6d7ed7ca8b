"""The error tree of compactd, rooted in the lowest layer.

Every package adds a handful of subclasses in its own ``errors.py``; this module holds the
root and the ledger layer's errors::

    CompactionServiceError                  root of every error compactd raises on purpose
    ├── LedgerError                         anything the ledger layer refuses or fails at
    │   ├── LedgerNotFoundError (KeyError)  no ledger with that id (deleted or never created)
    │   ├── LedgerSealedError               append to a sealed (closed) ledger
    │   ├── LedgerFencedError               append through a writer that lost its ledger
    │   ├── PositionOutOfRangeError (IndexError)  read outside 0..last_add_confirmed
    │   ├── LedgerIOError (OSError)         the backend failed to write or sync (retriable)
    │   ├── OffloadAlreadyRunning           an admin offload of the topic is still running (409)
    │   └── CorruptLedgerError              a ledger's stored data is damaged (not a torn tail)
    │       ├── CorruptEntryError           one entry's record fails its CRC32C when read
    │       └── ObjectMismatchError         a bucket's copy of a ledger differs from the local file
    ├── MetadataError                       the SQLite metadata store refused or failed
    │   └── SchemaVersionError              database written by a newer compactd
    └── DataDirLockedError                  another process holds the data dir

Errors carry their context as attributes (``ledger_id``, ``topic``) and a ``retriable``
flag that tells a caller whether the same call may succeed later.
"""

from __future__ import annotations

__all__ = [
    "CompactionServiceError",
    "CorruptEntryError",
    "CorruptLedgerError",
    "DataDirLockedError",
    "LedgerError",
    "LedgerFencedError",
    "LedgerIOError",
    "LedgerNotFoundError",
    "LedgerSealedError",
    "MetadataError",
    "ObjectMismatchError",
    "OffloadAlreadyRunning",
    "PositionOutOfRangeError",
    "SchemaVersionError",
]


class CompactionServiceError(Exception):
    """Root of compactd's errors; ``retriable`` says whether retrying may succeed."""

    retriable: bool = False


class LedgerError(CompactionServiceError):
    """The ledger layer refused or failed an operation on ``ledger_id``."""

    def __init__(self, message: str, *, ledger_id: int | None = None) -> None:
        super().__init__(message)
        self.ledger_id = ledger_id


class LedgerNotFoundError(LedgerError, KeyError):
    """No ledger with that id: never created, or deleted."""

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


class LedgerSealedError(LedgerError):
    """The ledger is sealed (closed); it can never be appended to again."""


class LedgerFencedError(LedgerError):
    """This writer may no longer append: its ledger failed or was taken over."""


class PositionOutOfRangeError(LedgerError, IndexError):
    """A read asked for entries outside ``0..last_add_confirmed``."""


class LedgerIOError(LedgerError, OSError):
    """The backend failed to write or sync; the appends it covered are failed back."""

    retriable = True


class OffloadAlreadyRunning(LedgerError):
    """An offload of the topic triggered through the admin API has not finished yet
    (Pulsar answers HTTP 409 "Offload already running")."""

    def __init__(self, message: str, *, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


class CorruptLedgerError(LedgerError):
    """A ledger's stored data is damaged where it cannot be a torn tail."""


class CorruptEntryError(CorruptLedgerError):
    """Entry ``entry_id`` of ledger ``ledger_id`` fails its CRC32C when read: the bytes on
    disk changed after they were confirmed. That read fails; the entry is never served."""

    def __init__(self, message: str, *, ledger_id: int, entry_id: int) -> None:
        super().__init__(message, ledger_id=ledger_id)
        self.entry_id = entry_id


class ObjectMismatchError(CorruptLedgerError):
    """An uploaded object read back differs from the local file it copies (size or
    CRC32C), or is missing: the copy is never trusted; uploading again may succeed."""

    retriable = True


class MetadataError(CompactionServiceError):
    """The metadata store refused or failed an operation."""


class SchemaVersionError(MetadataError):
    """The metadata database was written by a newer compactd than this one."""


class DataDirLockedError(CompactionServiceError):
    """Another process holds the data dir; nothing was touched."""

    def __init__(self, message: str, *, data_dir: str) -> None:
        super().__init__(message)
        self.data_dir = data_dir
