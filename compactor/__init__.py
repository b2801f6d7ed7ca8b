"""What the product is for: two-phase compaction and the compacted view, split by concern.

The compactor sits on ``message`` (Pulsar's message format: entry parsing, encoding,
compression, the protobuf), ``cursor`` and ``ledger``. Inside, four floors, each importing
only the ones below it (``tests/unit/test_imports.py`` checks it):

* the shared ground, directly here: ``errors`` (the compactor's errors; it re-exports the
  format's), ``engine`` (the rewrite-engine contract shared by the local engine and Spark,
  and the choice of engine: local, spark, auto), ``record`` (a run's figures and record)
  and ``throttle`` (a run's I/O budget);
* ``compactor.view``: the compacted view, what readers see: ``view`` (the compacted
  ledgers' entry format and one immutable view per publish), ``manifest`` (which ledgers
  make each view, and the replaced ones awaiting their grace period), ``topic`` (a topic's
  compaction state: its ``__compaction`` cursor and its published view), ``reader`` (one
  subscription's read-compacted state);
* ``compactor.local``: the local engine, the two phases in this machine: the pure core
  (``algorithm``, ``keymap``, ``chunks``, ``scan``, ``rounds``), the key index beside sealed
  ledgers (``key_index``, ``indexed``, ``index_source``, ``index_builds``) and ``worker``
  (rounds in a worker process, off the broker's interpreter);
* ``compactor.spark``: the Spark engine and the ``compactd`` PySpark data source, the only
  place that imports PySpark (lazily);
* ``compactor.runs``, on top: running compactions: ``runner`` (the inside of one run and
  its publish; ``run_tally`` counts it, ``run_log`` logs it), ``runs`` (the one executor of
  runs: slots, queue, tasks), ``run_state`` (the run state machine), ``status`` (the
  persisted status of each topic's last run), ``scheduler`` and ``lag`` (when to compact,
  and what is too young to).

Importing ``compactor`` loads nothing: the names below load their module on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compactor.errors import (
        CompactedLedgerMissingError,
        CompactionInProgressError,
        CompactionTimeoutError,
        CompactorError,
        MalformedEntryError,
        UndecodablePayloadError,
    )
    from compactor.local.algorithm import PhaseOneResult, compact, phase_one, phase_two
    from compactor.local.keymap import KeyMap, KeyMapLimitError
    from compactor.record import CompactionRecord, RunFigures
    from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
    from compactor.view.reader import NO_MESSAGE, CompactedReader
    from compactor.view.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION, CompactedTopic
    from compactor.view.view import CompactedEntry, CompactedView

_MODULES = {
    "COMPACTED_TOPIC_LEDGER": "compactor.view.topic",
    "COMPACTION_SUBSCRIPTION": "compactor.view.topic",
    "NO_MESSAGE": "compactor.view.reader",
    "CompactedEntry": "compactor.view.view",
    "CompactedLedgerMissingError": "compactor.errors",
    "CompactedReader": "compactor.view.reader",
    "CompactedTopic": "compactor.view.topic",
    "CompactedView": "compactor.view.view",
    "CompactionConfig": "compactor.runs.runner",
    "CompactionInProgressError": "compactor.errors",
    "CompactionRecord": "compactor.record",
    "CompactionTimeoutError": "compactor.errors",
    "Compactor": "compactor.runs.runner",
    "CompactorError": "compactor.errors",
    "KeyMap": "compactor.local.keymap",
    "KeyMapLimitError": "compactor.local.keymap",
    "MalformedEntryError": "compactor.errors",
    "PhaseOneResult": "compactor.local.algorithm",
    "RunFigures": "compactor.record",
    "UndecodablePayloadError": "compactor.errors",
    "collect_orphans": "compactor.runs.runner",
    "compact": "compactor.local.algorithm",
    "phase_one": "compactor.local.algorithm",
    "phase_two": "compactor.local.algorithm",
}

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


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'compactor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
