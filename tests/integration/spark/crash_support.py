"""Helpers of the Spark kill matrices (``test_spark_kill_matrix``: ledger files;
``test_spark_bucket_kill_matrix``: through a bucket): the topic's data, the fault points of
the publish transaction, a crash and a restart as at a start.

Every case starts from a topic whose first view a Spark run published (several compacted
ledgers), with more updates after it (``FIRST``, then ``SECOND``): ``Prepared`` is that
data dir and what the next view must be (the local engine's over a copy).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.spark import SparkEngine
from ledger.data_dir import DataDir
from ledger.position import Position
from ledger.storage.base import SyncPolicy
from ledger.storage.object_fs import BucketConfig
from ledger.storage.sealed_writer import TEMP_PREFIX
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.integration.spark.support import NOW_S, TopicDir

ENTRIES_PER_LEDGER = 5
SHUFFLE = {"spark.sql.shuffle.partitions": "4"}  # the topics are tiny, and each task costs on two busy cores


def message(key: str | None, value: bytes | None) -> bytes:
    """A message at NOW_S; ``value`` None: a tombstone (``null_value``)."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=int(NOW_S * 1000))
    if key is not None:
        metadata.partition_key = key
    if value is None:
        metadata.null_value = True
    return encode_entry(metadata, value or b"", with_checksum=True)


# The first run's input, then the updates after it: overwrites, tombstones, key-less messages.
FIRST = [message(f"key-{index % 7}", b"a%d" % index) for index in range(24)]
SECOND = [message(None if index % 11 == 5 else f"key-{index % 9}", None if index % 6 == 0 else b"b%d" % index)
          for index in range(26)]


@dataclass
class Prepared:
    """A data dir whose topic has a published view and updates after it (``path``), and
    what the next run must publish (the local engine's view on a copy)."""

    path: Path
    served: list[bytes]  # the published view's entries, as stored
    served_messages: list[tuple[object, ...]]  # what a read-compacted reader gets: the view, then the raw tail
    view_ledger_ids: tuple[int, ...]
    horizon: Position
    expected: list[bytes]  # the local engine's next view, entries as stored
    expected_messages: list[tuple[object, ...]]


# Fault points of the publish transaction (``ledger.database``), and whether the new view
# is published when the process dies there.
COMMIT_POINTS = [
    pytest.param("cursor.save.before", False, id="before-the-transaction"),
    pytest.param("cursor.save.between_position_and_properties", False, id="inside-before-the-properties"),
    pytest.param("compaction.manifest.write", False, id="inside-before-the-manifest"),
    pytest.param("cursor.save.after", True, id="after-the-commit"),
]


def spark_compactor(engine: SparkEngine) -> Compactor:
    return Compactor(CompactionConfig(engine="spark"), clock=lambda: NOW_S, spark_engine=engine)


def restart(path: Path, *, bucket: BucketConfig | None = None) -> tuple[TopicDir, list[int]]:
    """Open the data dir as a start does: collect orphans first, then the topic."""
    data_dir = DataDir.open(str(path), sync=SyncPolicy.NONE, bucket=bucket)
    try:
        orphans = collect_orphans(data_dir)
    finally:
        data_dir.close()
    return TopicDir(path, entries_per_ledger=ENTRIES_PER_LEDGER, bucket=bucket), orphans


def kill(topic_dir: TopicDir) -> None:
    """``kill -9`` in-process: nothing closed or sealed; the stores stop and the lock goes."""
    topic_dir.data_dir.close()


def ledger_files(path: Path) -> tuple[set[int], list[str]]:
    """The ledger ids with a file in the data dir, and its temporary files."""
    names = os.listdir(path / "ledgers")
    return ({int(name.split(".")[0]) for name in names if name.endswith(".ledger")},
            [name for name in names if name.startswith(TEMP_PREFIX)])


def tasks_running(engine: SparkEngine) -> int:
    """Tasks of the session still running, of any stage (a failed stage is no longer
    active, yet its cancelled tasks may run on for seconds). Stage ids are consecutive;
    a few may be unknown (skipped)."""
    tracker = engine.session().sparkContext.statusTracker()
    running, unknown, stage_id = 0, 0, 0
    while unknown < 20:
        info = tracker.getStageInfo(stage_id)
        unknown = unknown + 1 if info is None else 0
        running += 0 if info is None else info.numActiveTasks
        stage_id += 1
    return running
