"""Loading a ledger scans its whole file through a mapping; the scan must not hold the file.

A store loads a ledger it did not write (a compacted ledger an executor or a worker process
wrote, any ledger after a restart) by scanning its file for the entry offsets. The scan
maps the file and releases the pages behind it (``SCAN_RELEASE_BYTES``), so loading a
ledger of hundreds of MiB does not raise the process's peak RSS by its size: the broker's
peak RSS stays bounded whatever the size of the ledgers it opens (issue 13 measured the
Spark driver's peak RSS jump by the size of the largest compacted ledger it published).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.storage.base import SyncPolicy
from ledger.storage.file import FileLedgerStore
from ledger.storage.record import SCAN_RELEASE_BYTES

MIB = 1024 * 1024
ENTRY_BYTES = 256 * 1024
LEDGER_BYTES = 96 * MIB


def _peak_rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _reset_peak_rss() -> None:
    """Linux's ``clear_refs`` 5: the peak RSS starts again from the current RSS."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_loading_a_large_ledger_raises_peak_rss_by_far_less_than_its_size(tmp_path: Path) -> None:
    writer = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE)
    ledger_id = writer.create()
    entry = bytes(range(256)) * (ENTRY_BYTES // 256)
    for _ in range(LEDGER_BYTES // ENTRY_BYTES):
        writer.append(ledger_id, entry).result()
    writer.close(ledger_id)
    writer.shutdown()
    reader = FileLedgerStore(str(tmp_path), sync=SyncPolicy.NONE, read_only=True)
    _reset_peak_rss()
    before = _peak_rss()
    entries = reader.last_add_confirmed(ledger_id) + 1  # the first use loads (scans) the file
    grown = _peak_rss() - before
    assert entries == LEDGER_BYTES // ENTRY_BYTES
    assert grown < SCAN_RELEASE_BYTES + 16 * MIB, f"the scan held {grown / MIB:.0f} MiB of a {LEDGER_BYTES // MIB} MiB file"
    assert reader.read(ledger_id, entries - 1, entries - 1) == [entry]  # and it still reads
    reader.shutdown()
