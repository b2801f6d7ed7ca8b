"""Ledger storage backends behind one seam (``LedgerStore``): memory, file, faulty; the
file store reads sealed ledgers offloaded to a bucket (``bucket``, ``byte_source``,
``object_fs``) as it reads its own files."""

from ledger.storage.base import LedgerInfo, LedgerState, LedgerStore, SyncPolicy
from ledger.storage.faulty import FaultyLedgerStore, SimulatedCrash
from ledger.storage.file import FileLedgerStore
from ledger.storage.memory import MemoryLedgerStore
from ledger.storage.powers import LedgerFiles

__all__ = [
    "FaultyLedgerStore",
    "FileLedgerStore",
    "LedgerFiles",
    "LedgerInfo",
    "LedgerState",
    "LedgerStore",
    "MemoryLedgerStore",
    "SimulatedCrash",
    "SyncPolicy",
]
