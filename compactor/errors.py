"""The compactor layer's errors, under the root that ``ledger.errors`` defines.

::

    CompactionServiceError (ledger.errors)   root of every error compactd raises on purpose
    └── CompactorError                       anything the compactor layer refuses or fails at
        ├── CompactionInProgressError        a run was asked for while one runs on the topic
        ├── CompactionStoppedError           a run was asked for, or was queued, as the broker stops
        ├── CompactedLedgerMissingError      the published compacted ledger is gone
        ├── CompactionTimeoutError           a phase-one read took longer than its limit
        ├── SparkEngineError                 the Spark engine could not run (PySpark or
        │   │                                Java missing, a failed job, an unusable store)
        │   └── SparkWorkerImportError       a Spark Python worker lacks a module compactd
        │                                    needs (spark/shipping.py)
        └── KeyMapLimitError (local/keymap.py) a position does not fit the key map's packing

The message format's errors (``MalformedEntryError``, ``UndecodablePayloadError``) belong
to the ``message`` package, which sits below the compactor (``message.errors``; they
derive from ``CompactionServiceError`` and ``ValueError``, not from ``CompactorError``).
They are re-exported here, the very same classes, so
``except compactor.errors.MalformedEntryError`` keeps working.
"""

from __future__ import annotations

from ledger.errors import CompactionServiceError
from message.errors import MalformedEntryError, UndecodablePayloadError

__all__ = [
    "CompactedLedgerMissingError",
    "CompactionInProgressError",
    "CompactionStoppedError",
    "CompactionTimeoutError",
    "CompactorError",
    "MalformedEntryError",
    "SparkEngineError",
    "UndecodablePayloadError",
]


class CompactorError(CompactionServiceError):
    """The compactor layer refused or failed an operation."""


class CompactionInProgressError(CompactorError):
    """A compaction of ``topic`` is already running (REST answers 409)."""

    def __init__(self, topic: str) -> None:
        super().__init__("Compaction already in progress")
        self.topic = topic


class CompactionStoppedError(CompactorError):
    """The broker is stopping: a run of ``topic`` was refused, or dropped from the queue
    (retriable: the REST API answers 503; a restarted broker takes it)."""

    retriable = True

    def __init__(self, topic: str) -> None:
        super().__init__(f"{topic}: the broker is stopping; no compaction starts")
        self.topic = topic


class CompactionInterruptedError(CompactorError):
    """The broker stopped while a run waited on its I/O throttle (``compactor.throttle``):
    the run ends as a failure (its new ledger deleted, the previous view serving) rather
    than keep the stop waiting; a restarted broker runs it again."""

    retriable = True


class CompactedLedgerMissingError(CompactorError):
    """The compacted ledger the ``__compaction`` cursor points at does not exist.

    Compacted reads and new runs fail until the ``__compaction`` subscription is deleted;
    raw reads are unaffected.
    """

    def __init__(self, topic: str, ledger_id: int) -> None:
        super().__init__(
            f"compacted ledger {ledger_id} of topic {topic} is missing; delete the "
            "__compaction subscription to rebuild the compacted view from the raw topic"
        )
        self.topic = topic
        self.ledger_id = ledger_id


class CompactionTimeoutError(CompactorError):
    """A phase-one read did not complete within ``phase_one_read_timeout_s``."""

    retriable = True


class SparkEngineError(CompactorError):
    """The Spark engine could not run phase one; the run fails and nothing is published.

    Errors from PySpark and py4j are re-raised as this one at the adapter boundary
    (``compactor.spark``); ``retriable`` is True for a failed job (the cluster may recover),
    False when PySpark or the ledger files are not there to use.
    """

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable
