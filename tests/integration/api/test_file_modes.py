"""Every file and directory compactd creates is its owner's only (issue 25 point 6): after a
full workload on a real ``compactd serve`` — a producer, sealed ledgers indexed by the key
index worker (``.kidx``: they hold message keys), a compaction, an online backup through
the admin API (staged in the data dir), a restore — each file of the data dir, the backup
and the restored data dir is 0600 and each directory 0700, whatever the umask (the test
runs the processes under 022, the usual default), and no staging directory is left.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ledger.backup import STAGING
from tests.integration.api.test_backup_e2e import QUIET, WAIT_S, compact, compactd
from tests.integration.wire.helpers import unique_topic, wait_until
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

ENTRIES_PER_LEDGER = 500  # the key index worker indexes ledgers of at least INDEX_MIN_ENTRIES
KEYS = 20


@pytest.fixture
def usual_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (itself included) and its permission bits."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = Path(directory, name)
            found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def _not_owner_only(root: Path) -> dict[str, str]:
    wrong = {}
    for relative, mode in _modes(root).items():
        expected = 0o700 if (root / relative).is_dir() else 0o600
        if mode != expected:
            wrong[relative] = oct(mode)
    return wrong


@pytest.mark.slow
def test_every_file_and_directory_of_a_full_workload_is_owner_only(tmp_path: Path, usual_umask: None) -> None:
    data = tmp_path / "data"
    serve = ServeProcess(data, tmp_path / "serve.log", "--managed-ledger-max-entries-per-ledger",
                         str(ENTRIES_PER_LEDGER))
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=30, logger=QUIET)
    http = httpx.Client(base_url=serve.http_url, timeout=WAIT_S)
    topic = unique_topic("modes")
    try:
        client.subscribe(topic, "holds-the-ledgers")  # a durable cursor: nothing is trimmed
        producer = client.create_producer(topic, batching_enabled=False)
        for index in range(2 * ENTRIES_PER_LEDGER + 10):  # two sealed ledgers and an open one
            producer.send_async(b"v%d" % index, None, partition_key=f"k{index % KEYS}")
        producer.flush()
        wait_until(lambda: len(list((data / "ledgers").glob("*.kidx"))) >= 2,
                   "the key indexes of the sealed ledgers", WAIT_S)
        compact(http, topic)
        backup = compactd("backup", "--admin-url", serve.http_url, "--output", str(tmp_path / "backup"))
        assert backup.returncode == 0, backup.stderr
        assert not (data / STAGING).exists(), "the online backup left its staging directory behind"
    finally:
        http.close()
        client.close()
        assert serve.terminate() == 0
    restored = compactd("restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
    assert restored.returncode == 0, restored.stderr
    for root in (data, tmp_path / "backup", tmp_path / "restored"):
        assert _not_owner_only(root) == {}, f"under {root}"
    assert any(name.endswith(".kidx") for name in _modes(data)), "no key index was written"
