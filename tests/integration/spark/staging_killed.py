"""A Spark run over a bucket, killed -9 in its staging (``compactor.runs.bucket_input``), for
``test_spark_bucket_kill_matrix``.

Run as ``python staging_killed.py DATA_DIR BUCKET_URL POINT``: opens the data dir as the
broker would (its store given the bucket), compacts the topic with the Spark engine, and
SIGKILLs itself at ``POINT`` of the staging, before any Spark job:

* ``after-roll-over``: the topic rolled over, nothing uploaded yet (the first upload of an
  object is where it dies);
* ``uploading``: the first staged ledger offloaded and recorded, the second one's copy
  being written (the ``filesystem`` driver's temporary file written, not renamed);
* ``after-upload``: the second ledger's copy uploaded and verified, its record not begun
  (the metadata's fault seam ``ledgers.offloaded.before``);
* ``after-record``: the second ledger recorded offloaded (``ledgers.offloaded.after``).

The bucket's own steps are reached by wrapping ``LedgerBucket.upload`` and ``os.replace``
(a real upload cannot be made to die at a byte on cue). Should the point never come, the
Spark session refuses to start and the script exits 3 (no JVM is started).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from compactor.runs.runner import CompactionConfig, Compactor
from compactor.spark import SparkEngine
from ledger.storage.bucket import LedgerBucket, parse_object_name
from ledger.storage.object_fs import BucketConfig
from tests.integration.spark.crash_support import ENTRIES_PER_LEDGER
from tests.integration.spark.support import NOW_S, TopicDir


class _NoJob(SparkEngine):
    def session(self) -> Any:
        print("the kill point was not reached before the Spark job", flush=True)
        sys.exit(3)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    data_dir, url, point = sys.argv[1:4]
    bucket = BucketConfig.from_url(url)
    topic_dir = TopicDir(Path(data_dir), entries_per_ledger=ENTRIES_PER_LEDGER, bucket=bucket)
    if point == "after-roll-over":
        def upload(self: LedgerBucket, local_path: str, name: str) -> None:
            _die()

        LedgerBucket.upload = upload  # type: ignore[method-assign]
    elif point == "uploading":
        real_replace = os.replace
        replaced: set[int | None] = set()

        def replace(source: Any, target: Any) -> None:
            if str(target).startswith(bucket.base):
                replaced.add(parse_object_name(str(target)))
                if len(replaced) > 1:  # the second ledger's copy: written, never renamed
                    _die()
            real_replace(source, target)

        os.replace = replace  # type: ignore[assignment]
    else:
        seam = {"after-upload": "ledgers.offloaded.before", "after-record": "ledgers.offloaded.after"}[point]
        calls: list[object] = []

        def fault(**details: object) -> None:
            calls.append(details)
            if len(calls) == 2:
                _die()

        topic_dir.data_dir.metadata.fault_points[seam] = fault
    topic_dir.compact(Compactor(CompactionConfig(engine="spark"), spark_engine=_NoJob("local[1]"),
                                clock=lambda: NOW_S))
    print("not killed", flush=True)


if __name__ == "__main__":
    main()
