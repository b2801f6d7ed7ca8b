"""The I/O throttle of a compaction run (Kafka's ``log.cleaner.io.max.bytes.per.second``).

A ``Throttle`` is a token bucket that starts empty and never holds more than
``burst_bytes``: every read batch and every append of a run is charged to it
(``charge(n)``), and a charge waits until the bucket has paid for it at
``bytes_per_second``. So a run that moves N bytes in all takes at least
``(N - burst_bytes) / bytes_per_second`` seconds; the default burst of 0 makes that
``N / bytes_per_second``. A limit of 0 means unlimited: nothing waits, nothing is counted
as throttled.

The throttle is the run's own (``compactor.runs.runner`` makes one per run from the run's
``max_bytes_per_second``), so two runs at once each get the limit. It is the only owner
of the time a run spent waiting (``throttled_s``), which the run reports in its figures.
Time and waiting come from the ``clock`` and ``sleep`` given (``time.monotonic`` and
``time.sleep`` by default): tests pass a fake pair. With an ``interrupt`` event, a wait
ends as soon as it is set (the broker stops: ``Compactor.interrupt``), and that charge,
and every later one that would wait, raises ``CompactionInterruptedError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from compactor.errors import CompactionInterruptedError

__all__ = ["Throttle"]


class Throttle:
    """A token bucket of ``bytes_per_second`` (0 = unlimited); see the module docstring.

    Safe to charge from several threads (phase one's reads and phase two's appends run on
    different ones): each charge books its own slot of the bucket's time under a lock and
    waits outside it.
    """

    def __init__(
        self, bytes_per_second: int, *, burst_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] | None = None,
        interrupt: threading.Event | None = None,
    ) -> None:
        if bytes_per_second < 0 or burst_bytes < 0:
            raise ValueError(f"a throttle needs a rate and burst >= 0, not {bytes_per_second}, {burst_bytes}")
        self.bytes_per_second = bytes_per_second
        self.burst_s = burst_bytes / bytes_per_second if bytes_per_second else 0.0
        self._clock = clock
        self._interrupt = interrupt
        self._sleep = sleep or (interrupt.wait if interrupt is not None else time.sleep)
        self._lock = threading.Lock()
        self._paid_until = clock()  # the bucket starts empty: nothing is paid for yet
        self.charged_bytes = 0
        self.throttled_s = 0.0

    @property
    def limited(self) -> bool:
        return self.bytes_per_second > 0

    def charge(self, size: int) -> float:
        """Account ``size`` bytes of I/O, waiting as long as the limit asks; the seconds waited.

        ``CompactionInterruptedError`` when the interrupt is set before or during the wait.
        """
        if size <= 0:
            return 0.0
        with self._lock:
            self.charged_bytes += size
            if not self.limited:
                return 0.0
            now = self._clock()
            # Idle time refills the bucket, but never beyond its burst.
            start = max(self._paid_until, now - self.burst_s)
            self._paid_until = start + size / self.bytes_per_second
            wait_s = max(0.0, self._paid_until - now)
            self.throttled_s += wait_s
        if wait_s > 0:
            self._check_interrupt()
            self._sleep(wait_s)
            self._check_interrupt()
        return wait_s

    def _check_interrupt(self) -> None:
        if self._interrupt is not None and self._interrupt.is_set():
            raise CompactionInterruptedError("the broker is stopping: a throttled compaction run was interrupted")
