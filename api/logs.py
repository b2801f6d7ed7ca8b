"""The process's log output: readable lines or JSON lines on stderr, at a chosen level.

``configure_logging(log_format, log_level)`` (``compactd serve`` calls it once its settings
are read: ``--log-format``, ``--log-level``) sends every logger's records to one stderr
handler. ``text`` writes ``TIME LEVEL LOGGER: MESSAGE``; ``json`` writes one JSON object a
line (``JsonFormatter``): ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
every ``extra`` field the record carries (a compaction run's ``topic``, ``engine``,
``entries_read`` … — ``compactor.run_log`` — and a lifecycle event's ``event``), and
``exception`` with the traceback text only for an unexpected error. stdout is left alone:
it carries the ready line.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging"]

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


def configure_logging(log_format: str, log_level: str) -> None:
    """Send every record at ``log_level`` or above to stderr, formatted as ``log_format``
    (``text`` or ``json``); replaces what was configured before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=log_level.upper(), handlers=[handler], force=True)
