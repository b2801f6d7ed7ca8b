"""The process's log output: readable lines or JSON lines on stderr, at a chosen level.

Every record goes to one ``StderrHandler`` on the root logger (stdout is left alone: it
carries the ready line). ``configure_logging(log_format, log_level)`` installs it for the
whole process (the console script does, at ``text``/``info``, before any command runs);
``logging_to_stderr`` installs it for the time a block runs and puts back what was there
(``api.server.run`` does, with ``--log-format`` and ``--log-level``, so that a broker run
in a test's process leaves that process's logging as it found it). Either replaces only
the ``StderrHandler`` already installed, never a handler someone else added.

``text`` writes ``TIME LEVEL LOGGER: MESSAGE``; ``json`` writes one JSON object a line
(``JsonFormatter``): ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, every
``extra`` field the record carries (a compaction run's ``topic``, ``engine``,
``entries_read`` … — ``compactor.runs.run_log`` — and a lifecycle event's ``event``), and
``exception`` with the traceback text only for an unexpected error.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["TEXT_FORMAT", "JsonFormatter", "StderrHandler", "configure_logging", "logging_to_stderr"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What every LogRecord has; anything else on a record came as ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object a record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in fields:
                fields[key] = value
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json.dumps(fields, default=str, ensure_ascii=False)


class StderrHandler(logging.StreamHandler[TextIO]):
    """Writes each record to ``sys.stderr`` as it is at that moment, as ``log_format`` says."""

    def __init__(self, log_format: str) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # a test runner may have swapped it since
        super().emit(record)


def configure_logging(log_format: str, log_level: str) -> None:
    """Send every record at ``log_level`` or above to stderr as ``log_format`` (``text`` or
    ``json``), replacing the ``StderrHandler`` installed before, if any."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        if isinstance(handler, StderrHandler):
            root.removeHandler(handler)
    root.addHandler(StderrHandler(log_format))
    root.setLevel(log_level.upper())


@contextlib.contextmanager
def logging_to_stderr(log_format: str, log_level: str) -> Iterator[None]:
    """``configure_logging`` for the time the block runs; then what was there before."""
    root = logging.getLogger()
    saved = [handler for handler in root.handlers if isinstance(handler, StderrHandler)]
    level = root.level
    configure_logging(log_format, log_level)
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if isinstance(handler, StderrHandler):
                root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
        root.setLevel(level)
