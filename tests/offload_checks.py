"""The crash rule of an offload, checked on a stopped data dir (``ledger.offload``): at every
instant each sealed ledger is recorded offloaded with a whole object in the bucket, or still
whole in the local data dir. Shared by the offload crash test and the Spark kill matrix
through a bucket (a Spark run's staging offloads its input)."""

from __future__ import annotations

import os

from ledger.data_dir import DataDir
from ledger.storage.bucket import LedgerBucket, ledger_object_name
from ledger.storage.byte_source import BlockCache
from ledger.storage.object_fs import BucketConfig
from ledger.storage.sealed_file import SealedFile

__all__ = ["assert_offloaded_or_whole"]


def assert_offloaded_or_whole(data_dir: DataDir, bucket: BucketConfig, topic: str) -> None:
    """Each sealed ledger of ``topic``: offloaded-and-recorded with a whole object (the
    same bytes as its local file where that is still there), or local-and-whole."""
    files = data_dir.ledgers.file_powers()
    assert files is not None
    objects = LedgerBucket(bucket, BlockCache(0))
    for record in data_dir.metadata.topic_ledgers(topic):
        if record.is_open:
            continue
        local = os.path.join(files.root, f"{record.ledger_id:020d}.ledger")
        if record.offloaded:
            size = objects.size(ledger_object_name(record.ledger_id))
            assert size is not None, f"ledger {record.ledger_id} recorded offloaded with no object"
            if os.path.exists(local):
                objects.verify(local, ledger_object_name(record.ledger_id))
        else:
            assert not record.local_deleted
            sealed = SealedFile.open(local, record.ledger_id)
            assert sealed is not None, f"ledger {record.ledger_id} is neither offloaded nor whole locally"
            assert len(sealed.walk()[0]) == record.entries
            sealed.close()
