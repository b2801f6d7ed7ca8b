"""The ``compactd`` console script as a user runs it."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

COMPACTD = [sys.executable, "-c", "from api.cli import main; main()"]


def test_help_lists_serve() -> None:
    result = subprocess.run([*COMPACTD, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    assert "serve" in result.stdout


def _start(data_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*COMPACTD, "serve", "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_line(process: subprocess.Popen[str], timeout_s: float = 30) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    assert ready, "serve printed nothing"
    return process.stdout.readline()


def test_serve_holds_the_data_dir_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    with _start(tmp_path / "data") as first:
        _serve_then_signal(first, tmp_path)
    assert (tmp_path / "data" / "metadata.db").exists()
    with _start(tmp_path / "data") as third:  # the lock was released
        try:
            assert "storage open" in _first_line(third)
            third.send_signal(signal.SIGINT)
            assert third.wait(timeout=30) == 0
        finally:
            if third.poll() is None:
                third.kill()


def _serve_then_signal(first: subprocess.Popen[str], tmp_path: Path) -> None:
    try:
        assert "storage open" in _first_line(first)
        second = subprocess.run([*COMPACTD, "serve", "--data-dir", str(tmp_path / "data")],
                                capture_output=True, text=True, timeout=60, check=False)
        assert second.returncode == 1
        assert "in use by another compactd process" in second.stderr
        assert "Traceback" not in second.stderr
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()


def test_serve_reads_data_dir_from_the_environment(tmp_path: Path) -> None:
    env = {**os.environ, "COMPACTD_DATA_DIR": str(tmp_path / "from-env")}
    with subprocess.Popen([*COMPACTD, "serve"], stdout=subprocess.PIPE, text=True, env=env) as process:
        _check_env_data_dir(process, tmp_path)


def _check_env_data_dir(process: subprocess.Popen[str], tmp_path: Path) -> None:
    try:
        assert str(tmp_path / "from-env") in _first_line(process)
        deadline = time.monotonic() + 30
        while not (tmp_path / "from-env" / "LOCK").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
