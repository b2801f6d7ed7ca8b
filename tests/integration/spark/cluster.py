"""A real Spark standalone cluster for the tests: one master and one worker on 127.0.0.1.

Both are started from the PySpark distribution (``bin/spark-class`` with the Master and
Worker classes, as ``sbin/start-master.sh`` and ``start-worker.sh`` do) on free ports.
Every wait is bounded; ``stop`` stops both (then kills them, if need be) whatever
happened, and their output goes to files, not pipes.

``hidden``: directories the worker — and so every executor and Python worker it starts —
must not see. The worker is then started in a private mount namespace (``unshare``) where
an empty, read-only ``tmpfs`` is mounted over each of them: the path exists there, holds
nothing, and takes no write, while the rest of the file system (the interpreter,
compactd's code, the worker's own directory) is the host's. ``private_mounts_available``
says whether this machine allows it (root, or unprivileged user namespaces).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import pytest

from tests.integration.spark.support import pyspark_home

START_TIMEOUT_S = 90  # a JVM starting on a loaded 2-core machine
STOP_TIMEOUT_S = 20
_HIDE = 'for d in "$@"; do [ "$d" = -- ] && break; mount -t tmpfs -o ro,size=64k compactd-hidden "$d" || exit 97; ' \
        'done; while [ "$1" != -- ]; do shift; done; shift; exec "$@"'


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def master_state(web_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=5) as response:
        state: dict[str, Any] = json.load(response)
        return state


def _unshare() -> list[str]:
    """The ``unshare`` command of a private mount namespace for this user."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private"]


def hiding(directories: Sequence[Path], command: Sequence[str]) -> list[str]:
    """``command`` run where ``directories`` are empty read-only mounts (module docstring)."""
    return [*_unshare(), "sh", "-c", _HIDE, "hide", *map(str, directories), "--", *command]


def private_mounts_available(probe: Path) -> bool:
    """Whether ``hiding`` works here: a file in ``probe`` is not seen through it."""
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "seen").write_text("x")
    try:
        result = subprocess.run(hiding([probe], ["test", "!", "-e", str(probe / "seen")]),
                                capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _wait_for(what: str, check: Any, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{what} not ready after {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


class Cluster:
    """The master and worker processes, and their log files (module docstring)."""

    def __init__(self, directory: Path, *, hidden: Sequence[Path] = ()) -> None:
        self.directory = directory
        self.hidden = tuple(hidden)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.port, self.web_port = free_port(), free_port()
        self.env = {**os.environ, "SPARK_HOME": pyspark_home(), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_LOG_DIR": str(directory), "PYSPARK_PYTHON": sys.executable}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, arguments: list[str], hidden: Sequence[Path] = ()) -> tuple[
            subprocess.Popen[bytes], Path]:
        log_path = self.directory / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        command = [os.path.join(pyspark_home(), "bin", "spark-class"), *arguments]
        if hidden:
            command = hiding(hidden, command)
        process = subprocess.Popen(command, env=self.env, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process, log_path

    def start(self) -> None:
        master, master_log = self._start("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.web_port)])
        _wait_for("the master", lambda: master_state(self.web_port)["status"] == "ALIVE", master, master_log)
        worker, worker_log = self._start("worker", [
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port", str(free_port()),
            "--cores", "2", "--memory", "1g", "--work-dir", str(self.directory / "work"), self.url], self.hidden)
        _wait_for("the worker", lambda: master_state(self.web_port)["aliveworkers"] >= 1, worker, worker_log)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_TIMEOUT_S)
        for log in self.logs:
            log.close()
