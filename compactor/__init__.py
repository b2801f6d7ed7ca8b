"""What the product is for: the message format, two-phase compaction and the compacted view.

Pure core: ``algorithm`` (phase one and two over entries) and ``keymap`` (the bounded key
map). I/O at the edges: ``runner`` (a run against storage and its publish), ``topic``
(a topic's compaction state: the published view), ``view`` (the compacted ledger),
``reader`` (one subscription's read-compacted state over the view and its cursor).
``engine`` chooses where phase one runs (local, spark, auto); ``compactor.spark`` holds the
Spark engine and the ``compactd`` PySpark data source, and is the only place that imports
PySpark (lazily: nothing here imports it).
"""

from compactor.algorithm import CompactedEntry, PhaseOneResult, compact, phase_one, phase_two
from compactor.errors import (
    CompactedLedgerMissingError,
    CompactionInProgressError,
    CompactionTimeoutError,
    CompactorError,
    MalformedEntryError,
    UndecodablePayloadError,
)
from compactor.keymap import KeyMap, KeyMapLimitError
from compactor.reader import NO_MESSAGE, CompactedReader
from compactor.record import CompactionRecord, RunFigures
from compactor.runner import CompactionConfig, Compactor, collect_orphans
from compactor.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION, CompactedTopic
from compactor.view import CompactedView

__all__ = [
    "COMPACTED_TOPIC_LEDGER",
    "COMPACTION_SUBSCRIPTION",
    "NO_MESSAGE",
    "CompactedEntry",
    "CompactedLedgerMissingError",
    "CompactedReader",
    "CompactedTopic",
    "CompactedView",
    "CompactionConfig",
    "CompactionInProgressError",
    "CompactionRecord",
    "CompactionTimeoutError",
    "Compactor",
    "CompactorError",
    "KeyMap",
    "KeyMapLimitError",
    "MalformedEntryError",
    "PhaseOneResult",
    "RunFigures",
    "UndecodablePayloadError",
    "collect_orphans",
    "compact",
    "phase_one",
    "phase_two",
]
