"""A real Spark standalone cluster (issue 7, point 5; issue 13, point 7): one master and one
worker on 127.0.0.1.

Both are started from the PySpark distribution (``bin/spark-class`` with the Master and
Worker classes, as ``sbin/start-master.sh`` and ``start-worker.sh`` do) on free ports.
``compactd compact-topic --engine spark --spark-master spark://127.0.0.1:PORT`` then
compacts a stopped broker's topic on that cluster, the whole pipeline: phase one and phase
two run on the worker's executor, which writes the compacted ledgers (one per group: two
here, for the worker's two cores) into the data dir, and the driver publishes their list.
The compacted view it publishes — its ledgers' entries concatenated — must be byte for
byte the compacted ledger ``--engine local`` publishes on a copy of the data dir, with
the same figures, and the master must list the run as a completed application. Every wait is bounded; the master
and the worker are stopped (then killed, if need be) whatever happens, and their output
goes to files, not pipes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tests.integration.spark.cluster import Cluster, master_state
from tests.integration.spark.support import (
    TOPIC,
    TopicDir,
    mixed_entries,
    published_compacted_ledger,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 240  # the driver's JVM, the executor's, the job


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    (tmp_path / "cluster").mkdir()
    running = Cluster(tmp_path / "cluster")
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _compact_topic(data_dir: Path, *arguments: str) -> dict[str, Any]:
    compactd = Path(sys.executable).parent / "compactd"
    command = [str(compactd)] if compactd.exists() else [sys.executable, "-c", "from api.cli import main; main()"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run([*command, "compact-topic", "--data-dir", str(data_dir), "--topic", TOPIC, *arguments],
                            env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    summary: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return summary


def test_compact_topic_on_a_standalone_cluster_publishes_what_the_local_engine_does(
    cluster: Cluster, tmp_path: Path,
) -> None:
    topic_dir = TopicDir(tmp_path / "spark", entries_per_ledger=6)
    topic_dir.append(mixed_entries())
    topic_dir.close()  # compact-topic runs on a stopped broker's data dir
    shutil.copytree(tmp_path / "spark", tmp_path / "local")

    on_cluster = _compact_topic(tmp_path / "spark", "--engine", "spark", "--spark-master", cluster.url)
    local = _compact_topic(tmp_path / "local", "--engine", "local")

    assert on_cluster["status"] == "SUCCESS"
    for field in ("removedEvents", "entriesRead", "messagesRead", "entriesWritten", "bytesWritten"):
        assert on_cluster[field] == local[field], field
    assert on_cluster["entriesRead"] == 40
    spark_horizon, spark_ledger = published_compacted_ledger(tmp_path / "spark")
    local_horizon, local_ledger = published_compacted_ledger(tmp_path / "local")
    assert (spark_horizon, spark_ledger) == (local_horizon, local_ledger)
    assert len(spark_ledger) > 0
    spark_view = _published_ledgers(tmp_path / "spark")
    assert len(spark_view) == 2 and len(_published_ledgers(tmp_path / "local")) == 1  # a group per worker core
    assert on_cluster["ledgerId"] == spark_view[0]
    completed = master_state(cluster.web_port)["completedapps"]
    assert [app["name"] for app in completed] == ["compactd"]


def _published_ledgers(path: Path) -> tuple[int, ...]:
    """The ledgers of the compacted view published in the (stopped) data dir at ``path``,
    each a sealed compacted ledger of the topic."""
    from compactor.spark.source import topic_state
    from ledger.storage.base import LedgerState, SyncPolicy
    from ledger.storage.file import FileLedgerStore

    _, snapshot = topic_state(str(path), TOPIC, read_compacted=True)
    assert snapshot is not None
    store = FileLedgerStore(str(path / "ledgers"), sync=SyncPolicy.NONE, read_only=True)
    try:
        for ledger_id in snapshot.ledger_ids:
            info = store.info(ledger_id)
            assert info.state is LedgerState.CLOSED
            assert (info.metadata["component"], info.metadata["topic"]) == ("compacted-ledger", TOPIC)
            assert info.metadata["compactedTo"] == str(snapshot.horizon)
    finally:
        store.shutdown()
    return snapshot.ledger_ids
