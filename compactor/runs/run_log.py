"""The log lines of compaction runs: one readable line per run, with its figures as fields.

Each finished run logs one INFO line on the ``compactor.run`` logger, e.g.::

    compaction of persistent://public/default/t: local engine, 1200 entries read,
    40 keys kept, 1160 removed, 96000 bytes in, 3200 bytes out, 0.412 s (throttled 0.100 s)

(one line), and each failed run one WARNING line naming the error, never a traceback: a
run that fails on bad data or storage is an expected outcome, recorded in its status. Both
carry the same facts as ``extra`` fields on the record (``event`` = ``compaction`` or
``compaction-failed``, then ``topic``, ``engine``, ``entries_read``, ``keys_kept``,
``removed``, ``bytes_in``, ``bytes_out``, ``duration_s``, ``throttled_s``, ``io_bytes``,
``horizon``, ``rounds``),
which a structured formatter (``compactd serve --log-format json``) writes as fields.
"""

from __future__ import annotations

import logging
from typing import Any

from compactor.record import RunFigures

__all__ = ["LOGGER", "log_run", "log_run_failed", "run_fields"]

LOGGER = "compactor.run"
log = logging.getLogger(LOGGER)


def run_fields(topic: str, figures: RunFigures) -> dict[str, Any]:
    """The facts of a successful run, by field name."""
    return {
        "event": "compaction",
        "topic": topic,
        "engine": figures.engine or "none",
        "entries_read": figures.entries_read,
        "keys_kept": figures.keys_kept,
        "removed": figures.removed_events,
        "bytes_in": figures.bytes_read,
        "bytes_out": figures.bytes_written,
        "duration_s": round(figures.duration_s, 6),
        "throttled_s": round(figures.throttled_s, 6),
        "io_bytes": figures.io_bytes,
        "horizon": figures.horizon,
        "rounds": figures.rounds,
    }


def log_run(topic: str, figures: RunFigures) -> None:
    """Log one line for a successful run of ``topic``."""
    fields = run_fields(topic, figures)
    if figures.ledger_id == -1:  # nothing after the horizon (or all too young): no engine ran
        log.info("compaction of %s: nothing new to compact after the horizon %s, the compacted view stands, "
                 "%d entries read, %.3f s", topic, figures.horizon, fields["entries_read"], figures.duration_s,
                 extra=fields)
        return
    log.info(
        "compaction of %s: %s engine, %d entries read, %d keys kept, %d removed, %d bytes in, "
        "%d bytes out, %.3f s (throttled %.3f s)",
        topic, fields["engine"], fields["entries_read"], fields["keys_kept"], fields["removed"],
        fields["bytes_in"], fields["bytes_out"], figures.duration_s, figures.throttled_s, extra=fields,
    )


def log_run_failed(topic: str, error: BaseException, duration_s: float) -> None:
    """Log one line for a failed run of ``topic`` (no traceback: the status has the error)."""
    log.warning("compaction of %s failed after %.3f s: %s: %s", topic, duration_s, type(error).__name__, error,
                extra={"event": "compaction-failed", "topic": topic, "duration_s": round(duration_s, 6),
                       "error": f"{type(error).__name__}: {error}"})
