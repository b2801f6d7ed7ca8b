"""The read seam: a sealed ledger whose local file is gone is read from its bucket object,
on both drivers (a directory, and a real S3 server), with every CRC check kept.

A ledger is written, sealed, uploaded (``upload_sealed``: copied and read back), its local
file dropped (``drop_local``); reads, ``info`` and ``last_add_confirmed`` then come from
the bucket through the block cache, in the writing store and in a read-only store on a
root that does not exist (a Spark executor). A missing object is ``LedgerNotFoundError``;
a truncated, cut or altered one is refused and nothing of it is served.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ledger.errors import (
    CorruptEntryError,
    CorruptLedgerError,
    LedgerNotFoundError,
    ObjectMismatchError,
)
from ledger.storage.base import SyncPolicy
from ledger.storage.bucket import LedgerBucket, ledger_object_name
from ledger.storage.byte_source import BlockCache
from ledger.storage.file import FileLedgerStore
from ledger.storage.object_fs import BucketConfig
from ledger.storage.record import HEADER
from ledger.storage.sealed_writer import write_sealed_ledger

ENTRIES = [f"entry-{index:04d}-".encode() * (1 + index % 7) for index in range(300)]


@pytest.fixture(params=["filesystem", "aws-s3"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> BucketConfig:
    if request.param == "filesystem":
        return BucketConfig("filesystem", str(tmp_path / "bucket"), "cluster-a")
    s3: BucketConfig = request.getfixturevalue("s3_bucket")
    return BucketConfig(s3.driver, s3.bucket, "cluster-a", s3.endpoint, s3.region)


@pytest.fixture
def store(tmp_path: Path, bucket: BucketConfig) -> Iterator[FileLedgerStore]:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.NONE, bucket=bucket,
                            read_cache_bytes=256 * 1024)
    yield store
    store.shutdown()


def _sealed(store: FileLedgerStore, entries: list[bytes] = ENTRIES) -> int:
    ledger_id = store.create({"k": "v"})
    for entry in entries:
        store.append(ledger_id, entry).result()
    store.close(ledger_id)
    return ledger_id


def _offloaded(store: FileLedgerStore) -> int:
    ledger_id = _sealed(store)
    size, crc = store.upload_sealed(ledger_id)
    assert size == os.path.getsize(os.path.join(store.root, f"{ledger_id:020d}.ledger")) and crc
    store.drop_local(ledger_id)
    assert store.list() == []
    return ledger_id


def _object(bucket: BucketConfig, ledger_id: int) -> tuple[pa.fs.FileSystem, str, bytes]:
    fs = bucket.open()
    path = f"{bucket.base}/{ledger_object_name(ledger_id)}"
    with fs.open_input_stream(path) as reader:
        return fs, path, reader.read()


def _replace(bucket: BucketConfig, ledger_id: int, data: bytes) -> None:
    fs, path, _ = _object(bucket, ledger_id)
    with fs.open_output_stream(path) as writer:
        writer.write(data)


def _fresh(tmp_path: Path, bucket: BucketConfig) -> FileLedgerStore:
    """A read-only store with no data dir at all (a Spark executor's)."""
    return FileLedgerStore(str(tmp_path / "no-such-dir"), read_only=True, bucket=bucket, read_cache_bytes=1 << 20)


def test_an_offloaded_ledger_reads_back_from_the_bucket_in_the_writer_and_in_a_store_without_data_dir(
    tmp_path: Path, store: FileLedgerStore, bucket: BucketConfig,
) -> None:
    ledger_id = _sealed(store)
    assert store.read(ledger_id, 0, 9) == ENTRIES[:10]  # loaded from the local file
    store.upload_sealed(ledger_id)
    store.drop_local(ledger_id)
    assert not os.path.exists(os.path.join(store.root, f"{ledger_id:020d}.ledger"))
    assert store.read(ledger_id, 0, len(ENTRIES) - 1) == ENTRIES  # the loaded ledger goes on from the bucket
    info = store.info(ledger_id)
    assert (info.sealed, info.entries, info.size_bytes, dict(info.metadata)) == (
        True, len(ENTRIES), sum(map(len, ENTRIES)), {"k": "v"})
    executor = _fresh(tmp_path, bucket)
    try:
        assert not os.path.exists(executor.root) and executor.list() == []
        assert executor.last_add_confirmed(ledger_id) == len(ENTRIES) - 1
        assert executor.read(ledger_id, 5, 205) == ENTRIES[5:206]
        assert executor.info(ledger_id).size_bytes == sum(map(len, ENTRIES))
        sealed = executor.open_sealed(ledger_id)
        assert sealed is not None
        offsets, lengths = sealed.walk()
        assert sealed.read(range(len(ENTRIES)), offsets, lengths) == ENTRIES
        sealed.close()
    finally:
        executor.shutdown()
    assert not os.path.exists(executor.root)


def test_a_reopened_writable_store_reads_the_bucket_copy(tmp_path: Path, store: FileLedgerStore,
                                                          bucket: BucketConfig) -> None:
    ledger_id = _offloaded(store)
    store.shutdown()
    reopened = FileLedgerStore(store.root, sync=SyncPolicy.NONE, bucket=bucket)
    try:
        assert reopened.read(ledger_id, 0, len(ENTRIES) - 1) == ENTRIES
        assert reopened.create() > ledger_id  # ids never reused, though the file is gone
    finally:
        reopened.shutdown()


def test_the_block_cache_stays_within_its_bound_and_serves_repeated_reads(store: FileLedgerStore) -> None:
    ledger_id = _sealed(store, [bytes([index % 251]) * 40_000 for index in range(40)])  # ~1.6 MB
    store.upload_sealed(ledger_id)
    store.drop_local(ledger_id)
    cache = BlockCache(3 * 65536, block_bytes=65536)
    reader = FileLedgerStore(store.root, read_only=True, bucket=store.bucket)
    reader._bucket = LedgerBucket(store.bucket, cache)  # type: ignore[arg-type]  # small blocks, to count them
    try:
        for _ in range(2):
            assert [entry[0] for entry in reader.read(ledger_id, 0, 39)] == [index % 251 for index in range(40)]
            assert cache.used_bytes <= cache.capacity_bytes
        hits = cache.hits
        reader.read(ledger_id, 39, 39)
        reader.read(ledger_id, 39, 39)
        assert cache.hits > hits
    finally:
        reader.shutdown()


def test_a_missing_object_is_not_found(tmp_path: Path, store: FileLedgerStore, bucket: BucketConfig) -> None:
    ledger_id = _offloaded(store)
    fs, path, _ = _object(bucket, ledger_id)
    fs.delete_file(path)
    reader = _fresh(tmp_path, bucket)
    try:
        with pytest.raises(LedgerNotFoundError):
            reader.read(ledger_id, 0, 0)
        assert reader.open_sealed(ledger_id) is None
    finally:
        reader.shutdown()


@pytest.mark.parametrize("cut", ["truncated", "no-seal", "empty"])
def test_a_truncated_object_is_refused(tmp_path: Path, store: FileLedgerStore, bucket: BucketConfig,
                                       cut: str) -> None:
    ledger_id = _offloaded(store)
    data = _object(bucket, ledger_id)[2]
    _replace(bucket, ledger_id, {"truncated": data[: len(data) // 2], "no-seal": data[:-1], "empty": b""}[cut])
    reader = _fresh(tmp_path, bucket)
    try:
        with pytest.raises(CorruptLedgerError):
            reader.read(ledger_id, 0, 0)
        with pytest.raises(CorruptLedgerError):
            reader.info(ledger_id)
        with pytest.raises(CorruptLedgerError):
            reader.open_sealed(ledger_id)
    finally:
        reader.shutdown()


def test_an_altered_entry_is_never_served_and_the_others_still_are(tmp_path: Path, store: FileLedgerStore,
                                                                   bucket: BucketConfig) -> None:
    ledger_id = _offloaded(store)
    data = bytearray(_object(bucket, ledger_id)[2])
    at = data.index(ENTRIES[150]) + 3  # inside entry 150's payload
    data[at] ^= 0x40
    _replace(bucket, ledger_id, bytes(data))
    reader = _fresh(tmp_path, bucket)
    try:
        with pytest.raises(CorruptEntryError) as failure:
            reader.read(ledger_id, 100, 200)
        assert failure.value.entry_id == 150
        with pytest.raises(CorruptEntryError):  # again: the damaged block is not kept as good
            reader.read(ledger_id, 150, 150)
        assert reader.read(ledger_id, 0, 149) == ENTRIES[:150]
        assert reader.read(ledger_id, 151, len(ENTRIES) - 1) == ENTRIES[151:]
    finally:
        reader.shutdown()


@pytest.mark.parametrize("where", ["magic", "meta", "record-header", "seal"])
def test_an_object_altered_outside_its_payloads_is_refused(tmp_path: Path, store: FileLedgerStore,
                                                          bucket: BucketConfig, where: str) -> None:
    ledger_id = _offloaded(store)
    data = bytearray(_object(bucket, ledger_id)[2])
    at = {"magic": 2, "meta": 20, "record-header": data.index(ENTRIES[42]) - HEADER.size, "seal": len(data) - 3}[where]
    data[at] ^= 0x7F
    _replace(bucket, ledger_id, bytes(data))
    reader = _fresh(tmp_path, bucket)
    try:
        with pytest.raises(CorruptLedgerError):
            reader.read(ledger_id, 0, len(ENTRIES) - 1)
    finally:
        reader.shutdown()


def test_delete_removes_the_local_file_its_sidecar_and_the_bucket_objects(store: FileLedgerStore,
                                                                           bucket: BucketConfig) -> None:
    ledger_id = _sealed(store)
    path = os.path.join(store.root, f"{ledger_id:020d}.ledger")
    with open(path + ".kidx", "wb") as sidecar:
        sidecar.write(b"index")
    store.upload_sealed(ledger_id)
    fs = bucket.open()
    names = [f"{bucket.base}/{ledger_object_name(ledger_id, suffix)}" for suffix in ("", ".kidx")]
    assert all(fs.get_file_info(name).type == pa.fs.FileType.File for name in names)
    store.delete(ledger_id)
    assert not os.path.exists(path) and not os.path.exists(path + ".kidx")
    assert all(fs.get_file_info(name).type == pa.fs.FileType.NotFound for name in names)
    with pytest.raises(LedgerNotFoundError):
        store.read(ledger_id, 0, 0)


def test_a_sidecar_is_read_from_the_bucket_by_parquet(tmp_path: Path, store: FileLedgerStore,
                                                     bucket: BucketConfig) -> None:
    ledger_id = _sealed(store)
    path = os.path.join(store.root, f"{ledger_id:020d}.ledger")
    table = pa.table({"key": [f"k{index}" for index in range(1000)], "entry": list(range(1000))})
    pq.write_table(table, path + ".kidx")
    store.upload_sealed(ledger_id)
    store.drop_local(ledger_id)
    assert not os.path.exists(path + ".kidx")
    reader = _fresh(tmp_path, bucket)
    try:
        sidecar = reader.open_sidecar(ledger_id, ".kidx")
        assert sidecar is not None
        assert pq.read_table(sidecar).equals(table)
        assert reader.open_sidecar(ledger_id + 1, ".kidx") is None
    finally:
        reader.shutdown()


def test_an_upload_whose_copy_differs_is_refused_and_the_local_file_is_kept(
    store: FileLedgerStore, bucket: BucketConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger_id = _sealed(store)
    real_upload = LedgerBucket.upload

    def altering(self: LedgerBucket, local_path: str, name: str) -> None:  # a store that flips a bit
        real_upload(self, local_path, name)
        fs = self.fs
        with fs.open_input_stream(self.path(name)) as reader:
            data = bytearray(reader.read())
        data[len(data) // 2] ^= 1
        with fs.open_output_stream(self.path(name)) as writer:
            writer.write(bytes(data))

    monkeypatch.setattr(LedgerBucket, "upload", altering)
    with pytest.raises(ObjectMismatchError, match="CRC32C"):
        store.upload_sealed(ledger_id)
    monkeypatch.undo()
    _replace(bucket, ledger_id, b"short")
    with pytest.raises(ObjectMismatchError):
        store.drop_local(ledger_id)  # the bucket's copy is not the file's size: kept
    assert store.list() == [ledger_id]
    assert store.read(ledger_id, 0, len(ENTRIES) - 1) == ENTRIES


def test_an_open_ledger_is_never_uploaded(store: FileLedgerStore) -> None:
    ledger_id = store.create()
    store.append(ledger_id, b"x").result()
    with pytest.raises(Exception, match="not sealed"):
        store.upload_sealed(ledger_id)


def test_a_read_only_store_uploads_a_ledger_and_a_sidecar_it_wrote_elsewhere(
    tmp_path: Path, store: FileLedgerStore, bucket: BucketConfig,
) -> None:
    ledger_id = _sealed(store)
    store.shutdown()
    scratch = FileLedgerStore(store.root, read_only=True, bucket=bucket)  # an executor's scratch dir
    index = tmp_path / "built.kidx"
    index.write_bytes(b"an index of a ledger only in the bucket")
    scratch.upload_sealed(ledger_id)
    scratch.upload_sidecar(ledger_id, ".kidx", str(index))
    scratch.shutdown()
    reader = _fresh(tmp_path, bucket)
    try:
        assert reader.read(ledger_id, 0, len(ENTRIES) - 1) == ENTRIES
        sidecar = reader.open_sidecar(ledger_id, ".kidx")
        assert sidecar is not None and sidecar.read() == index.read_bytes()
    finally:
        reader.shutdown()


def test_a_ledger_written_whole_into_the_bucket_is_adopted_from_its_layout(tmp_path: Path, store: FileLedgerStore,
                                                                         bucket: BucketConfig) -> None:
    ledger_id = store.reserve_ids(1)[0]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    written = write_sealed_ledger(str(scratch), ledger_id, {"role": "compacted"}, ENTRIES, created_at_ms=1)
    executor = FileLedgerStore(str(scratch), read_only=True, bucket=bucket)
    executor.upload_sealed(ledger_id)
    executor.shutdown()
    wrong = array("q", written.entry_lengths)
    wrong[0] += 1
    assert not store.adopt_sealed(ledger_id, written.entry_offsets, wrong)  # a layout that does not match
    assert store.adopt_sealed(ledger_id, written.entry_offsets, written.entry_lengths)
    assert store.read(ledger_id, 0, len(ENTRIES) - 1) == ENTRIES
    assert dict(store.info(ledger_id).metadata) == {"role": "compacted"}


def test_a_store_whose_bucket_is_down_still_serves_its_local_ledgers(tmp_path: Path) -> None:
    down = BucketConfig("aws-s3", "unreachable", endpoint="http://127.0.0.1:1", region="us-east-1")
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.NONE, bucket=down)
    try:
        ledger_id = _sealed(store, ENTRIES[:5])
        assert store.read(ledger_id, 0, 4) == ENTRIES[:5]
        empty = store.create()
        store.close(empty)
        store.delete(empty)  # never offloaded (empty): the bucket is not asked
        open_one = store.create()
        store.append(open_one, b"x").result()
        store.delete(open_one)
        assert store.list() == [ledger_id]
    finally:
        store.shutdown()


def test_a_reader_in_another_process_goes_on_from_the_bucket_once_the_owner_drops_the_file(
    store: FileLedgerStore, bucket: BucketConfig,
) -> None:
    first, second = _sealed(store), _sealed(store, ENTRIES[:3])
    reader = FileLedgerStore(store.root, read_only=True, bucket=bucket, max_open_files=1)  # a worker's view
    try:
        assert reader.read(first, 0, 0) == ENTRIES[:1]  # loaded from the local file
        assert reader.read(second, 0, 2) == ENTRIES[:3]  # its descriptor closes the first's
        store.upload_sealed(first)
        store.drop_local(first)
        assert reader.read(first, 0, len(ENTRIES) - 1) == ENTRIES
        assert reader.info(first).entries == len(ENTRIES)
    finally:
        reader.shutdown()
