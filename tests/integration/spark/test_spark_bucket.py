"""The Spark engine through a bucket, on Spark ``local[2]`` (issue 29, point 3).

With object storage configured, a Spark run first rolls the topic over and offloads its
input (keeping the local copies), then its executors — given a ledger directory that does
not exist and the ``BucketConfig`` — read every input ledger and key index from the bucket
and upload each group's compacted ledger there; the broker publishes them with the manifest
recording that they live in the bucket, and serves the view from there. Agreement: over
two runs (each after more appends; the second reads the previous view, itself in the
bucket), the view's entries equal the local engine's over the same topic without a bucket
(ledgers named by their place), with the same figures; the view's ledgers have no local
file; the raw input is recorded offloaded and its local copies are kept (they follow the
deletion lag); after a restart the read-compacted rows are the local engine's still; the ``compactd``
data source given the ``bucket`` option reads the same rows from there. On
both drivers: a directory, and a bucket of the real S3 server on loopback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from compactor.runs.runner import CompactionConfig, Compactor
from compactor.spark import SparkEngine
from compactor.view.manifest import CompactedManifests
from ledger.storage.bucket import ledger_object_name
from ledger.storage.object_fs import BucketConfig
from tests.integration.spark.support import (
    NOW_S,
    TOPIC,
    TopicDir,
    local_messages,
    mixed_entries,
    spark_rows,
)
from tests.integration.spark.test_spark_local import _named_by_place
from tests.s3_server import AWS_ENV

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FIGURES = ("removed_events", "entries_read", "messages_read", "bytes_read", "entries_written", "bytes_written",
           "keys_kept")


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkEngine]:
    # The executors find the test server's dummy credentials in their environment, as they
    # would find a real cluster's (the Python workers of a local session are started by a
    # JVM that may predate the S3 fixture, so they are handed to them explicitly).
    executor_env = {f"spark.executorEnv.{name}": value for name, value in AWS_ENV.items()}
    spark_engine = SparkEngine("local[2]", piece_entries=4, group_entries=10, config=executor_env)
    spark_engine.session()
    yield spark_engine
    spark_engine.stop()


def _objects(bucket: BucketConfig, names: list[str]) -> list[str]:
    import pyarrow.fs as pafs

    infos = bucket.open().get_file_info([f"{bucket.base}/{name}" for name in names])
    return [name for name, info in zip(names, infos, strict=True) if info.type == pafs.FileType.File]


def _place_named(topic_dir: TopicDir) -> list[bytes]:
    return _named_by_place(topic_dir.compacted_ledger(), [r.ledger_id for r in topic_dir.ledger.ledger_list()])


def _rows_by_place(topic_dir: TopicDir) -> list[tuple[object, ...]]:
    """What a read-compacted reader gets, each message's ledger id named by its place."""
    place = {record.ledger_id: index for index, record in enumerate(topic_dir.ledger.ledger_list())}
    return [(*row[:2], place[row[2]], *row[3:]) for row in local_messages(topic_dir, read_compacted=True)]


@pytest.mark.parametrize("driver", ["filesystem", "aws-s3"])
def test_a_spark_run_through_a_bucket_publishes_the_local_engines_view_from_the_bucket(
    engine: SparkEngine, driver: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    bucket = (BucketConfig("filesystem", str(tmp_path / "bucket")) if driver == "filesystem"
              else request.getfixturevalue("s3_bucket"))
    spark = Compactor(CompactionConfig(engine="spark"), spark_engine=engine, clock=lambda: NOW_S)
    local = Compactor(CompactionConfig(engine="local"), clock=lambda: NOW_S)
    on_spark, on_local = TopicDir(tmp_path / "spark", bucket=bucket), TopicDir(tmp_path / "local")
    try:
        for first, count in ((0, 23), (23, 14)):
            for topic_dir in (on_spark, on_local):
                topic_dir.append(mixed_entries(count, first))
            on_local.ledger.roll_over_now()  # what the Spark run does first, by itself
            spark_figures, local_figures = on_spark.compact(spark), on_local.compact(local)
            assert _place_named(on_spark) == _place_named(on_local)
            assert [getattr(spark_figures, name) for name in FIGURES] == \
                [getattr(local_figures, name) for name in FIGURES]

            view = on_spark.topic.view
            assert view is not None
            assert CompactedManifests(on_spark.data_dir.database).in_bucket(TOPIC)
            local_names = set(os.listdir(tmp_path / "spark" / "ledgers"))
            for ledger_id in view.ledger_ids:  # written by the executors into the bucket only
                assert f"{ledger_id:020d}.ledger" not in local_names
            assert _objects(bucket, [ledger_object_name(i) for i in view.ledger_ids]) == \
                [ledger_object_name(i) for i in view.ledger_ids]
            sealed = [r for r in on_spark.data_dir.metadata.topic_ledgers(TOPIC) if r.closed_at_ms and r.entries]
            assert sealed and all(record.offloaded for record in sealed)  # staged as any offload
            assert all(f"{record.ledger_id:020d}.ledger" in local_names for record in sealed)  # local copies kept
        expected = _rows_by_place(on_local)
        assert _rows_by_place(on_spark) == expected
        # The data source reads the view from the bucket too, given the bucket's location.
        frame = (engine.session().read.format("compactd").option("dataDir", str(tmp_path / "spark"))
                 .option("topic", TOPIC).option("readCompacted", "true").option("bucket", bucket.to_url())
                 .option("bucketEndpoint", bucket.endpoint or "").load())
        assert spark_rows(frame) == local_messages(on_spark, read_compacted=True)
    finally:
        on_spark.close()
        on_local.close()
        local.close()
    restarted = TopicDir(tmp_path / "spark", bucket=bucket)
    try:  # the view is read from the bucket after a restart too
        assert _rows_by_place(restarted) == expected
    finally:
        restarted.close()
