"""Phase two of one group, on an executor: a contiguous group of pieces into one compacted ledger.

The Spark engine (``compactor.spark.engine``) cuts a run's input stream into pieces and
the pieces into contiguous *groups*; phase one's decisions reach each group's task
co-partitioned with it (never through the driver). A task rewrites its group alone:

* ``group_phase_two`` keeps exactly what ``compactor.local.algorithm.phase_two`` keeps of the
  group's entries, given the group's share of phase one's decisions: ``retained``, the
  positions ``(ledger_id, entry_id, batch_index)`` that are some key's latest (a young
  tombstone included; a keyed last chunk at batch index -1), and ``dropped_chunks``, the
  entries ``(ledger_id, entry_id)`` of chunks whose chunked message completes in the run's
  stream and does not survive (``compactor.local.chunks``; the message may complete in a later
  group, so this is decided over the whole stream, not here). Key-less messages survive
  iff ``retain_null_key``; old tombstones and markers never survive; opaque entries
  survive whole. It is ``algorithm.phase_two`` with the lookups given as sets rather than
  a key map: the rule is ``compactor.local.slot_rule.surviving_slots``, the rewrite
  ``algorithm.kept_entry``.
* ``rewrite_group`` reads the group's pieces straight from the ledger files (a read-only
  ``FileLedgerStore``; with a bucket, from the object store alone), encodes the survivors
  (``compactor.view.view.encode_compacted_entry``) and writes them as one whole sealed
  ledger at the id the driver reserved for the group (``ledger.storage.sealed_writer``:
  temporary file, fsync, atomic rename; with a bucket, in a local scratch directory, then
  uploaded as the object ``ledgers/<id>`` and verified, an atomic put). A retried or
  speculative attempt writes the same bytes again (the plan fixes ``created_at_ms``), so
  whichever attempt's file stays, it is the same ledger. It returns the group's *report*:
  one small row (``REPORT_SCHEMA_DDL``). The group's retained positions take 8 bytes each
  there (``PackedSlots``), so a task's memory is about 8 bytes per live key of its group.

Test fault point (never set outside tests): the environment variable ``FAULT_ENV``, read
by the task alone, set to ``"<group>:<attempts>:<point>"`` makes the first ``<attempts>``
attempts of group ``<group>``'s task kill their own Python worker with SIGKILL (a
``kill -9`` of the worker the real job cannot be made to suffer on demand) at ``<point>``:
``writing`` (its temporary file is open, the ledger not yet renamed) or ``written`` (the
ledger is renamed, the report not yet returned); ``hang`` stops the task while writing for
``FAULT_HANG_S`` seconds instead (a test kills the driver meanwhile).

No PySpark here (but for the attempt number, read only when the fault point is set);
PyArrow only in ``rewrite_group``'s input and output.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from compactor.engine import LedgerRange
from compactor.local.algorithm import CompactedEntry, kept_entry
from compactor.local.keymap import KeyMapLimitError, PositionPacker
from compactor.local.scan import scan_entry
from compactor.local.slot_rule import surviving_slots
from compactor.record import RoundFigures
from compactor.view.view import encode_compacted_entry
from ledger.managed_ledger import Entry
from ledger.position import Position
from ledger.storage.object_fs import BucketConfig
from ledger.storage.sealed_writer import SealedLedger, write_sealed_ledger

__all__ = [
    "DECISION_DROPPED_CHUNK",
    "DECISION_FIGURES",
    "DECISION_RETAINED",
    "FAULT_ENV",
    "REPORT_SCHEMA_DDL",
    "GroupReport",
    "GroupSpec",
    "PackedSlots",
    "RewriteJob",
    "group_phase_two",
    "rewrite_group",
]

Slot = tuple[int, int, int]
"""A message's ``(ledger_id, entry_id, batch_index)`` (-1 for a non-batched message)."""
At = tuple[int, int]
"""An entry's ``(ledger_id, entry_id)``."""

