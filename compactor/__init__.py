"""What the product is for: the message format, two-phase compaction and the compacted view.

Pure core: ``algorithm`` (phase one and two over entries), ``keymap`` (the bounded key
map), ``scheduler`` (when to compact) and ``run_state`` (the run state machine: events in,
actions out). I/O at the edges: ``runner`` (the inside of one run against storage and its
publish), ``runs`` (the one executor of runs: slots, queue, tasks, persisted status, shared
by the REST trigger, the scheduler and ``compact-topic``), ``topic`` (a topic's compaction
state: its ``__compaction`` cursor, its view, read-compacted dispatch), ``view`` (the
compacted ledger, one immutable value per publish).
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
from compactor.record import CompactionRecord, RunFigures
from compactor.runner import CompactionConfig, Compactor, collect_orphans
from compactor.topic import (
    COMPACTED_TOPIC_LEDGER,
    COMPACTION_SUBSCRIPTION,
    NO_MESSAGE,
    CompactedTopic,
)
from compactor.view import CompactedView

__all__ = [
    "COMPACTED_TOPIC_LEDGER",
    "COMPACTION_SUBSCRIPTION",
    "NO_MESSAGE",
    "CompactedEntry",
    "CompactedLedgerMissingError",
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
