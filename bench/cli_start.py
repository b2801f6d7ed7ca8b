"""How soon ``compactd admin …`` sends its request after it starts (issue 26, point 4).

Run: ``.venv/bin/python -m bench.cli_start [--runs 15] [--json]``

Each run starts the installed ``compactd`` console script as a user would
(``compactd admin --admin-url URL tenants list``) against a loopback HTTP listener of
this benchmark, which notes when the request's first bytes arrive and answers ``[]``.
The figure is the time from just before the process is spawned to that arrival: the
interpreter's start, the imports and the argument parsing, everything a user waits for
before the broker sees anything. Measured in the same run, as baselines: a bare
``python -c pass`` of the same interpreter (the floor no Python CLI beats) and
``compactd --help`` (the whole command tree: what ``admin`` loaded before its imports were
made lazy). Prints the medians and the budget (0.3 s); ``--json`` one JSON object. A
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BUDGET_S = 0.3  # issue 26: the request leaves within 0.3 s of the start
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n[]"


class Listener:
    """A loopback HTTP listener that records when each request's first bytes arrive."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.arrivals: list[float] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                data = connection.recv(65536)
                self.arrivals.append(time.perf_counter())
                while b"\r\n\r\n" not in data:
                    more = connection.recv(65536)
                    if not more:
                        break
                    data += more
                connection.sendall(ANSWER)

    def close(self) -> None:
        self.socket.close()


def _compactd() -> str:
    script = Path(sys.executable).with_name("compactd")
    if not script.exists():
        raise SystemExit("the compactd console script is not installed next to this interpreter")
    return str(script)


def _admin_request_s(listener: Listener) -> float:
    before = len(listener.arrivals)
    start = time.perf_counter()
    done = subprocess.run([_compactd(), "admin", "--admin-url", f"http://127.0.0.1:{listener.port}", "tenants", "list"],
                          capture_output=True, timeout=60, check=False)
    if done.returncode != 0 or len(listener.arrivals) != before + 1:
        raise SystemExit(f"compactd admin failed: {done.stderr.decode(errors='replace')}")
    return listener.arrivals[-1] - start


def _process_s(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, timeout=60, check=True)
    return time.perf_counter() - start


def measure(runs: int) -> dict[str, Any]:
    """Medians over ``runs`` of each figure (see the module docstring)."""
    listener = Listener()
    try:
        _admin_request_s(listener)  # warm the page cache once: every figure then starts warm
        _process_s([_compactd(), "--help"])
        admin = [_admin_request_s(listener) for _ in range(runs)]
    finally:
        listener.close()
    bare = [_process_s([sys.executable, "-c", "pass"]) for _ in range(runs)]
    whole_tree = [_process_s([_compactd(), "--help"]) for _ in range(runs)]
    median = statistics.median(admin)
    return {
        "runs": runs,
        "admin_request_s": round(median, 4),
        "admin_request_s_max": round(max(admin), 4),
        "python_pass_s": round(statistics.median(bare), 4),
        "whole_tree_help_s": round(statistics.median(whole_tree), 4),
        "budget_s": BUDGET_S,
        "within_budget": median <= BUDGET_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.runs)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"compactd admin sends its request {figures['admin_request_s'] * 1000:.0f} ms after it starts "
          f"(median of {args.runs}; max {figures['admin_request_s_max'] * 1000:.0f} ms; budget "
          f"{BUDGET_S * 1000:.0f} ms)")
    print(f"baselines: python -c pass {figures['python_pass_s'] * 1000:.0f} ms, "
          f"compactd --help (the whole tree) {figures['whole_tree_help_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