# What a decision row co-partitioned with a group says (its ``kind`` column).
DECISION_RETAINED = 0  # the position is some key's latest
DECISION_DROPPED_CHUNK = 1  # the chunk at the entry is dropped with its chunked message
DECISION_FIGURES = 2  # one piece's phase-one figures (every piece has one: no group is without rows)
FAULT_ENV = "COMPACTD_TEST_REWRITE_FAULT"  # the test fault point (module docstring)
FAULT_HANG_S = 120.0
FIGURES = ("entries", "messages", "entry_bytes", "markers", "opaque_entries")
REPORT_SCHEMA_DDL = (
    "grp int, ledger_id bigint, entries_written bigint, bytes_written bigint, messages_kept bigint, "
    "keys_kept bigint, entries_read bigint, messages_read bigint, bytes_read bigint, markers bigint, "
    "opaque_entries bigint"
)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One group of the plan: what its task reads and where it writes.

    Attributes:
        index: the group's place in the stream (0, 1, ...).
        pieces: its pieces, contiguous, in stream order.
        ledger_id: the id reserved for its compacted ledger.
        first_piece: the number of its first piece in the run (the pieces of all groups
            numbered in stream order): phase one's stream places name pieces by it.
    """

    index: int
    pieces: tuple[LedgerRange, ...]
    ledger_id: int
    first_piece: int = 0


@dataclass(frozen=True, slots=True)
class GroupReport:
    """What a group's task reports: its group and its ``RoundFigures`` (``keys_kept``: live
    keys whose latest position lies in the group; phase one's figures: the group's
    pieces'), sent as one row of ``REPORT_SCHEMA_DDL`` (``row``, ``from_row``)."""

    group: int
    figures: RoundFigures

    def row(self) -> tuple[int, ...]:
        """The report as a ``REPORT_SCHEMA_DDL`` row."""
        return (self.group, *(getattr(self.figures, name) for name in _FIGURE_COLUMNS))

    @classmethod
    def from_row(cls, row: Sequence[int]) -> GroupReport:
        """The report of a ``REPORT_SCHEMA_DDL`` row."""
        group, *figures = row
        return cls(int(group), RoundFigures(**dict(zip(_FIGURE_COLUMNS, map(int, figures), strict=True))))


_FIGURE_COLUMNS = tuple(column.split()[0] for column in REPORT_SCHEMA_DDL.split(", ")[1:])


def group_phase_two(
    entries: Iterable[Entry], retained: Collection[Slot], dropped_chunks: Collection[At], *,
    retain_null_key: bool = False, keep_tombstones_since_ms: int | None = None,
) -> Iterator[CompactedEntry]:
    """The surviving entries of a group's ``entries``, in order (see the module docstring)."""
    for entry in entries:
        scan = scan_entry(entry.data)
        at = (entry.position.ledger_id, entry.position.entry_id)

        def latest(batch_index: int, key: str, at: At = at) -> bool:
            del key
            return (*at, batch_index) in retained

        keep = surviving_slots(scan, keep_tombstones_since_ms=keep_tombstones_since_ms,
                               retain_null_key=retain_null_key, latest=latest,
                               chunk_survives=scan.chunk is not None and at not in dropped_chunks)
        if keep:
            yield kept_entry(entry, scan, keep)


class PackedSlots(Collection[Slot]):
    """A group's retained positions, 8 bytes each: packed (``compactor.local.keymap.PositionPacker``,
    order-preserving) into one sorted ``uint64`` array, looked up by bisection."""

    def __init__(self, ledger_ids: npt.NDArray[np.int64], entry_ids: npt.NDArray[np.int64],
                 batch_indexes: npt.NDArray[np.int64]) -> None:
        self._packer = PositionPacker()
        packed = self._packer.pack_many(ledger_ids.astype(np.uint64), entry_ids.astype(np.uint64), batch_indexes)
        self._sorted = np.sort(packed)

    def __contains__(self, slot: object) -> bool:
        if not isinstance(slot, tuple) or len(slot) != 3:
            return False
        try:
            packed = self._packer.pack_known(Position(*slot))
        except KeyMapLimitError:  # no retained position is out of the packer's range
            return False
        if packed is None:  # a ledger no retained position lies in
            return False
        index = int(np.searchsorted(self._sorted, np.uint64(packed)))
        return index < len(self._sorted) and int(self._sorted[index]) == packed

    def __iter__(self) -> Iterator[Slot]:
        for packed in self._sorted.tolist():
            position = self._packer.unpack(int(packed))
            yield position.ledger_id, position.entry_id, position.batch_index

    def __len__(self) -> int:
        return len(self._sorted)


