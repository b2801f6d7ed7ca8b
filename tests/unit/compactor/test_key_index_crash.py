"""A crash while a key index is written never leaves half an index under its name.

A real child process (``python -c``, the code of ``compactor.local.index_builds.build_key_index``
as the background builds run it) indexes a sealed ledger of a real data dir and is killed
with SIGKILL at one point of the matrix:

* ``writing-<n>``: after the Parquet writer handed ``n`` bytes of the temporary file to
  the OS (the writer's own byte stream, cut where the kill lands: a torn temporary file);
* ``before-rename``: the temporary file is complete and synced, not yet renamed;
* ``after-rename``: renamed over the final name, the directory not yet synced.

The kill points are reached by wrapping the child's file object and ``os.replace``: the
real writer cannot be made to die at a byte on cue. After each kill the final name holds
nothing or a whole index (never a torn one); the next start (``collect_orphans``) removes
the temporary file; ``ensure_index`` then gives exactly the index parsed afresh and leaves
it on disk; and a compaction of the topic publishes exactly what a compaction of the same
data dir never touched by an index build publishes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from compactor.local.key_index import TEMP_SUFFIX, ensure_index, index_path, read_index
from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.view.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_writer import ledger_file_name
from tests.unit.compactor.test_crash import _append, _workload
from tests.unit.compactor.test_key_index import ledger_facts, reference_index, same_index

TOPIC = "persistent://public/default/index-crash"
LEDGER_CONFIG = ManagedLedgerConfig(max_entries_per_ledger=60)
CHILD_BOUND_S = 60
REPO = str(Path(__file__).resolve().parents[3])
POINTS = ["writing-0", "writing-4", "writing-half", "writing-all-but-one", "before-rename", "after-rename"]
View = list[tuple[Position, bytes, tuple[int, ...]]]
Pristine = tuple[Path, int, int, View]

CHILD = """
import io, os, signal, sys
import pyarrow.parquet as pq
from compactor.local.index_builds import build_key_index

root, ledger_id, point = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point.startswith("writing-"):
    limit = int(point[len("writing-"):])
    real_write_table = pq.write_table

    class Torn(io.FileIO):
        written = 0

        def write(self, data):
            room = limit - self.written
            if len(data) >= room:
                super().write(bytes(data)[:room])
                os.fsync(self.fileno())
                die()
            self.written += len(data)
            return super().write(data)

    def write_table(table, where, **options):  # a path, or the open file write_index made
        opened = hasattr(where, "fileno")
        with Torn(where.fileno() if opened else where, "wb", closefd=not opened) as sink:
            real_write_table(table, sink, **options)

    pq.write_table = write_table
else:
    real_replace = os.replace

    def replace(source, target):
        if point == "before-rename":
            die()
        real_replace(source, target)
        die()

    os.replace = replace
build_key_index(root, ledger_id)
"""


def _topic(path: Path) -> tuple[DataDir, CompactedTopic]:
    data_dir = DataDir.open(str(path))
    collect_orphans(data_dir)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, LEDGER_CONFIG)
    return data_dir, CompactedTopic.restore(ledger, CursorStore(data_dir.database))


def _compacted_view(path: Path) -> View:
    data_dir, topic = _topic(path)
    Compactor(CompactionConfig(engine="local")).compact(topic, delete_retention_ms=0)
    view = topic.view
    assert view is not None
    entries = [(entry.position, entry.data, entry.surviving) for entry in view.iter_all()]
    topic.ledger.close()
    data_dir.close()
    return entries


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """A data dir whose topic holds sealed ledgers of 60 entries and no index; the first
    ledger's id, the size of its index, and the view a compaction of a copy publishes."""
    root = tmp_path_factory.mktemp("pristine")
    data_dir, topic = _topic(root / "data")
    _append(topic.ledger, _workload(11, 150))
    topic.ledger.close()
    ledger_id = data_dir.metadata.topic_ledgers(TOPIC)[0].ledger_id
    data_dir.close()
    measure = root / "measure"
    shutil.copytree(root / "data", measure)
    store = FileLedgerStore(str(measure / "ledgers"), read_only=True)
    ensure_index(store, ledger_id, compacted=False)
    size = os.path.getsize(index_path(os.path.join(store.root, ledger_file_name(ledger_id))))
    store.shutdown()
    reference = root / "reference"
    shutil.copytree(root / "data", reference)
    return root / "data", ledger_id, size, _compacted_view(reference)


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_a_crash_while_an_index_is_written_leaves_none_or_a_whole_one_and_the_next_start_rebuilds_it(
    tmp_path: Path, pristine: Pristine, point: str,
) -> None:
    source, ledger_id, size, expected_view = pristine
    data = tmp_path / "data"
    shutil.copytree(source, data)
    ledgers = str(data / "ledgers")
    child_point = {"writing-half": f"writing-{size // 2}",
                   "writing-all-but-one": f"writing-{size - 1}"}.get(point, point)
    child = subprocess.run([sys.executable, "-c", CHILD, ledgers, str(ledger_id), child_point],
                           env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, timeout=CHILD_BOUND_S,
                           check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()

    final = index_path(os.path.join(ledgers, ledger_file_name(ledger_id)))
    temporaries = [name for name in os.listdir(ledgers) if name.endswith(TEMP_SUFFIX)]
    store = FileLedgerStore(ledgers, read_only=True)
    expected_index = reference_index(store, ledger_id)
    if point == "after-rename":
        whole = read_index(final, ledger_facts(store, ledger_id))
        assert whole is not None and same_index(whole, expected_index)
        assert temporaries == []
    else:
        assert not os.path.exists(final)  # never half an index under the final name
        assert len(temporaries) == 1
    store.shutdown()

    data_dir = DataDir.open(str(data))  # the next start
    collect_orphans(data_dir)
    assert [name for name in os.listdir(ledgers) if name.endswith(TEMP_SUFFIX)] == []
    store = data_dir.ledgers
    assert isinstance(store, FileLedgerStore)
    assert same_index(ensure_index(store, ledger_id, compacted=False), expected_index)
    written = read_index(final, ledger_facts(store, ledger_id))
    assert written is not None and same_index(written, expected_index)
    data_dir.close()
    assert _compacted_view(data) == expected_view
