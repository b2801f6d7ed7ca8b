"""Ledger storage backends behind one seam (``LedgerStore``): memory, file, faulty."""

from ledger.storage.base import LedgerInfo, LedgerState, LedgerStore, SyncPolicy
from ledger.storage.faulty import FaultyLedgerStore, SimulatedCrash
from ledger.storage.file import FileLedgerStore
from ledger.storage.memory import MemoryLedgerStore

__all__ = [
    "FaultyLedgerStore",
    "FileLedgerStore",
    "LedgerInfo",
    "LedgerState",
    "LedgerStore",
    "MemoryLedgerStore",
    "SimulatedCrash",
    "SyncPolicy",
]
