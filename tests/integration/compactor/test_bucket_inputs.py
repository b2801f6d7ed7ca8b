"""Compaction runs of the local engine read offloaded ledgers through the bucket (issue 29,
point 2: "compaction runs read offloaded ledgers transparently").

One topic is written twice, the same entries with the same roll-overs, into two data dirs:
one without a bucket, and one whose sealed ledgers (with their key indexes, when built) are
offloaded and whose local copies are then dropped, so that only the bucket holds them (a
filesystem directory, or a bucket of the real S3 server on loopback). Each is compacted by
the local engine, in every way it reads ledger files: rounds over key indexes in the
broker's process, rounds in a worker process (its own read-only store, given the bucket),
and rounds that parse every entry through the store. The views published agree entry for
entry and byte for byte, with the same figures, in two runs (the second reads the first's
view too); and the data dir with the bucket still has no local copy of any offloaded ledger
afterwards: every read of them went to the bucket, and the key indexes a run built for
them are the ledgers' sidecar objects there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactor.local.key_index import INDEX_SUFFIX
from compactor.runs.runner import CompactionConfig, Compactor
from ledger.storage.bucket import ledger_object_name
from ledger.storage.object_fs import BucketConfig
from tests.integration.spark.support import NOW_S, TopicDir, mixed_entries

pytestmark = [pytest.mark.integration]

MODES = {
    "indexes-here": CompactionConfig(engine="local", read_batch_entries=4),
    "worker-process": CompactionConfig(engine="local", read_batch_entries=4, worker_processes=1),
    "parsed": CompactionConfig(engine="local", read_batch_entries=4, key_index=False),
}


@pytest.fixture(params=sorted(MODES))
def compactor(request: pytest.FixtureRequest) -> Iterator[Compactor]:
    made = Compactor(MODES[request.param], clock=lambda: NOW_S)
    yield made
    made.close()


def _offload_and_drop(topic_dir: TopicDir) -> list[int]:
    """Offload every sealed ledger of the topic and drop its local copy; their ids."""
    ledger, files = topic_dir.ledger, topic_dir.data_dir.ledgers
    done = []
    for record in ledger.ledger_list():
        if record.closed_at_ms and record.entries and not record.offloaded:
            files.upload_sealed(record.ledger_id)
            assert ledger.record_offloaded(record.ledger_id, int(NOW_S * 1000))
            files.drop_local(record.ledger_id)
            done.append(record.ledger_id)
    return done


def _local_files(topic_dir: TopicDir, ledger_ids: list[int]) -> list[str]:
    names = set(os.listdir(topic_dir.path / "ledgers"))
    return sorted(name for name in names if any(name.startswith(f"{ledger_id:020d}") for ledger_id in ledger_ids))


def _index_objects(bucket: BucketConfig, ledger_ids: list[int]) -> list[int]:
    import pyarrow.fs as pafs

    infos = bucket.open().get_file_info([f"{bucket.base}/{ledger_object_name(ledger_id, INDEX_SUFFIX)}"
                                         for ledger_id in ledger_ids])
    return [ledger_id for ledger_id, info in zip(ledger_ids, infos, strict=True) if info.type == pafs.FileType.File]


@pytest.mark.parametrize("driver", ["filesystem", "aws-s3"])
def test_the_local_engine_compacts_offloaded_ledgers_as_it_compacts_local_ones(
    compactor: Compactor, driver: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    if driver == "aws-s3" and request.node.callspec.params.get("compactor") != "worker-process":
        pytest.skip("S3 once, with the worker process; the directory driver covers the other modes")
    bucket = (BucketConfig("filesystem", str(tmp_path / "bucket")) if driver == "filesystem"
              else request.getfixturevalue("s3_bucket"))
    plain, offloaded = TopicDir(tmp_path / "plain"), TopicDir(tmp_path / "offloaded", bucket=bucket)
    try:
        gone: list[int] = []
        for part in (mixed_entries(23), mixed_entries(17, first=23)):
            for topic_dir in (plain, offloaded):
                topic_dir.append(part)
                topic_dir.ledger.roll_over_now()  # the same ledgers in both: all sealed
            gone += _offload_and_drop(offloaded)
            assert gone and not _local_files(offloaded, gone)
            figures = {name: topic_dir.compact(compactor) for name, topic_dir in
                       (("plain", plain), ("offloaded", offloaded))}
            assert offloaded.compacted_ledger() == plain.compacted_ledger()
            assert offloaded.compacted_ledger()  # something survived
            for field in ("entries_read", "messages_read", "bytes_read", "entries_written", "bytes_written",
                          "keys_kept", "removed_events"):
                assert getattr(figures["offloaded"], field) == getattr(figures["plain"], field), field
            assert not _local_files(offloaded, gone)  # read from the bucket, never brought back
            if compactor.config.key_index:  # the indexes a run built for them went to the bucket
                assert _index_objects(bucket, gone) == gone
    finally:
        plain.close()
        offloaded.close()
