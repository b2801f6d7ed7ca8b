"""Ledger append throughput: appends/s and MB/s for 100 B and 10 KB entries.

Run: ``.venv/bin/python bench/ledger_append.py [--runs 3] [--seconds 2] [--dir /tmp]``

For each entry size and sync policy (group commit and none; ``always`` as the
one-fsync-per-append baseline, measured in the same run) it appends to a fresh
``FileLedgerStore`` for about ``--seconds`` with at most ``--in-flight`` unresolved appends
(as a producer with a pending-message queue would), waits until every append is durable,
and prints the median over ``--runs`` runs. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ledger.storage import FileLedgerStore, SyncPolicy


def one_run(root: str, size: int, policy: SyncPolicy, seconds: float, in_flight_max: int) -> tuple[float, float]:
    """(appends per second, MB per second) of one timed run."""
    store = FileLedgerStore(root, sync=policy)
    ledger_id = store.create({"component": "bench"})
    payload = os.urandom(size)
    pending: collections.deque[Future[int]] = collections.deque()
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(100):
            pending.append(store.append(ledger_id, payload))
            count += 1
            while len(pending) > in_flight_max:
                pending.popleft().result()
    while pending:
        pending.popleft().result()
    elapsed = time.perf_counter() - start
    store.shutdown()
    return count / elapsed, count * size / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="where the ledger files go (default: a temp dir)")
    args = parser.parse_args()
    print(f"{'entry':>7} {'sync':>6} {'appends/s':>12} {'MB/s':>9}   (median of {args.runs} runs)")
    for size in (100, 10_000):
        for policy in (SyncPolicy.GROUP, SyncPolicy.NONE, SyncPolicy.ALWAYS):
            rates, throughputs = [], []
            for _ in range(args.runs):
                root = tempfile.mkdtemp(prefix="bench-ledger-", dir=args.dir)
                try:
                    rate, throughput = one_run(root, size, policy, args.seconds, args.in_flight)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                rates.append(rate)
                throughputs.append(throughput)
            print(f"{size:>6}B {policy.value:>6} {statistics.median(rates):>12,.0f} "
                  f"{statistics.median(throughputs):>9.1f}")


if __name__ == "__main__":
    main()
