"""``ledger.offload``: Pulsar's offload rules on a real managed ledger over a file store
with a bucket (a directory; the S3 flow once on a real S3 server) and a real SQLite
metadata store.

Each rule is shown by what it selects or keeps: asyncOffloadPrefix's prefix (strictly
before the ledger of the position, never the current one, already offloaded ones
skipped, an invalid position an ERROR), maybeOffload's threshold (newest to oldest,
offloaded bytes counted, 0 = every closed ledger, negative = off), the deletion lag (from
the offload time; recorded before the file goes), orphan collection after the grace
period, backoff retries of transient bucket errors, and reads across offloaded and local
ledgers before and after the data dir is reopened.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from cursor import InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.errors import LedgerIOError, OffloadAlreadyRunning
from ledger.job_status import JobStatus
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.offload import Offloader, OffloadProgress, OffloadRetry
from ledger.position import Position
from ledger.storage.base import SyncPolicy
from ledger.storage.bucket import LedgerBucket, ledger_object_name
from ledger.storage.byte_source import BlockCache
from ledger.storage.file import FileLedgerStore
from ledger.storage.object_fs import BucketConfig

TOPIC = "persistent://public/default/offload"
ENTRIES_PER_LEDGER = 10
ENTRY_BYTES = 100
LEDGER_BYTES = ENTRIES_PER_LEDGER * ENTRY_BYTES
FAST_RETRY = OffloadRetry(tries_max=3, backoff_first_s=0.01, backoff_max_s=0.02)
BOUND_S = 30.0


class Clock:
    """Wall time plus what the test adds (object times in the bucket are wall time)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


@dataclass
class Topic:
    root: Path
    bucket: BucketConfig
    store: FileLedgerStore
    metadata: MetadataStore
    ledger: ManagedLedger
    offloader: Offloader
    clock: Clock

    def ids(self) -> list[int]:
        return [record.ledger_id for record in self.ledger.ledger_list()]

    def offloaded(self) -> list[int]:
        return [record.ledger_id for record in self.metadata.topic_ledgers(TOPIC) if record.offloaded]

    def local_file(self, ledger_id: int) -> str:
        return os.path.join(self.store.root, f"{ledger_id:020d}.ledger")

    def objects(self) -> list[str]:
        return [found.name for found in LedgerBucket(self.bucket, BlockCache(0)).objects()]

    def reopen(self) -> None:
        self.offloader.shutdown()
        self.ledger.close()
        self.store.shutdown()
        self.metadata.close()
        self.store, self.metadata, self.ledger, self.offloader = _open(self.root, self.bucket, self.clock)


def _entry(index: int) -> bytes:
    return (b"%08d-" % index).ljust(ENTRY_BYTES, b"x")


def _open(root: Path, bucket: BucketConfig, clock: Clock, *,
          retry: OffloadRetry = FAST_RETRY) -> tuple[FileLedgerStore, MetadataStore, ManagedLedger, Offloader]:
    store = FileLedgerStore(str(root / "ledgers"), sync=SyncPolicy.NONE, bucket=bucket)
    metadata = MetadataStore(str(root / "metadata.db"))
    ledger = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=ENTRIES_PER_LEDGER),
                                clock=clock)
    return store, metadata, ledger, Offloader(store, metadata, clock=clock, retry=retry)


def _topic(root: Path, bucket: BucketConfig, sealed_ledgers: int = 4) -> Topic:
    clock = Clock()
    store, metadata, ledger, offloader = _open(root, bucket, clock)
    futures = [ledger.append(_entry(index)) for index in range(sealed_ledgers * ENTRIES_PER_LEDGER + 3)]
    for future in futures:
        future.result(timeout=BOUND_S)
    return Topic(root, bucket, store, metadata, ledger, offloader, clock)


@pytest.fixture
def topic(tmp_path: Path) -> Iterator[Topic]:
    made = _topic(tmp_path / "data", BucketConfig("filesystem", str(tmp_path / "bucket"), "c1"))
    yield made
    made.offloader.shutdown()
    made.ledger.close()
    made.store.shutdown()
    made.metadata.close()


def _admin_done(topic: Topic) -> OffloadProgress:
    deadline = time.monotonic() + BOUND_S
    while (progress := topic.offloader.status(TOPIC)).status is JobStatus.RUNNING:
        assert time.monotonic() < deadline, "the offload job never finished"
        time.sleep(0.01)
    return progress


