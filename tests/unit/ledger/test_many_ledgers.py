"""Ledger file descriptors are bounded: 10,000 topics work under a 1,024-descriptor limit.

The managed ledgers run in a child process whose descriptor limit is lowered with
``setrlimit`` (the real limit, enforced by the kernel): every ledger file beyond
``max_open_files`` is closed while idle and reopened on its next use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOPICS = 10_000
DESCRIPTOR_LIMIT = 1024

CHILD = r"""
import os, resource, sys
from ledger.managed_ledger import ManagedLedger
from ledger.metadata import MetadataStore
from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage.file import MAX_OPEN_FILES_DEFAULT

root, topics, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
baseline = len(os.listdir("/proc/self/fd"))
peak = 0

def check_descriptors():
    global peak
    count = len(os.listdir("/proc/self/fd"))
    peak = max(peak, count)
    # ledger files stay within their bound; a few more for SQLite, the directory, a sequence file
    assert count <= baseline + MAX_OPEN_FILES_DEFAULT + 8, count

def name(i):
    return f"persistent://public/default/topic-{i}"

def open_all(store, metadata, indexes):
    ledgers = {}
    for i in indexes:
        ledgers[i] = ManagedLedger.open(name(i), store, metadata)
        if i % 500 == 0:
            check_descriptors()
    return ledgers

def append_all(ledgers, round_):
    futures = [(i, ml.append(b"topic %d round %d" % (i, round_))) for i, ml in ledgers.items()]
    for i, future in futures:
        future.result(timeout=60)
    check_descriptors()

def read_all(ledgers, rounds):
    for i, ml in ledgers.items():
        data = [entry.data for entry in ml.read_entries(ml.first_position(), 100)]
        assert data == [b"topic %d round %d" % (i, r) for r in range(rounds)], (i, data)
    check_descriptors()

metadata = MetadataStore(os.path.join(root, "metadata.db"))
store = FileLedgerStore(os.path.join(root, "ledgers"), sync=SyncPolicy.GROUP)
ledgers = open_all(store, metadata, range(topics))
append_all(ledgers, 0)
read_all(ledgers, 1)
reopened = range(0, topics, 10)  # close and reopen some: each seals its ledger, opens another
for i in reopened:
    ledgers[i].close()
ledgers.update(open_all(store, metadata, reopened))
append_all(ledgers, 1)
read_all(ledgers, 2)
store.shutdown()  # a restart: every ledger is loaded (scanned) again on first use
store = FileLedgerStore(os.path.join(root, "ledgers"), sync=SyncPolicy.GROUP)
ledgers = open_all(store, metadata, range(0, topics, 7))
read_all(ledgers, 2)
append_all(ledgers, 2)
read_all(ledgers, 3)
store.shutdown()
metadata.close()
print("peak descriptors", peak, "baseline", baseline)
"""


def run_under_the_limit(child: str, tmp_path: Path) -> None:
    """Run ``child`` (argv: the directory, TOPICS, DESCRIPTOR_LIMIT) in a fresh interpreter;
    it must exit 0 and report its peak descriptors."""
    result = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path), str(TOPICS), str(DESCRIPTOR_LIMIT)],
        capture_output=True, text=True, timeout=280, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "peak descriptors" in result.stdout


@pytest.mark.slow
def test_ten_thousand_managed_ledgers_work_under_a_limit_of_1024_descriptors(tmp_path: Path) -> None:
    run_under_the_limit(CHILD, tmp_path)
