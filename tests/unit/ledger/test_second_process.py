"""A sealed ledger is readable by another process while the owner appends elsewhere."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

from ledger.data_dir import DataDir
from ledger.storage import FileLedgerStore

READER = textwrap.dedent(
    """
    import hashlib, sys
    from ledger.storage import FileLedgerStore
    root, ledger_id, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for _ in range(rounds):
        store = FileLedgerStore(root, read_only=True)
        info = store.info(ledger_id)
        assert info.sealed, "expected a sealed ledger"
        digest = hashlib.sha256()
        for data in store.read(ledger_id, 0, info.last_add_confirmed):
            digest.update(data)
        store.shutdown()
        print(info.entries, digest.hexdigest(), flush=True)
    """
)


def test_other_process_reads_sealed_ledger_while_owner_appends(tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path))  # the owner holds the lock the whole time
    store = data_dir.ledgers
    assert isinstance(store, FileLedgerStore)
    sealed = store.create({"component": "compacted-ledger"})
    digest = hashlib.sha256()
    for i in range(2000):
        data = b"%06d" % i * 10
        digest.update(data)
        store.append(sealed, data)
    store.close(sealed)
    busy = store.create()
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, store.root, str(sealed), "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    appended = 0
    while reader.poll() is None and appended < 200_000:
        store.append(busy, b"y" * 200)
        appended += 1
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 20
    assert set(lines) == {f"2000 {digest.hexdigest()}"}
    assert appended > 0
    data_dir.close()
