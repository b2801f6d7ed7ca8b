"""Backups in object storage (``ledger.backup_bucket``), on the real moto S3 server behind the
fault proxy, and on the filesystem driver: a backup uploads and restores every confirmed
entry; a transient 503 during the upload is retried; the manifest object is written last,
so an upload cut short is refused as incomplete; a missing, altered or extra object is
refused at restore by name and no data dir is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from ledger.backup import (
    MANIFEST,
    BackupError,
    remove_staged,
    restore_backup,
    stage_backup,
    take_backup,
    tar_chunks,
)
from ledger.backup_bucket import restore_from_bucket, upload_backup, verify_bucket_backup
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.storage import SyncPolicy
from ledger.storage.object_fs import BucketConfig
from tests.s3_fault_proxy import Fault, FaultProxy
from tests.s3_server import S3Server

TOPIC = "persistent://public/default/backed-up-to-a-bucket"
VALUES = range(10)  # two sealed ledgers of 4, an open one holding 2


def _open_topic(data_dir: DataDir) -> ManagedLedger:
    return ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, ManagedLedgerConfig(max_entries_per_ledger=4))


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[DataDir]:
    opened = DataDir.open(str(tmp_path / "data"), sync=SyncPolicy.ALWAYS)
    ledger = _open_topic(opened)
    for value in VALUES:
        ledger.append(b"v%d" % value).result(timeout=10)
    yield opened
    ledger.close()
    opened.close()


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint) as running:
        yield running


@pytest.fixture(params=["aws-s3", "filesystem"])
def bucket(request: pytest.FixtureRequest, s3_server: S3Server, proxy: FaultProxy, tmp_path: Path) -> BucketConfig:
    if request.param == "filesystem":
        return BucketConfig("filesystem", str(tmp_path / "bucket"), "backups/one")
    created = s3_server.bucket(endpoint=proxy.endpoint)
    return BucketConfig("aws-s3", created.bucket, "backups/one", created.endpoint, created.region)


def _upload(data_dir: DataDir, bucket: BucketConfig) -> dict:
    staged = stage_backup(data_dir)
    try:
        return upload_backup(tar_chunks(staged), bucket)
    finally:
        remove_staged(staged)


def _restored_entries(path: Path) -> list[bytes]:
    restored = DataDir.open(str(path))
    try:
        ledger = _open_topic(restored)
        entries = [entry.data for entry in ledger.read_entries(ledger.first_position(), 1000)]
        ledger.close()
        return entries
    finally:
        restored.close()


def _object(bucket: BucketConfig, relative: str) -> str:
    return f"{bucket.base}/{relative}"


def test_a_backup_in_a_bucket_restores_every_confirmed_entry(data_dir: DataDir, bucket: BucketConfig,
                                                             tmp_path: Path) -> None:
    manifest = _upload(data_dir, bucket)
    assert any(entry["path"].startswith("ledgers/") for entry in manifest["files"])
    assert verify_bucket_backup(bucket) == manifest
    restored = restore_from_bucket(bucket, str(tmp_path / "restored"))
    assert restored == manifest
    assert _restored_entries(tmp_path / "restored") == [b"v%d" % value for value in VALUES]
    assert not list(tmp_path.glob("restored.restoring-*"))


def test_a_transient_503_during_the_upload_is_retried(data_dir: DataDir, s3_server: S3Server, proxy: FaultProxy,
                                                      tmp_path: Path) -> None:
    bucket = s3_server.bucket(endpoint=proxy.endpoint, prefix="retried")
    proxy.inject(Fault.STATUS, status=503, method="PUT", path=r"/ledgers/", times=2)
    proxy.inject(Fault.RESET, method="PUT", path=r"/metadata\.db")
    _upload(data_dir, bucket)
    assert len(proxy.faults(Fault.STATUS)) == 2 and len(proxy.faults(Fault.RESET)) == 1
    restore_from_bucket(bucket, str(tmp_path / "restored"))
    assert _restored_entries(tmp_path / "restored") == [b"v%d" % value for value in VALUES]


def test_an_upload_cut_short_has_no_manifest_and_is_refused(data_dir: DataDir, s3_server: S3Server,
                                                            proxy: FaultProxy, tmp_path: Path) -> None:
    bucket = s3_server.bucket(endpoint=proxy.endpoint, prefix="cut")
    proxy.inject(Fault.STATUS, status=500, method="PUT", path=r"/ledgers/", times=1000)
    with pytest.raises(BackupError, match=f"incomplete \\(no {MANIFEST}\\)"):
        _upload(data_dir, bucket)
    proxy.clear()
    fs = bucket.open()
    assert fs.get_file_info(_object(bucket, "metadata.db")).size > 0  # uploaded before the faults
    assert not fs.get_file_info(_object(bucket, MANIFEST)).is_file
    with pytest.raises(BackupError, match=f"not a complete compactd backup: it has no {MANIFEST}"):
        restore_from_bucket(bucket, str(tmp_path / "restored"))
    with pytest.raises(BackupError, match="is not empty"):  # never written over
        _upload(data_dir, bucket)
    assert not (tmp_path / "restored").exists()


@pytest.mark.parametrize("damage", ["altered", "missing", "extra", "truncated"])
def test_a_damaged_backup_in_a_bucket_is_refused_by_name(data_dir: DataDir, bucket: BucketConfig, tmp_path: Path,
                                                         damage: str) -> None:
    manifest = _upload(data_dir, bucket)
    fs = bucket.open()
    victim = next(entry["path"] for entry in manifest["files"] if entry["path"].startswith("ledgers/000"))
    name = _object(bucket, victim)
    with fs.open_input_stream(name) as source:
        data = bytearray(source.read())
    if damage == "altered":
        data[-5] ^= 0x01
    elif damage == "truncated":
        del data[len(data) // 2:]
    if damage == "missing":
        fs.delete_file(name)
    elif damage == "extra":
        victim = "ledgers/99999999999999999999.ledger"
        with fs.open_output_stream(_object(bucket, victim)) as sink:
            sink.write(bytes(data))
    else:
        with fs.open_output_stream(name) as sink:
            sink.write(bytes(data))
    expected = {"altered": "does not match its SHA-256", "truncated": "bytes, its manifest says",
                "missing": "is incomplete", "extra": "is not in its manifest"}[damage]
    with pytest.raises(BackupError, match=f"{victim}.*{expected}|{expected}.*{victim}"):
        restore_from_bucket(bucket, str(tmp_path / "restored"))
    with pytest.raises(BackupError, match=expected):
        verify_bucket_backup(bucket)
    assert not (tmp_path / "restored").exists()
    assert not list(tmp_path.glob("restored.restoring-*"))


def test_a_backup_is_never_written_over_another(data_dir: DataDir, bucket: BucketConfig) -> None:
    _upload(data_dir, bucket)
    with pytest.raises(BackupError, match="already holds a backup"):
        _upload(data_dir, bucket)


def test_a_restore_never_writes_into_a_data_dir_in_use(data_dir: DataDir, bucket: BucketConfig,
                                                       tmp_path: Path) -> None:
    _upload(data_dir, bucket)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "something").write_text("kept")
    with pytest.raises(BackupError, match="not empty"):
        restore_from_bucket(bucket, str(tmp_path / "busy"))
    assert (tmp_path / "busy" / "something").read_text() == "kept"


def _offload_sealed(ledger: ManagedLedger, data_dir: DataDir) -> list[int]:
    """Offload every sealed ledger of ``ledger`` and let its local copy go, as
    ``ledger.offload`` does (upload and verify, record, record the deletion, drop)."""
    files = data_dir.ledgers.file_powers()
    assert files is not None
    sealed = [record.ledger_id for record in ledger.ledger_list() if record.closed_at_ms]
    for ledger_id in sealed:
        files.upload_sealed(ledger_id)
        assert ledger.record_offloaded(ledger_id, 1)
    assert ledger.record_local_deleted(sealed, 2) == sealed
    for ledger_id in sealed:
        files.drop_local(ledger_id)
    return sealed


@pytest.mark.parametrize("target", ["directory", "bucket"])
def test_ledgers_offloaded_and_gone_locally_are_in_the_backup(s3_server: S3Server, tmp_path: Path,
                                                             target: str) -> None:
    offload = s3_server.bucket(prefix="cluster")
    data = DataDir.open(str(tmp_path / "data"), sync=SyncPolicy.ALWAYS, bucket=offload)
    ledger = _open_topic(data)
    for value in VALUES:
        ledger.append(b"v%d" % value).result(timeout=10)
    offloaded = _offload_sealed(ledger, data)
    assert len(offloaded) == 2 and not any((tmp_path / "data" / "ledgers").glob(f"{offloaded[0]:020d}*"))
    if target == "directory":
        take_backup(data, str(tmp_path / "backup"))
        restore_backup(str(tmp_path / "backup"), str(tmp_path / "restored"))
    else:
        backups = s3_server.bucket(prefix="backups")
        _upload(data, backups)
        restore_from_bucket(backups, str(tmp_path / "restored"))
    fs = offload.open()
    assert not fs.get_file_info(pafs.FileSelector(f"{offload.base}/backup-staging", recursive=True,
                                                  allow_not_found=True))  # the pinned copies are gone
    ledger.close()
    data.close()
    for ledger_id in offloaded:  # the restored data dir holds them locally, no longer marked offloaded
        assert (tmp_path / "restored" / "ledgers" / f"{ledger_id:020d}.ledger").is_file()
    assert _restored_entries(tmp_path / "restored") == [b"v%d" % value for value in VALUES]
    restored = DataDir.open(str(tmp_path / "restored"))
    try:
        records = _open_topic(restored).ledger_list()
        assert [record.offloaded or record.local_deleted for record in records] == [False] * len(records)
    finally:
        restored.close()


def test_an_offline_backup_without_the_offload_bucket_is_refused_by_name(s3_server: S3Server, tmp_path: Path) -> None:
    data = DataDir.open(str(tmp_path / "data"), sync=SyncPolicy.ALWAYS, bucket=s3_server.bucket())
    ledger = _open_topic(data)
    for value in VALUES:
        ledger.append(b"v%d" % value).result(timeout=10)
    first = _offload_sealed(ledger, data)[0]
    ledger.close()
    data.close()
    unaware = DataDir.open(str(tmp_path / "data"))
    try:
        with pytest.raises(BackupError, match=f"ledger {first} .* lives only in its offload bucket.*--admin-url"):
            take_backup(unaware, str(tmp_path / "backup"))
    finally:
        unaware.close()


def test_ledgers_kept_only_in_the_bucket_by_the_layers_above_are_in_the_backup_and_broken_orphans_are_not(
        s3_server: S3Server, tmp_path: Path) -> None:
    """A sealed ledger written whole into the bucket with no ledger-layer record (what a Spark
    run through a bucket writes as a compacted view: its manifest is the compactor's) is in
    the backup; an object that is not a whole sealed ledger (a failed upload's orphan) is not."""
    offload = s3_server.bucket(prefix="cluster")
    data = DataDir.open(str(tmp_path / "data"), sync=SyncPolicy.ALWAYS, bucket=offload)
    files = data.ledgers.file_powers()
    assert files is not None
    kept = data.ledgers.create({"component": "compacted-ledger"})
    for value in VALUES:
        data.ledgers.append(kept, b"c%d" % value).result(timeout=10)
    data.ledgers.close(kept)
    files.upload_sealed(kept)
    assert files.drop_local(kept)
    broken = kept + 1000
    with offload.open().open_output_stream(f"{offload.base}/ledgers/{broken:020d}") as sink:
        sink.write(b"not a ledger")
    take_backup(data, str(tmp_path / "backup"))
    data.close()
    restore_backup(str(tmp_path / "backup"), str(tmp_path / "restored"))
    assert not (tmp_path / "restored" / "ledgers" / f"{broken:020d}.ledger").exists()
    restored = DataDir.open(str(tmp_path / "restored"))
    try:
        entries = restored.ledgers.read(kept, 0, len(VALUES) - 1)
        assert [bytes(entry) for entry in entries] == [b"c%d" % value for value in VALUES]
    finally:
        restored.close()
