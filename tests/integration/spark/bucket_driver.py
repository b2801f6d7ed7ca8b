"""A Spark driver for ``test_spark_bucket_cluster``: one compaction of a stopped broker's
topic on a standalone cluster, through a bucket.

Run as ``python bucket_driver.py DATA_DIR MASTER BUCKET_URL [ENDPOINT]`` (``ENDPOINT`` may be
empty). ``test_spark_bucket`` also runs it on ``local[2]`` with the rewrite's test fault
point set (``compactor.spark.rewrite.FAULT_ENV``), to kill it in the middle of a job. It opens the data
dir as the broker would (its ledger store given the bucket), asks one executor what it sees
at ``DATA_DIR`` (whether the path exists, and what it lists there), compacts the topic with
the Spark engine on ``MASTER`` (the runner stages the input in the bucket; the executors
read and write there), and prints one JSON line: ``probe`` (the executor's view of the data
dir), ``executor_pid`` and ``figures`` (the run's ``RunFigures`` fields).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from compactor.runs.runner import CompactionConfig, Compactor
from compactor.spark import SparkEngine
from ledger.storage.object_fs import BucketConfig
from tests.integration.spark.support import NOW_S, TopicDir


def _probe(path: str) -> Any:
    def look(_: int) -> tuple[bool, list[str] | None, int]:
        listed = sorted(os.listdir(path)) if os.path.isdir(path) else None
        return os.path.exists(path), listed, os.getpid()

    return look


def main() -> None:
    data_dir, master, url = sys.argv[1:4]
    endpoint = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
    bucket = BucketConfig.from_url(url, endpoint=endpoint)
    topic_dir = TopicDir(Path(data_dir), entries_per_ledger=6, bucket=bucket)
    engine = SparkEngine(master)
    try:
        [(exists, listed, pid)] = engine.session().sparkContext.parallelize([0], 1).map(_probe(data_dir)).collect()
        compactor = Compactor(CompactionConfig(engine="spark", spark_master=master), spark_engine=engine,
                              clock=lambda: NOW_S)
        figures = topic_dir.compact(compactor)
    finally:
        engine.stop()
        topic_dir.close()
    print(json.dumps({"probe": {"exists": exists, "listed": listed}, "executor_pid": pid,
                      "figures": dataclasses.asdict(figures)}, default=str))


if __name__ == "__main__":
    main()