def _all_entries(ledger: ManagedLedger) -> list[bytes]:
    first = ledger.ledger_list()[0].ledger_id
    return [entry.data for entry in ledger.read_entries(Position(first, 0), 10_000)]


# -- asyncOffloadPrefix ---------------------------------------------------------------------


def test_status_is_not_run_until_an_admin_offload_and_a_prefix_stops_before_the_given_ledger(topic: Topic) -> None:
    assert topic.offloader.status(TOPIC) == OffloadProgress(JobStatus.NOT_RUN)
    l1, l2, l3, _l4, current = topic.ids()
    topic.offloader.offload_prefix(topic.ledger, Position(l3, 4))
    assert _admin_done(topic) == OffloadProgress(JobStatus.SUCCESS, "", Position(l3, 0))
    assert topic.offloaded() == [l1, l2]
    assert [record.offloaded for record in topic.ledger.ledger_list()] == [True, True, False, False, False]
    assert topic.objects() == [ledger_object_name(l1), ledger_object_name(l2)]
    assert os.path.exists(topic.local_file(l1))  # the local copy stays until the lag passes
    assert current not in topic.offloaded()


def test_the_current_ledger_is_never_offloaded_and_offloaded_ones_are_skipped(topic: Topic) -> None:
    l1, l2, l3, l4, current = topic.ids()
    topic.offloader.offload_prefix(topic.ledger, Position(l2, 0))
    _admin_done(topic)
    first_copy = pafs.LocalFileSystem().get_file_info(f"{topic.bucket.base}/{ledger_object_name(l1)}").mtime_ns
    topic.offloader.offload_prefix(topic.ledger, Position(current, 2))
    assert _admin_done(topic) == OffloadProgress(JobStatus.SUCCESS, "", Position(current, 0))
    assert topic.offloaded() == [l1, l2, l3, l4]
    again = pafs.LocalFileSystem().get_file_info(f"{topic.bucket.base}/{ledger_object_name(l1)}").mtime_ns
    assert again == first_copy  # not uploaded again


@pytest.mark.parametrize("position", [Position(999, 0), "past-last", "negative"])
def test_an_invalid_position_ends_the_job_in_error_and_offloads_nothing(topic: Topic, position: object) -> None:
    current = topic.ids()[-1]
    target = {"past-last": Position(current, 3), "negative": Position(current, -1)}.get(position, position)  # type: ignore[call-overload]
    topic.offloader.offload_prefix(topic.ledger, target)
    progress = _admin_done(topic)
    assert progress.status is JobStatus.ERROR
    assert f"Invalid position for offload: {target.ledger_id}:{target.entry_id}" in progress.last_error
    assert topic.offloaded() == [] and topic.objects() == []


