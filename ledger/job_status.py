"""Pulsar's ``LongRunningProcessStatus``, once: where an admin-triggered job of a topic
stands (an offload, ``ledger.offload``; a compaction run, ``compactor.runs``)."""

from __future__ import annotations

import enum

__all__ = ["JobStatus"]


class JobStatus(enum.StrEnum):
    """A job's status; a member is the string the REST API answers and a store persists."""

    NOT_RUN = "NOT_RUN"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"
