"""``api.logs``: the JSON formatter and ``configure_logging`` (the real ``compactd serve``
output is checked end to end in ``tests/integration/api/test_compaction_ops_e2e.py``)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from api.logs import JsonFormatter, StderrHandler, logging_to_stderr
from compactor.record import RunFigures
from compactor.runs.run_log import log_run


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("compactor.run", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_record_is_one_json_line_with_its_extra_fields() -> None:
    line = JsonFormatter().format(_record("compaction of %s", "t", topic="t", entries_read=3, path=object()))
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["message"] == "compaction of t" and fields["level"] == "INFO" and fields["logger"] == "compactor.run"
    assert fields["topic"] == "t" and fields["entries_read"] == 3
    assert fields["path"].startswith("<object")  # what JSON cannot hold is written as text
    assert fields["time"].endswith("+00:00")
    assert "args" not in fields and "msg" not in fields and "exception" not in fields


def test_an_unexpected_error_carries_its_traceback_in_one_field() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    fields = json.loads(JsonFormatter().format(record))
    assert fields["message"] == "failed"
    assert "Traceback" in fields["exception"] and "RuntimeError: boom" in fields["exception"]


def test_the_run_line_carries_the_figures(caplog: pytest.LogCaptureFixture) -> None:
    figures = RunFigures(ledger_id=4, removed_events=7, entries_read=10, bytes_read=1000, bytes_written=300,
                         duration_s=0.5, engine="local", keys_kept=3, throttled_s=0.25, io_bytes=2300, horizon="3:9")
    with caplog.at_level(logging.INFO, logger="compactor.run"):
        log_run("persistent://public/default/t", figures)
    [record] = caplog.records
    assert record.getMessage() == (
        "compaction of persistent://public/default/t: local engine, 10 entries read, 3 keys kept, 7 removed, "
        "1000 bytes in, 300 bytes out, 0.500 s (throttled 0.250 s)")
    fields = json.loads(JsonFormatter().format(record))
    assert {key: fields[key] for key in ("event", "engine", "keys_kept", "removed", "bytes_in", "bytes_out",
                                         "throttled_s", "io_bytes", "horizon")} == {
        "event": "compaction", "engine": "local", "keys_kept": 3, "removed": 7, "bytes_in": 1000,
        "bytes_out": 300, "throttled_s": 0.25, "io_bytes": 2300, "horizon": "3:9"}


def test_a_run_with_nothing_new_says_the_view_stands_and_names_no_engine(caplog: pytest.LogCaptureFixture) -> None:
    figures = RunFigures(ledger_id=-1, duration_s=0.004, horizon="3:9")
    with caplog.at_level(logging.INFO, logger="compactor.run"):
        log_run("persistent://public/default/t", figures)
    [record] = caplog.records
    assert record.getMessage() == (
        "compaction of persistent://public/default/t: nothing new to compact after the horizon 3:9, "
        "the compacted view stands, 0 entries read, 0.004 s")
    assert "engine," not in record.getMessage()


def test_logging_to_stderr_sets_level_and_format_then_puts_back_what_was_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    before = root.handlers[:], root.level
    with logging_to_stderr("text", "debug"), logging_to_stderr("json", "warning"):
        assert sum(isinstance(handler, StderrHandler) for handler in root.handlers) == 1
        logging.getLogger("some.module").info("not written")
        logging.getLogger("some.module").warning("written %d", 1, extra={"event": "e"})
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["written 1"]
    assert json.loads(lines[0])["event"] == "e"
    assert (root.handlers, root.level) == before  # pytest's own handlers were never touched
