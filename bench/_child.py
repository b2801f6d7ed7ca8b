"""Measuring in child processes, shared by the benchmarks that compare configurations.

Each configuration runs in a fresh interpreter (``spawn``), so one configuration's heap
and imports never count in another's. Peak RSS is ``VmHWM`` from ``/proc/PID/status``,
not ``ru_maxrss``, which Linux carries over from the parent through fork and exec (a
child would report at least the parent's peak).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["current_rss_bytes", "peak_rss_bytes", "spawn"]


def busy_cpu_s() -> float:
    """CPU seconds this machine's cores have been busy since boot (``/proc/stat``: user,
    nice, system, irq and softirq; guest time is inside user, steal is not ours): the
    difference over a run, divided by its wall time, is how many cores it kept busy (on a
    machine running nothing else)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks[0:3]) + sum(ticks[5:7])) / os.sysconf("SC_CLK_TCK")


def peak_rss_bytes(pid: int | str = "self") -> int:
    """Peak RSS (``VmHWM``) of process ``pid``; 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def current_rss_bytes() -> int:
    """This process's resident set now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def spawn(script: str, kind: str, spec: dict[str, Any], *, env: Mapping[str, str] | None = None,
          quiet: bool = False) -> dict[str, Any]:
    """Run ``script --child kind SPEC`` in a fresh interpreter; its answer is the JSON on
    the last line it prints. ``quiet`` drops the child's stderr."""
    completed = subprocess.run(
        [sys.executable, os.path.abspath(script), "--child", kind, json.dumps(spec)],
        check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if quiet else None, text=True,
        env=None if env is None else dict(env),
    )
    answer: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return answer
