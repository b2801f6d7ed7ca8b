"""Each package's public surface is pinned: a change to ``__all__`` is a deliberate one."""

from __future__ import annotations

import importlib

import pytest

EXPECTED = {
    "ledger": {
        "EARLIEST", "LATEST", "CompactionServiceError", "CorruptEntryError", "CorruptLedgerError", "Database",
        "DataDir", "DataDirLock", "DataDirLockedError", "Entry", "FaultyLedgerStore",
        "FileLedgerStore", "LedgerError", "LedgerFencedError", "LedgerIOError", "LedgerInfo",
        "LedgerNotFoundError", "LedgerRecord", "LedgerSealedError", "LedgerState", "LedgerStore",
        "ManagedLedger", "ManagedLedgerConfig", "MemoryLedgerStore", "MessageId", "MetadataError",
        "MetadataStore", "Position", "PositionOutOfRangeError", "SchemaVersionError",
        "SimulatedCrash", "SyncPolicy", "TopicTable",
    },
    "cursor": {
        "UNACKED_RANGES_PERSIST_MAX", "AckedRanges", "CursorError", "CursorRecord", "CursorStore",
        "InitialPosition",
        "InvalidMarkDeletePositionError", "ManagedCursor", "MarkDeleteBackwardsError",
    },
    "compactor": {
        "COMPACTED_TOPIC_LEDGER", "COMPACTION_SUBSCRIPTION", "NO_MESSAGE", "CompactedEntry",
        "CompactedLedgerMissingError", "CompactedReader", "CompactedTopic", "CompactedView", "CompactionConfig",
        "CompactionInProgressError", "CompactionRecord", "CompactionTimeoutError", "Compactor",
        "CompactorError", "KeyMap", "KeyMapLimitError", "MalformedEntryError", "PhaseOneResult",
        "RunFigures", "UndecodablePayloadError", "collect_orphans", "compact", "phase_one",
        "phase_two",
    },
}


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_all_is_pinned_and_importable(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == EXPECTED[package]
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.{name} is in __all__ but missing"