@dataclass(frozen=True, slots=True)
class RewriteJob:
    """What every group's task shares: where the ledgers are and how the run decides."""

    ledgers_root: str | None  # None: the bucket's ledgers alone (``rows.open_store``)
    metadata: dict[str, str]
    created_at_ms: int
    retain_null_key: bool
    keep_tombstones_since_ms: int | None
    bucket: BucketConfig | None = None  # where the input is read and the output written, if given


def rewrite_group(job: RewriteJob, spec: GroupSpec, decisions: Any) -> GroupReport:
    """Rewrite the group ``spec`` given its decision rows (a ``pyarrow.Table`` with the
    columns ``kind`` and ``seq``, a stream place of ``compactor.spark.index_scan``): write
    its sealed compacted ledger and report (see the module docstring)."""
    import pyarrow.compute as pc

    from compactor.spark import index_scan  # PyArrow, on the executor only

    def places(kind: int) -> npt.NDArray[np.int64]:
        chosen = decisions.filter(pc.equal(decisions.column("kind"), kind)).column("seq")
        return np.asarray(chosen.to_numpy(zero_copy_only=False), dtype=np.int64)

    group = index_scan.GroupDecisions(places(DECISION_RETAINED), places(DECISION_DROPPED_CHUNK))
    figures = [0] * len(FIGURES)
    columns = index_scan.PHASE_TWO_COLUMNS + (() if job.keep_tombstones_since_ms is None else ("publish_time",))

    def survivors() -> Iterator[CompactedEntry]:
        last = index_scan.LastIndex()
        for number, piece in enumerate(spec.pieces, spec.first_piece):
            index = index_scan.PieceIndex(job.ledgers_root, piece, columns, job.bucket, last)
            try:
                for at, figure in enumerate(index_scan.figures(index.rows)):
                    figures[at] += figure
                yield from index_scan.survivors(index, number, group, retain_null_key=job.retain_null_key,
                                                keep_tombstones_since_ms=job.keep_tombstones_since_ms)
            finally:
                index.close()

    counted = _Counted(survivors(), spec.index)
    written = _write(job, spec.ledger_id, counted.encoded())
    _fault_point(spec.index, "written")
    entries_read, messages_read, bytes_read, markers, opaque_entries = figures
    return GroupReport(spec.index, RoundFigures(
        spec.ledger_id, written.entries, written.size_bytes, counted.messages, len(group), entries_read=entries_read,
        messages_read=messages_read, bytes_read=bytes_read, markers=markers, opaque_entries=opaque_entries))


def _write(job: RewriteJob, ledger_id: int, entries: Iterator[bytes]) -> SealedLedger:
    """Write the group's sealed ledger: into the ledger directory, or, with a bucket, to a
    local scratch directory first, then uploaded as ``ledgers/<id>`` and read back for its
    size and CRC32C (``LedgerFiles.upload_sealed``: atomic, so the object is whole or absent)."""
    if job.bucket is None:
        assert job.ledgers_root is not None
        return write_sealed_ledger(job.ledgers_root, ledger_id, job.metadata, entries, created_at_ms=job.created_at_ms)
    from compactor.spark.rows import open_store

    with tempfile.TemporaryDirectory(prefix="compactd-rewrite-") as scratch:
        written = write_sealed_ledger(scratch, ledger_id, job.metadata, entries, created_at_ms=job.created_at_ms)
        store = open_store(scratch, job.bucket)
        try:
            store.upload_sealed(ledger_id)
        finally:
            store.shutdown()
    return written


class _Counted:
    """The survivors, encoded as compacted-ledger entries, counting their messages."""

    def __init__(self, survivors: Iterator[CompactedEntry], group: int) -> None:
        self.survivors = survivors
        self.group = group
        self.messages = 0

    def encoded(self) -> Iterator[bytes]:
        _fault_point(self.group, "writing")  # first pulled with the temporary file open
        for survivor in self.survivors:
            self.messages += survivor.messages
            yield encode_compacted_entry(survivor)


def _fault_point(group: int, point: str) -> None:
    """The test fault point of the module docstring; nothing unless ``FAULT_ENV`` is set."""
    setting = os.environ.get(FAULT_ENV)
    if not setting:
        return
    fault_group, attempts, fault = setting.split(":")
    if int(fault_group) != group or _attempt() >= int(attempts):
        return
    if fault == "hang" and point == "writing":
        time.sleep(FAULT_HANG_S)
    elif fault == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _attempt() -> int:
    """This task's attempt number (0 outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.attemptNumber())
