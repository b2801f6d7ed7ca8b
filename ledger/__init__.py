"""Ledgers, managed ledgers (a topic's log), the shared metadata database and the ledger
layer's tables on it, and the offload of sealed ledgers to a bucket (``ledger.offload``).

Nothing in this package knows what a message is: entries are opaque bytes.
"""

from ledger.data_dir import DataDir
from ledger.database import Database, TopicTable
from ledger.errors import (
    CompactionServiceError,
    CorruptEntryError,
    CorruptLedgerError,
    DataDirLockedError,
    LedgerError,
    LedgerFencedError,
    LedgerIOError,
    LedgerNotFoundError,
    LedgerSealedError,
    MetadataError,
    PositionOutOfRangeError,
    SchemaVersionError,
)
from ledger.lock import DataDirLock
from ledger.managed_ledger import Entry, ManagedLedger, ManagedLedgerConfig
from ledger.metadata import LedgerRecord, MetadataStore
from ledger.position import EARLIEST, LATEST, MessageId, Position
from ledger.storage import (
    FaultyLedgerStore,
    FileLedgerStore,
    LedgerInfo,
    LedgerState,
    LedgerStore,
    MemoryLedgerStore,
    SimulatedCrash,
    SyncPolicy,
)

__all__ = [
    "EARLIEST",
    "LATEST",
    "CompactionServiceError",
    "CorruptEntryError",
    "CorruptLedgerError",
    "DataDir",
    "DataDirLock",
    "DataDirLockedError",
    "Database",
    "Entry",
    "FaultyLedgerStore",
    "FileLedgerStore",
    "LedgerError",
    "LedgerFencedError",
    "LedgerIOError",
    "LedgerInfo",
    "LedgerNotFoundError",
    "LedgerRecord",
    "LedgerSealedError",
    "LedgerState",
    "LedgerStore",
    "ManagedLedger",
    "ManagedLedgerConfig",
    "MemoryLedgerStore",
    "MessageId",
    "MetadataError",
    "MetadataStore",
    "Position",
    "PositionOutOfRangeError",
    "SchemaVersionError",
    "SimulatedCrash",
    "SyncPolicy",
    "TopicTable",
]
