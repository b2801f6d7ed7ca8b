"""The end-to-end tests' process helper (``tests.serve_process``) cleans up after a start
that fails: on a starved machine a subprocess may not print its ready line within the
bound; the test then fails, and the process is reaped and its pipe and log are closed
(a leak would be a ResourceWarning, an error under ``filterwarnings = error``, in some
later test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import serve_process
from tests.serve_process import ServeProcess, readline


def _open_paths() -> set[str]:
    """The paths this process has open."""
    paths = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own fd)
            pass
    return paths


def _python(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_readline_reads_one_line_at_a_time_then_eof() -> None:
    process = _python("print('one'); print('two')")
    try:
        assert readline(process, 30) == "one\n"
        assert readline(process, 30) == "two\n"
        assert readline(process, 30) == ""
        assert process.wait(30) == 0
    finally:
        assert process.stdout is not None
        process.stdout.close()


def test_readline_without_a_line_in_time_fails_and_reaps_the_process() -> None:
    process = _python("import time; time.sleep(60)")
    with pytest.raises(pytest.fail.Exception, match="no line from the subprocess within 0.2 s"):
        readline(process, 0.2)
    assert process.returncode is not None  # killed and waited for: no zombie, no ResourceWarning
    assert process.stdout is not None and process.stdout.closed


def test_a_serve_that_is_not_ready_in_time_is_reaped_and_its_log_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[Any]] = []

    class Recorded(subprocess.Popen):  # type: ignore[type-arg]  # observes; the real process runs
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(serve_process.subprocess, "Popen", Recorded)
    log_path = tmp_path / "serve.log"
    with pytest.raises(pytest.fail.Exception, match="no line from the subprocess"):
        ServeProcess(tmp_path / "data", log_path, ready_timeout_s=0.001)  # no interpreter starts that fast
    [process] = started
    assert process.returncode is not None
    assert process.stdout is not None and process.stdout.closed
    assert str(log_path) not in _open_paths()
