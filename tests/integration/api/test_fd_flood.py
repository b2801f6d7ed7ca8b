"""File descriptors under a connection flood (issue 25 point 6): ``compactd serve`` with
``RLIMIT_NOFILE`` at 256 (set in the child before it starts), flooded with idle
connections on both ports — more than the limit. Before issue 25 the admin API stopped
answering (asyncio accepted up to its backlog at once, until no descriptor was left, and
uvicorn kept connections that never send a request); now each listener is capped
(``api.fd_budget``), the broker's own descriptors stay free, the admin API answers during
the flood, and the descriptor count is back to its idle value once the clients leave.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.fd_budget import fd_budget
from tests.serve_process import PROCESS_TIMEOUT_S, READY, readline

pytestmark = pytest.mark.integration

NOFILE = 256
FLOOD_PER_PORT = 300  # more than the whole limit, on each port
BOUND_S = 20.0
HEALTH_PATH = "/admin/v2/brokers/health"


# Sets the limit, then becomes ``compactd serve`` (no preexec_fn: the test process has threads).
WITH_LIMIT = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]),) * 2); "
              "os.execv(sys.argv[2], sys.argv[2:])")


@pytest.fixture
def limited_serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    executable = Path(sys.executable).with_name("compactd")
    if not executable.exists():
        pytest.skip("the compactd console script is not installed")
    with (tmp_path / "serve.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", WITH_LIMIT, str(NOFILE), str(executable), "serve", "--broker-port", "0",
             "--http-port", "0", "--data-dir", str(tmp_path / "data")],
            stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            match = READY.match(readline(process, PROCESS_TIMEOUT_S))
            assert match is not None, (tmp_path / "serve.log").read_text()
            ports = [int(url.rpartition(":")[2]) for url in match.groups()]
            yield process, ports[0], ports[1]
        finally:
            process.terminate()
            try:
                process.wait(PROCESS_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(PROCESS_TIMEOUT_S)
            assert process.stdout is not None
            process.stdout.close()


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _until(what: str, predicate: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + BOUND_S
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def _healthy(http_port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{http_port}{HEALTH_PATH}", timeout=2.0).text == "ok"
    except httpx.HTTPError:
        return False


def _flood(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        sockets.append(sock)
    return sockets


@pytest.mark.slow
def test_a_connection_flood_never_takes_the_brokers_own_descriptors_and_they_come_back(
        limited_serve: tuple[subprocess.Popen[str], int, int]) -> None:
    process, broker_port, http_port = limited_serve
    assert _until("the admin API never answered", lambda: _healthy(http_port))
    idle = _descriptors(process.pid)
    flood = _flood(broker_port, FLOOD_PER_PORT) + _flood(http_port, FLOOD_PER_PORT)
    try:
        peak = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the flood is taken in, up to the caps
            peak = max(peak, _descriptors(process.pid))
            time.sleep(0.05)
        started = time.monotonic()
        for _ in range(3):  # answered during the flood, each time
            assert _until("the admin API stopped answering during the flood", lambda: _healthy(http_port))
        assert time.monotonic() - started < 6.0
        assert peak < NOFILE - 16, f"the flood took {peak} of {NOFILE} descriptors"
        assert process.poll() is None
    finally:
        for sock in flood:
            sock.close()
    _until(f"the descriptors did not come back to {idle}", lambda: _descriptors(process.pid) <= idle)


def test_the_ledger_file_cache_and_the_connections_share_what_the_limit_leaves() -> None:
    small = fd_budget(max_open_ledger_files=256, limit=256)
    assert small.ledger_files < 256 and small.ledger_files + small.pulsar_connections + small.http_connections < 256
    large = fd_budget(max_open_ledger_files=256, limit=1 << 20)
    assert large.ledger_files == 256  # the setting bounds it where the limit does not
    tiny = fd_budget(max_open_ledger_files=256, limit=16)
    assert tiny.ledger_files >= 1 and tiny.pulsar_connections >= 1 and tiny.http_connections >= 1