def test_a_second_admin_offload_while_one_runs_is_refused(topic: Topic, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = FileLedgerStore.upload_sealed

    def slow(self: FileLedgerStore, ledger_id: int) -> tuple[int, int]:  # a slow bucket
        release.wait(BOUND_S)
        return real(self, ledger_id)

    monkeypatch.setattr(FileLedgerStore, "upload_sealed", slow)
    l1, l2 = topic.ids()[:2]
    topic.offloader.offload_prefix(topic.ledger, Position(l2, 0))
    assert topic.offloader.status(TOPIC).status is JobStatus.RUNNING
    with pytest.raises(OffloadAlreadyRunning):
        topic.offloader.offload_prefix(topic.ledger, Position(l2, 0))
    release.set()
    assert _admin_done(topic).status is JobStatus.SUCCESS
    assert topic.offloaded() == [l1]


# -- maybeOffload (threshold) -----------------------------------------------------------------


@pytest.mark.parametrize(("threshold", "kept_newest"), [
    (2 * LEDGER_BYTES + LEDGER_BYTES // 2, 2),  # the two newest closed ledgers fit; the rest goes
    (2 * LEDGER_BYTES, 2),  # "exceeds": a sum equal to the threshold is kept
    (0, 0),  # every closed ledger
    (100 * LEDGER_BYTES, 4),  # nothing over it
])
def test_the_threshold_keeps_the_newest_bytes_and_offloads_the_older_ledgers(
    topic: Topic, threshold: int, kept_newest: int,
) -> None:
    closed = topic.ids()[:-1]
    topic.offloader.maybe_offload(topic.ledger, threshold)
    assert topic.offloader.drain(BOUND_S)
    assert topic.offloaded() == closed[: len(closed) - kept_newest]
    assert topic.offloader.status(TOPIC).status is JobStatus.NOT_RUN  # the admin status is its own


def test_a_negative_threshold_offloads_nothing_and_offloaded_bytes_count_toward_it(topic: Topic) -> None:
    topic.offloader.maybe_offload(topic.ledger, -1)
    assert topic.offloader.drain(BOUND_S) and topic.offloaded() == []
    l1, l2, l3, l4 = topic.ids()[:-1]
    topic.offloader.offload_prefix(topic.ledger, Position(l4, 0))  # l1..l3 offloaded by hand
    _admin_done(topic)
    # Summed newest first, offloaded ones included: l4 alone is under 1.5 ledgers, so l4 stays.
    topic.offloader.maybe_offload(topic.ledger, LEDGER_BYTES + LEDGER_BYTES // 2)
    assert topic.offloader.drain(BOUND_S)
    assert topic.offloaded() == [l1, l2, l3]


# -- transient failures -------------------------------------------------------------------------


def test_transient_bucket_errors_are_retried_with_backoff(topic: Topic, monkeypatch: pytest.MonkeyPatch) -> None:
    real = LedgerBucket.upload
    calls: list[float] = []

    def flaky(self: LedgerBucket, local_path: str, name: str) -> None:  # 503s, then it answers
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise LedgerIOError(f"upload of {name}: HTTP 503 Slow Down")
        real(self, local_path, name)

    monkeypatch.setattr(LedgerBucket, "upload", flaky)
    l1, l2 = topic.ids()[:2]
    topic.offloader.offload_prefix(topic.ledger, Position(l2, 0))
    assert _admin_done(topic).status is JobStatus.SUCCESS
    assert topic.offloaded() == [l1]
    assert len(calls) == 3
    assert calls[2] - calls[1] >= calls[1] - calls[0] >= FAST_RETRY.backoff_first_s  # it backs off, doubling


def test_a_ledger_that_keeps_failing_ends_in_error_the_others_are_offloaded_nothing_half_recorded(
    topic: Topic, monkeypatch: pytest.MonkeyPatch,
) -> None:
    l1, l2, l3 = topic.ids()[:3]
    real = LedgerBucket.upload
    tries: list[str] = []

    def broken_for_l1(self: LedgerBucket, local_path: str, name: str) -> None:
        if name.startswith(ledger_object_name(l1)):
            tries.append(name)
            raise LedgerIOError("connection reset by peer")
        real(self, local_path, name)

    monkeypatch.setattr(LedgerBucket, "upload", broken_for_l1)
    topic.offloader.offload_prefix(topic.ledger, Position(l3, 0))
    progress = _admin_done(topic)
    assert progress.status is JobStatus.ERROR and "connection reset by peer" in progress.last_error
    assert len(tries) == FAST_RETRY.tries_max
    assert topic.offloaded() == [l2]
    assert topic.ledger.read_entries(Position(l1, 0), 1)[0].data == _entry(0)


def test_a_ledger_trimmed_while_it_was_uploaded_is_not_recorded_and_its_objects_go(topic: Topic) -> None:
    l1, l2 = topic.ids()[:2]

    def trimmed_meanwhile(**_: object) -> None:
        topic.metadata.fault_points.pop("ledgers.offloaded.before")
        topic.metadata.remove_ledgers([l1])

    topic.metadata.fault_points["ledgers.offloaded.before"] = trimmed_meanwhile
    topic.offloader.offload_prefix(topic.ledger, Position(l2, 0))
    _admin_done(topic)
    assert topic.offloaded() == [] and topic.objects() == []


# -- local copies and reads -------------------------------------------------------------------


def test_local_copies_go_after_the_lag_recorded_first_and_every_entry_reads_before_and_after_reopening(
    topic: Topic,
) -> None:
    l1, l2, l3 = topic.ids()[:3]
    expected = [_entry(index) for index in range(4 * ENTRIES_PER_LEDGER + 3)]
    topic.offloader.offload_prefix(topic.ledger, Position(l3, 0))
    _admin_done(topic)
    lag_ms = 60_000
    topic.clock.offset_s = 30
    assert topic.offloader.delete_local_copies(topic.ledger, lag_ms) == []
    assert os.path.exists(topic.local_file(l1))
    seen_at_record: list[tuple[bool, bool]] = []

    def at_record(**details: object) -> None:  # the record is committed, the file not yet removed
        ledger_id = details["ledger_ids"][0]  # type: ignore[index]
        seen_at_record.append((ledger_id in topic.metadata.local_deleted_ledger_ids(),
                               os.path.exists(topic.local_file(ledger_id))))

    topic.metadata.fault_points["ledgers.local_deleted.after"] = at_record
    topic.clock.offset_s = 61
    assert topic.offloader.delete_local_copies(topic.ledger, lag_ms) == [l1, l2]
    assert seen_at_record == [(True, True)]
    assert not os.path.exists(topic.local_file(l1)) and not os.path.exists(topic.local_file(l2))
    assert os.path.exists(topic.local_file(l3))
    assert [record.local_deleted for record in topic.ledger.ledger_list()] == [True, True, False, False, False]
    assert _all_entries(topic.ledger) == expected  # across offloaded and local ledgers
    topic.reopen()
    assert [(record.offloaded, record.local_deleted) for record in topic.ledger.ledger_list()][:3] == [
        (True, True), (True, True), (False, False)]
    assert _all_entries(topic.ledger) == expected
    futures = [topic.ledger.append(_entry(index)) for index in range(len(expected), len(expected) + 5)]
    assert [future.result(timeout=BOUND_S) for future in futures]
    assert _all_entries(topic.ledger) == [_entry(index) for index in range(len(expected) + 5)]


def test_trimming_an_offloaded_ledger_deletes_its_objects(topic: Topic) -> None:
    l1, l2 = topic.ids()[:2]
    topic.offloader.offload_prefix(topic.ledger, Position(l2, 0))
    _admin_done(topic)
    topic.clock.offset_s = 10
    topic.offloader.delete_local_copies(topic.ledger, 0)
    assert topic.objects() == [ledger_object_name(l1)]
    topic.ledger.delete()
    assert topic.objects() == []


# -- orphans ----------------------------------------------------------------------------------


def test_orphan_objects_go_after_the_grace_period_and_referenced_ones_stay(topic: Topic) -> None:
    l1, l2, l3, l4 = topic.ids()[:4]
    topic.offloader.offload_prefix(topic.ledger, Position(l2, 0))  # l1 recorded
    _admin_done(topic)
    topic.store.upload_sealed(l2)  # uploaded, never recorded (a crash before the record)
    topic.store.upload_sealed(l3)  # a ledger the layers above keep in the bucket
    topic.metadata.remove_ledgers([l4])
    topic.store.upload_sealed(l4)  # a trimmed ledger whose objects were left behind
    grace_ms = 3_600_000
    assert topic.offloader.collect_orphan_objects(grace_ms, also_live=[l3]) == []  # all young
    topic.clock.offset_s = grace_ms / 1000 + 5
    removed = topic.offloader.collect_orphan_objects(grace_ms, also_live=[l3])
    assert removed == [ledger_object_name(l2), ledger_object_name(l4)]
    assert topic.objects() == [ledger_object_name(l1), ledger_object_name(l3)]


# -- synchronous offload, shutdown, S3 --------------------------------------------------------


def test_offload_ledgers_is_synchronous_and_keeps_local_copies(topic: Topic) -> None:
    l1, _, l3 = topic.ids()[:3]
    topic.offloader.offload_ledgers(topic.ledger, [l3, l1])
    assert topic.offloaded() == [l1, l3]
    assert os.path.exists(topic.local_file(l1))
    assert topic.offloader.status(TOPIC).status is JobStatus.NOT_RUN


def test_shutdown_ends_a_job_waiting_out_its_backoff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _topic(tmp_path / "data", BucketConfig("filesystem", str(tmp_path / "bucket")))
    made.offloader.shutdown()
    made.offloader = Offloader(made.store, made.metadata, clock=made.clock,
                               retry=OffloadRetry(tries_max=50, backoff_first_s=30, backoff_max_s=30))

    def down(self: LedgerBucket, local_path: str, name: str) -> None:
        raise LedgerIOError("HTTP 500")

    monkeypatch.setattr(LedgerBucket, "upload", down)
    made.offloader.offload_prefix(made.ledger, Position(made.ids()[1], 0))
    started = time.monotonic()
    made.offloader.shutdown()
    assert time.monotonic() - started < BOUND_S / 2
    assert made.offloader.status(TOPIC).status is JobStatus.ERROR
    assert made.offloaded() == []
    made.ledger.close()
    made.store.shutdown()
    made.metadata.close()


def test_the_whole_flow_on_a_real_s3_server(tmp_path: Path, s3_bucket: BucketConfig) -> None:
    bucket = BucketConfig(s3_bucket.driver, s3_bucket.bucket, "cluster-a", s3_bucket.endpoint, s3_bucket.region)
    made = _topic(tmp_path / "data", bucket, sealed_ledgers=3)
    try:
        l1, l2, l3 = made.ids()[:3]
        expected = _all_entries(made.ledger)
        made.offloader.maybe_offload(made.ledger, 0)
        assert made.offloader.drain(BOUND_S)
        assert made.offloaded() == [l1, l2, l3]
        made.clock.offset_s = 1
        assert made.offloader.delete_local_copies(made.ledger, 0) == [l1, l2, l3]
        made.reopen()
        assert _all_entries(made.ledger) == expected
        made.clock.offset_s = 7200
        assert made.offloader.collect_orphan_objects(3_600_000) == []
        assert made.objects() == [ledger_object_name(ledger_id) for ledger_id in (l1, l2, l3)]
    finally:
        made.offloader.shutdown()
        made.ledger.close()
        made.store.shutdown()
        made.metadata.close()


def test_a_durable_cursor_consumes_across_offloaded_and_local_ledgers_and_resumes_after_reopening(
    topic: Topic,
) -> None:
    l1, l2, l3 = topic.ids()[:3]
    topic.offloader.offload_prefix(topic.ledger, Position(l3, 0))
    _admin_done(topic)
    topic.clock.offset_s = 1
    assert topic.offloader.delete_local_copies(topic.ledger, 0) == [l1, l2]
    cursor = ManagedCursor.open_durable(topic.ledger, "sub", InitialPosition.EARLIEST,
                                        store=CursorStore(topic.metadata.database))
    first = cursor.read_entries(15)  # all of l1 (bucket), half of l2 (bucket)
    assert [entry.data for entry in first] == [_entry(index) for index in range(15)]
    cursor.mark_delete(first[-1].position)
    topic.reopen()
    cursor = ManagedCursor.open_durable(topic.ledger, "sub", InitialPosition.EARLIEST,
                                        store=CursorStore(topic.metadata.database))
    rest = cursor.read_entries(100)  # the rest of l2 (bucket), then l3.. (local)
    assert [entry.data for entry in rest] == [_entry(index) for index in range(15, 4 * ENTRIES_PER_LEDGER + 3)]
    assert topic.ledger.trim() == [l1]  # consumed: trimmed, its objects with it
    assert topic.objects() == [ledger_object_name(l2)]


def test_an_admin_offload_while_a_threshold_job_runs_ends_in_error_and_a_deferred_threshold_run_follows(
    topic: Topic, monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    started = threading.Event()
    real = FileLedgerStore.upload_sealed

    def slow(self: FileLedgerStore, ledger_id: int) -> tuple[int, int]:
        started.set()
        release.wait(BOUND_S)
        return real(self, ledger_id)

    monkeypatch.setattr(FileLedgerStore, "upload_sealed", slow)
    l1, l2, l3, l4 = topic.ids()[:4]
    topic.offloader.maybe_offload(topic.ledger, 3 * LEDGER_BYTES)  # takes l1, then waits in its upload
    assert started.wait(BOUND_S)
    topic.offloader.offload_prefix(topic.ledger, Position(l3, 0))
    progress = _admin_done(topic)
    assert progress.status is JobStatus.ERROR and "Offload operation already running" in progress.last_error
    topic.offloader.maybe_offload(topic.ledger, 0)  # the mutex is busy: runs after the job that holds it
    release.set()
    assert topic.offloader.drain(BOUND_S)
    assert topic.offloaded() == [l1, l2, l3, l4]
    topic.offloader.forget(TOPIC)
    assert topic.offloader.status(TOPIC) == OffloadProgress(JobStatus.NOT_RUN)
