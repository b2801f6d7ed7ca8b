"""``compactd serve`` as a real process, for the end-to-end tests.

``ServeProcess`` starts the installed console script on a data dir with both ports picked
by the system, reads the URLs from its ready line (within a bound; a server that does not
announce itself fails the test with its log), and stops it with SIGTERM (``terminate``:
the exit code) or SIGKILL (``kill``). Either way its stdout pipe and its log are closed,
so no test leaks a file (pytest runs with warnings as errors) — also when it does not
start in time (a starved machine): the process is killed and reaped, its pipe and log closed.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

__all__ = ["PROCESS_TIMEOUT_S", "ServeProcess", "readline"]

PROCESS_TIMEOUT_S = 60.0  # a subprocess reaching its next step
READY = re.compile(r"compactd ready broker=(pulsar://\S+) http=(http://\S+)")


def readline(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The next stdout line of ``process`` within ``timeout_s`` ("" at EOF); when none
    comes, kills and reaps the process, closes its stdout and fails the test.

    The line is read from the pipe a byte at a time as it becomes readable (nothing past
    it is taken, and nothing is left blocked on the pipe after a timeout: no thread reads
    it, so closing it never waits)."""
    stdout = process.stdout
    assert stdout is not None
    deadline = time.monotonic() + timeout_s
    line = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(stdout.fileno(), selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not selector.select(remaining_s):
                _reap(process)
                pytest.fail(f"no line from the subprocess within {timeout_s} s")
            byte = os.read(stdout.fileno(), 1)
            if not byte:  # EOF
                break
            line += byte
    return line.decode(stdout.encoding or "utf-8", errors="replace")


def _reap(process: subprocess.Popen[str]) -> None:
    """SIGKILL ``process``, wait for it, close its stdout."""
    if process.poll() is None:
        process.kill()
        process.wait(PROCESS_TIMEOUT_S)
    if process.stdout is not None:
        process.stdout.close()


class ServeProcess:
    """One ``compactd serve`` process on ``data_dir``; extra ``flags`` are passed through;
    its ready line is waited for ``ready_timeout_s``."""

    def __init__(self, data_dir: Path, log_path: Path, *flags: str, ready_timeout_s: float = PROCESS_TIMEOUT_S) -> None:
        executable = Path(sys.executable).with_name("compactd")
        if not executable.exists():
            pytest.skip("the compactd console script is not installed")
        self.log_path = log_path
        self.log = log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                [str(executable), "serve", "--broker-port", "0", "--http-port", "0", "--data-dir", str(data_dir),
                 *flags],
                stdout=subprocess.PIPE, stderr=self.log, text=True,
            )
        except BaseException:
            self.log.close()
            raise
        try:
            line = readline(self.process, ready_timeout_s)
        except BaseException:  # not started in time (the test fails): reaped, pipe and log closed
            self.kill()
            raise
        match = READY.match(line)
        if match is None:
            self.kill()
            pytest.fail(f"compactd serve did not start: {line!r}\n{log_path.read_text()}")
        self.broker_url, self.http_url = match.group(1), match.group(2)
        self.ready_line = line  # the TLS URLs follow when the TLS ports are open (issue 15)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> int:
        """SIGTERM, then wait: the exit code (SIGKILL if it does not stop in time)."""
        if self.running:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(PROCESS_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(PROCESS_TIMEOUT_S)
        self._close()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL (as ``kill -9``), then wait."""
        if self.running:
            self.process.kill()
            self.process.wait(PROCESS_TIMEOUT_S)
        self._close()

    def _close(self) -> None:
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()
