"""The two brokers ``bench.peer`` compares, as subprocesses, and what it reads of them.

Owns: starting ``compactd serve`` and ``pulsar-lite`` on a fresh data dir and timing them
to their ready signal, reading a broker's CPU time and peak RSS from ``/proc``, finding
the pulsar-lite executable, and the private network namespace the comparison runs in.

Ready signals: compactd prints ``compactd ready broker=... http=...`` on stdout;
pulsar-lite (0.2.0) logs ``Server listening on HOST:PORT`` (stderr, at ``--log-level
info``) once its Pulsar port accepts connections. pulsar-lite takes ``--addr HOST:PORT``
and ``--db-path PATH`` (a RocksDB store at ``PATH.rocksdb``), reads ``pulsar-lite.toml``
from its working directory if present (none here: its defaults), and has no fsync
setting: under strace, 500 synchronous sends to it made no fsync or fdatasync call (it
fsyncs only when it opens its store), so its acknowledged sends are not on disk yet. It also opens a Prometheus port on ``0.0.0.0:8080``: that is why everything runs
in a network namespace of its own with only loopback up (``isolate``).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO

__all__ = ["INSTALL_HINT", "Broker", "cpu_seconds", "find_pulsar_lite", "isolate", "peak_rss_bytes"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
PULSAR_LITE_VENV = "/tmp/pulsar-lite-venv"
INSTALL_HINT = (
    "pulsar-lite is installed into a virtual environment of its own, outside the repository "
    "(compactd's dependencies stay untouched):\n"
    f"    python3 -m venv {PULSAR_LITE_VENV}\n"
    f"    {PULSAR_LITE_VENV}/bin/pip install pulsar-lite==0.2.0\n"
    "then pass its executable with --pulsar-lite "
    f"({PULSAR_LITE_VENV}/lib/python3.*/site-packages/pulsar_lite/bin/pulsar-lite; the wheel "
    "puts it there, not in bin/), or put it on PATH, or set PULSAR_LITE_BINARY."
)
_NETNS_MARK = "BENCH_PEER_NETNS"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def find_pulsar_lite() -> str | None:
    """The pulsar-lite executable: $PULSAR_LITE_BINARY, PATH, or the venv of INSTALL_HINT."""
    if (path := os.environ.get("PULSAR_LITE_BINARY")) and os.path.isfile(path):
        return path
    if path := shutil.which("pulsar-lite"):
        return path
    found = sorted(glob.glob(f"{PULSAR_LITE_VENV}/lib/python3*/site-packages/pulsar_lite/bin/pulsar-lite"))
    return found[-1] if found else None


# --- the network namespace --------------------------------------------------------------------


def isolate() -> None:
    """Re-execute this process under ``unshare -rn`` (a user and network namespace of its
    own) unless already there; inside, bring loopback up and check it is the only interface."""
    if os.environ.get(_NETNS_MARK) != "1":
        if shutil.which("unshare") is None:
            raise SystemExit("bench.peer needs unshare(1) (util-linux) to run in a private network namespace")
        os.environ[_NETNS_MARK] = "1"
        sys.stdout.flush()
        os.execvp("unshare", ["unshare", "-rn", sys.executable, "-m", "bench.peer", *sys.argv[1:]])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    names = sorted(name for _, name in socket.if_nameindex())
    if names != ["lo"]:
        raise SystemExit(f"expected only loopback in the private network namespace, found {names}")


# --- /proc ------------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (field 3 is index 0)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(_stat_fields(int(entry))[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError):
                continue
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid``, plus those of its live descendants and of its
    reaped children (cutime + cstime of /proc/PID/stat): a broker's whole tree.

    A process's own time is read from its CPU-time clock (``clock_gettime`` on the clock
    of the process ``pid``: every thread's time, ended threads included, in nanoseconds),
    not from /proc's utime + stime, which count in clock ticks (10 ms): a phase costs a
    broker about 0.1 s, so ticks alone made each figure ±10 %. Where that clock cannot be
    read, the ticks are used."""
    fields = _stat_fields(pid)
    try:
        seconds = time.clock_gettime(_process_cpu_clock(pid))
    except OSError:
        seconds = sum(int(value) for value in fields[11:13]) / _CLOCK_TICKS
    seconds += sum(int(value) for value in fields[13:15]) / _CLOCK_TICKS
    for child in _children(pid):
        try:
            seconds += cpu_seconds(child)
        except OSError:
            continue  # it ended between the listing and the read
    return seconds


def _process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (Linux's ``MAKE_PROCESS_CPUCLOCK(pid,
    CPUCLOCK_SCHED)``, what ``clock_getcpuclockid(3)`` answers)."""
    return ((~pid) << 3) | 2


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set (VmHWM of /proc/PID/status) of the broker process itself."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmHWM in /proc/{pid}/status")


# --- the brokers ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Broker:
    """One broker subprocess on ``data_dir``; ``url`` once ready, ``ready_s`` from the spawn
    to its ready signal. ``kind`` is ``compactd`` or ``pulsar-lite``."""

    def __init__(self, kind: str, data_dir: str, *, fsync: str | None, pulsar_lite: str) -> None:
        self.kind = kind
        self._tail: deque[str] = deque(maxlen=20)
        self._ready = threading.Event()
        self._seen = False
        self.url = ""
        os.makedirs(data_dir, exist_ok=True)
        if kind == "compactd":
            command = [os.path.join(os.path.dirname(sys.executable), "compactd"), "serve", "--broker-port", "0",
                       "--http-port", "0", "--data-dir", data_dir]
            command += [] if fsync is None else ["--fsync", fsync]
            marker = "compactd ready broker="
        else:
            port = _free_port()
            command = [pulsar_lite, "--addr", f"127.0.0.1:{port}", "--db-path", os.path.join(data_dir, "db"),
                       "--log-level", "info"]
            self.url = f"pulsar://127.0.0.1:{port}"
            marker = "Server listening on"
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        cwd=data_dir)
        assert self.process.stdout is not None
        threading.Thread(target=self._drain, args=(self.process.stdout, marker), daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S) or not self._seen:
            self.process.kill()
            raise SystemExit(f"{kind} did not get ready: {' | '.join(self._tail)}")
        self.ready_s = time.perf_counter() - started
        self.pid = self.process.pid

    def _drain(self, stream: IO[str], marker: str) -> None:
        """Read the broker's output to its end (a full pipe would stall it); set ready at the marker."""
        for line in stream:
            self._tail.append(line.rstrip())
            if not self._ready.is_set() and marker in line:
                if self.kind == "compactd":
                    self.url = line.split()[2].removeprefix("broker=")
                self._seen = True
                self._ready.set()
        self._ready.set()  # it ended: the waiter sees poll() is not None

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
