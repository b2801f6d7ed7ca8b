"""What a compaction run counts as it goes: progress per phase and the figures of its rounds.

``Counted`` reports a phase's progress (``Progress``: ``progress(phase, entries_done,
entries_total)``) as its reads hand out entries; ``took`` counts an append's latency in its
bucket; ``RoundTally`` adds up the figures of a local run's rounds (``RoundFigures``, one
record whichever way a round ran: ``add``; a worker's report: ``add_report``) into the
run's ``RunFigures``;
``RunIo`` is what one run carries besides its topic (its I/O throttle and its lag
cut-off). The runner (``compactor.runs.runner``) owns the run; this module only counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from compactor.local.worker import RoundReport
from compactor.record import LATENCY_BUCKETS_MS, RoundFigures, RunFigures, latency_bucket
from compactor.throttle import Throttle
from ledger.managed_ledger import Entry
from ledger.position import Position

__all__ = ["Counted", "Progress", "RoundTally", "RunIo", "no_progress", "took"]


def took(started: float, latencies: list[int], done: Future[int]) -> None:
    """Done-callback of an append: counts its latency. Callbacks of one store all run on
    one thread (its flusher, or the appending thread when appends complete at once)."""
    del done
    latencies[latency_bucket((time.monotonic() - started) * 1000)] += 1


Progress = Callable[[str, int, int], None]
"""``progress(phase, entries_done, entries_total)``; see ``Compactor.compact``."""


def no_progress(phase: str, done: int, total: int) -> None:
    del phase, done, total


class Counted:
    """Counts the entries a phase's reads hand out and reports them to ``progress``."""

    def __init__(self, phase: str, total: int, progress: Progress) -> None:
        self.phase, self.total, self.progress, self.done = phase, total, progress, 0

    def __call__(self, batch: list[Entry]) -> list[Entry]:
        self.done += len(batch)
        self.progress(self.phase, self.done, max(self.total, self.done))
        return batch

    def start(self) -> None:
        self.progress(self.phase, 0, self.total)

    def end(self) -> None:
        self.progress(self.phase, self.done, max(self.total, self.done))


_NO_ROUND = RoundFigures(-1, 0, 0, 0, 0, 0, 0, 0, 0, 0)
"""The figures before any round: nothing written (ledger -1), nothing read."""


@dataclass
class RoundTally:
    """The figures of a local run's rounds so far: the last round's (its view is the run's)
    and the sums of what every round read and removed."""

    count: int = 0
    phase_one_s: float = 0.0
    latencies: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    last: RoundFigures = _NO_ROUND
    removed_events: int = 0
    entries_read: int = 0
    messages_read: int = 0
    bytes_read: int = 0
    key_map_bytes: int = 0
    worker_throttled_s: float = 0.0
    worker_io_bytes: int = 0
    entries_written: int = 0  # every round's (an incremental run's rounds each add a ledger)
    bytes_written: int = 0
    incremental: bool = False  # the rounds' views keep the older ledgers: writes add up
    dead_marked: int = 0
    merged_ledgers: int = 0
    keys_live: int | None = None  # the view's live keys, when its marks count them
    newest_ledger_id: int | None = None  # the view's ledger holding the run's stop, after a merge

    def add(self, figures: RoundFigures, key_map_bytes_max: int) -> None:
        """Count a published round: ``figures`` its ``RoundFigures``, ``key_map_bytes_max``
        the most its key map held. Removed events add up exactly: what a round keeps, the
        next one reads again."""
        self.count += 1
        self.last = figures
        self.removed_events += figures.removed_events
        self.entries_written += figures.entries_written
        self.bytes_written += figures.bytes_written
        self.entries_read += figures.entries_read
        self.messages_read += figures.messages_read
        self.bytes_read += figures.bytes_read
        self.key_map_bytes = max(self.key_map_bytes, key_map_bytes_max)

    def add_report(self, report: RoundReport) -> None:
        """Count a published round that ran in a worker process (``add``), and what the
        worker measured: its phase one's time, its throttle and its appends."""
        self.add(report.figures, report.key_map_bytes_max)
        self.phase_one_s += report.phase_one_s
        self.worker_throttled_s += report.throttled_s
        self.worker_io_bytes += report.io_bytes
        self.latencies = [mine + theirs for mine, theirs in zip(self.latencies, report.append_latency_counts,
                                                                 strict=True)]

    def figures(self, started: float, stop: Position, run: RunIo) -> RunFigures:
        """The run's figures: the last round's view, every round's work."""
        duration_s = time.monotonic() - started
        written = (self.entries_written, self.bytes_written) if self.incremental else (
            self.last.entries_written, self.last.bytes_written)
        return RunFigures(
            engine="local", horizon=str(stop), keys_kept=self.last.keys_kept if self.keys_live is None else self.keys_live,
            throttled_s=run.throttle.throttled_s + self.worker_throttled_s,
            io_bytes=run.throttle.charged_bytes + self.worker_io_bytes, ledger_id=self.last.ledger_id if self.newest_ledger_id is None else self.newest_ledger_id, removed_events=self.removed_events + self.dead_marked,
            entries_read=self.entries_read, messages_read=self.messages_read, bytes_read=self.bytes_read,
            entries_written=written[0], bytes_written=written[1], phase_one_s=self.phase_one_s,
            phase_two_s=duration_s - self.phase_one_s, duration_s=duration_s, key_map_bytes=self.key_map_bytes,
            append_latency_counts=tuple(self.latencies) if any(self.latencies) else (), rounds=self.count,
            dead_marked=self.dead_marked, merged_ledgers=self.merged_ledgers,
        )


@dataclass(frozen=True, slots=True)
class RunIo:
    """What one run carries besides the topic: its throttle and its lag cut-off."""

    throttle: Throttle
    young_after_ms: int | None
