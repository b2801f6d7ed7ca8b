"""Compaction through the bucket on a real standalone cluster whose worker cannot see the
broker's data dir (issue 29, point 3).

A Spark master and worker on 127.0.0.1 (``tests.integration.spark.cluster``), the worker
started in a private mount namespace where an empty, read-only ``tmpfs`` covers the
broker's data dir: the worker, its executor and every Python worker it starts find the
path empty and unwritable (the test asks an executor what it sees there: nothing, while the
broker's side holds the whole data dir). The only thing they share with the broker is a
bucket of the real S3 server on loopback, whose dummy credentials they find in their own
environment (the AWS chain). The data dir holds a topic whose first part the local engine
compacted already (a view of local files); more is appended, then a driver
(``bucket_driver.py``, its own process) compacts the topic with the Spark engine on the
cluster: the runner stages the input in the bucket (raw ledgers offloaded and recorded, the
local view uploaded), the executors read it there and upload the compacted ledgers there.

What read-compacted readers receive afterwards — the view's entries, byte for byte, and
the messages a read-compacted reader is given — equals what the local engine publishes
over a copy of the same data dir taken before the run; the view's ledgers are objects in
the bucket, no file of them was ever written in the data dir, and the manifest records
that they live in the bucket.
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

from compactor.runs.runner import CompactionConfig, Compactor
from compactor.view.manifest import CompactedManifests
from ledger.storage.bucket import ledger_object_name
from ledger.storage.object_fs import BucketConfig
from tests.integration.spark.cluster import Cluster, private_mounts_available
from tests.integration.spark.support import NOW_S, TOPIC, TopicDir, local_messages, mixed_entries

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 300  # the driver's JVM, the executor's, the job, on a loaded machine


@pytest.fixture
def broker_dir(tmp_path: Path) -> Path:
    path = tmp_path / "broker"
    path.mkdir()
    return path


@pytest.fixture
def blind_cluster(tmp_path: Path, broker_dir: Path, s3_bucket: BucketConfig) -> Iterator[Cluster]:
    """A cluster whose worker cannot see ``broker_dir`` (started after the S3 fixture put
    the credentials in the environment the worker inherits)."""
    del s3_bucket
    if not private_mounts_available(tmp_path / "probe"):
        pytest.skip("no private mount namespace on this machine (unshare --mount)")
    (tmp_path / "cluster").mkdir()
    running = Cluster(tmp_path / "cluster", hidden=[broker_dir])
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _spark_compaction(data_dir: Path, cluster: Cluster, bucket: BucketConfig) -> dict[str, Any]:
    driver = Path(__file__).with_name("bucket_driver.py")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3]), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(driver), str(data_dir), cluster.url, bucket.to_url(), *(
        [bucket.endpoint] if bucket.endpoint else [])]
    result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=RUN_TIMEOUT_S,
                            check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    report: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return report


def _objects(bucket: BucketConfig, names: list[str]) -> list[str]:
    import pyarrow.fs as pafs

    infos = bucket.open().get_file_info([f"{bucket.base}/{name}" for name in names])
    return [name for name, info in zip(names, infos, strict=True) if info.type == pafs.FileType.File]


def test_a_worker_that_cannot_see_the_data_dir_compacts_through_the_bucket_what_the_local_engine_does(
    s3_bucket: BucketConfig, blind_cluster: Cluster, broker_dir: Path, tmp_path: Path,
) -> None:
    local = Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S)
    try:
        topic_dir = TopicDir(broker_dir, entries_per_ledger=6, bucket=s3_bucket)
        topic_dir.append(mixed_entries(30))
        topic_dir.compact(local)  # a view of local files: the Spark run uploads it as input
        topic_dir.append(mixed_entries(20, first=30))
        topic_dir.close()  # the driver opens the data dir as the (stopped) broker would
        shutil.copytree(broker_dir, tmp_path / "reference")

        report = _spark_compaction(broker_dir, blind_cluster, s3_bucket)

        reference = TopicDir(tmp_path / "reference", entries_per_ledger=6)  # no bucket: all local
        try:
            local_figures = reference.compact(local)
            expected_entries = reference.compacted_ledger()
            expected_rows = local_messages(reference, read_compacted=True)
        finally:
            reference.close()
    finally:
        local.close()

    # The executor saw an empty data dir; the broker's side holds the whole of it.
    assert report["probe"] == {"exists": True, "listed": []}
    assert {"metadata.db", "ledgers"} <= set(os.listdir(broker_dir))
    assert report["executor_pid"] != os.getpid()
    figures = report["figures"]
    assert figures["engine"] == "spark"
    for name in ("entries_read", "messages_read", "removed_events", "entries_written", "bytes_written"):
        assert figures[name] == getattr(local_figures, name), name

    served = TopicDir(broker_dir, entries_per_ledger=6, bucket=s3_bucket)
    try:
        view = served.topic.view
        assert view is not None
        assert served.compacted_ledger() == expected_entries and expected_entries
        assert local_messages(served, read_compacted=True) == expected_rows
        assert CompactedManifests(served.data_dir.database).in_bucket(TOPIC)
        names = [ledger_object_name(ledger_id) for ledger_id in view.ledger_ids]
        assert _objects(s3_bucket, names) == names
        local_names = os.listdir(broker_dir / "ledgers")
        assert not [name for name in local_names if any(name.startswith(f"{i:020d}") for i in view.ledger_ids)]
    finally:
        served.close()
