"""Per-topic compaction record: what runs did, for stats, status and metrics.

Counts and timestamps follow Pulsar's ``CompactionRecord`` (removed events of the last run
and in total, successes, failures, last success and failure times, duration) plus what
Pulsar does not keep: bytes read and written, the compacted ledger's entries and size,
per-phase durations and the phase-one map's size. In memory; the REST issue persists the
status that must survive a restart.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["LATENCY_BUCKETS_MS", "CompactionRecord", "RoundFigures", "RunFigures", "latency_bucket"]

LATENCY_BUCKETS_MS = (0.5, 1, 5, 10, 20, 50, 100, 200, 1000)
"""Upper bounds of Pulsar's compaction append-latency buckets; one more counts overflow."""


def latency_bucket(latency_ms: float) -> int:
    """Index of the ``LATENCY_BUCKETS_MS`` bucket ``latency_ms`` falls in (len = overflow)."""
    return bisect.bisect_left(LATENCY_BUCKETS_MS, latency_ms)


@dataclass(frozen=True, slots=True)
class RoundFigures:
    """What one pass of phase two over a part of a run's stream read and wrote, whichever
    engine ran it: a local round (``compactor.local.worker.RoundReport``, or the broker's
    own round) or a Spark group (``compactor.spark.rewrite.GroupReport``). The one record
    of these facts; a run adds its rounds' up into its ``RunFigures``.

    Attributes:
        ledger_id: the compacted ledger the pass wrote.
        entries_written, bytes_written: its entries and entry bytes.
        messages_kept: the messages its entries deliver.
        keys_kept: live keys (young tombstones included): a local round's whole view's; a
            Spark group's, whose latest position lies in the group.
        entries_read, messages_read, bytes_read, markers, opaque_entries: phase one's
            figures of the pass's input (``compactor.local.algorithm.PhaseOneResult``'s).
    """

    ledger_id: int
    entries_written: int
    bytes_written: int
    messages_kept: int
    keys_kept: int
    entries_read: int
    messages_read: int
    bytes_read: int
    markers: int
    opaque_entries: int

    @property
    def removed_events(self) -> int:
        """Messages read that the pass did not keep."""
        return self.messages_read - self.messages_kept


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What one successful run measured.

    Attributes:
        ledger_id: the compacted ledger published, or -1 when nothing was compacted (an
            incremental run's view holds older ledgers too: this is its newest one, which
            holds the run's stop, written by the run or by its merge step).
        removed_events: messages read that the compacted ledger does not hold.
        entries_read, messages_read, bytes_read: phase one's input (an incremental run's:
            the backlog; the key indexes it reads to mark dead count in ``io_bytes``).
        entries_written, bytes_written: the compacted ledger's content.
        phase_one_s, phase_two_s, duration_s: wall-clock times.
        key_map_bytes: phase one's key map at its end (the local engine: the most it held
            at once, in any round; never more than the memory budget allows).
        append_latency_counts: appends to the compacted ledger per ``LATENCY_BUCKETS_MS``
            bucket (call to durable; the last counts overflow); () when nothing was written.
        engine: the engine that ran phase one (``local``, ``spark``); "" when nothing was
            compacted.
        horizon: the position the published view covers up to (the run's stop marker, held
            back by the minimum lag); the unchanged horizon when nothing was compacted.
        keys_kept: live keys after phase one (young tombstones included).
        throttled_s: time the run waited on its I/O throttle (``compactor.throttle``).
        io_bytes: bytes the run read and appended, as charged to its throttle.
        rounds: views the run published: more than one when the local engine's key map
            reached the memory budget (``compactor.local.rounds``); 0 when nothing was compacted.
        dead_marked: messages of the view's older ledgers this run marked dead instead of
            rewriting them (an incremental run, ``compactor.view.marks``); counted in
            ``removed_events`` too.
        merged_ledgers: ledgers of the view the run's merge step rewrote (dead-ratio and
            tiered merges, ``compactor.runs.merges``); their bytes are in ``bytes_written``.
    """

    ledger_id: int = -1
    removed_events: int = 0
    entries_read: int = 0
    messages_read: int = 0
    bytes_read: int = 0
    entries_written: int = 0
    bytes_written: int = 0
    phase_one_s: float = 0.0
    phase_two_s: float = 0.0
    duration_s: float = 0.0
    key_map_bytes: int = 0
    append_latency_counts: tuple[int, ...] = ()
    engine: str = ""
    horizon: str = ""
    keys_kept: int = 0
    throttled_s: float = 0.0
    io_bytes: int = 0
    rounds: int = 0
    dead_marked: int = 0
    merged_ledgers: int = 0


@dataclass(slots=True)
class CompactionRecord:
    """Running totals for one topic; ``*_ms`` times are ms since the epoch, 0 = never."""

    last_removed_events: int = 0
    total_removed_events: int = 0
    successes: int = 0
    failures: int = 0
    last_success_ms: int = 0
    last_failure_ms: int = 0
    last_duration_ms: int = 0
    total_duration_ms: int = 0
    last_error: str = ""
    last_throttled_ms: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    compacted_entries: int = 0
    compacted_size_bytes: int = 0
    last_run: RunFigures | None = None
    append_latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    """Appends per ``LATENCY_BUCKETS_MS`` bucket (not cumulative), the last for overflow."""

    def succeeded(self, figures: RunFigures, now_ms: int) -> None:
        """Fold a successful run in."""
        self.last_removed_events = figures.removed_events
        self.total_removed_events += figures.removed_events
        self.successes += 1
        self.last_success_ms = now_ms
        self.last_duration_ms = int(figures.duration_s * 1000)
        self.total_duration_ms += self.last_duration_ms
        self.last_throttled_ms = int(figures.throttled_s * 1000)
        for bucket, count in enumerate(figures.append_latency_counts):
            self.append_latency_counts[bucket] += count
        self.bytes_read += figures.bytes_read
        self.bytes_written += figures.bytes_written
        if figures.ledger_id != -1:
            self.compacted_entries = figures.entries_written
            self.compacted_size_bytes = figures.bytes_written
        self.last_run = figures

    def failed(self, error: BaseException, duration_s: float, now_ms: int) -> None:
        """Fold a failed run in."""
        self.failures += 1
        self.last_failure_ms = now_ms
        self.last_duration_ms = int(duration_s * 1000)
        self.total_duration_ms += self.last_duration_ms
        self.last_error = f"{type(error).__name__}: {error}"
