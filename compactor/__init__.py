"""What the product is for: the message format, two-phase compaction and the compacted view.

Pure core: ``algorithm`` (phase one and two over entries), ``keymap`` (the bounded key
map), ``scheduler`` (when to compact) and ``run_state`` (the run state machine: events in,
actions out). I/O at the edges: ``runner`` (the inside of one run against storage and its
publish; ``run_tally`` counts its progress and figures), ``worker`` (the local engine's
rounds in a worker process, off the broker's interpreter), ``runs`` (the one executor of runs: slots, queue, tasks, persisted status, shared
by the REST trigger, the scheduler and ``compact-topic``), ``topic`` (a topic's compaction
state: its ``__compaction`` cursor and its published view), ``view`` (the compacted
ledgers of a view, one immutable value per publish), ``manifest`` (which ledgers make each
view, and the replaced ones awaiting their grace period), ``reader`` (one subscription's read-compacted state over
the view and its cursor), ``status`` (the persisted status of each topic's last run).
``engine`` chooses where a run goes (local, spark, auto); ``compactor.spark`` holds the
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
