"""Kill -9 at every step of an offload: each ledger is offloaded-and-recorded or still
local-and-whole, every entry reads back, and orphan objects go after the grace period.

A real child process opens a data dir with a bucket, offloads every sealed ledger of a
topic (``Offloader.offload_ledgers``) and lets go of the local copies at once
(``delete_local_copies`` with a negative lag), and is killed with SIGKILL at one point of
the matrix, on the second ledger where the step is per ledger (so one ledger has gone all
the way through it):

* ``uploading``: the ``filesystem`` driver's temporary copy written, not renamed;
* ``after-upload``: the object complete, not yet read back (``LedgerBucket.verify``);
* ``after-verify``: verified, the metadata transaction not begun (``ledgers.offloaded.before``);
* ``after-commit``: recorded offloaded, nothing local deleted (``ledgers.offloaded.after``);
* ``before-local-record``: every ledger offloaded, ``local_deleted`` not recorded;
* ``after-local-record``: ``local_deleted`` committed, no file removed yet.

The kill points go through the metadata's fault seam (``Database.fault_points``) and, for
the bucket's own steps, by wrapping the child's ``os.replace`` and ``LedgerBucket.verify``
(the real upload cannot be made to die at a byte on cue). After the kill, in this process:
every ledger is either recorded offloaded with a whole object, or has its whole local
file; every entry reads back; orphan collection removes nothing young and, after the
grace period, exactly the objects no record references; a second pass converges (all
offloaded, all local copies gone) and a reopened data dir reads every entry again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.offload import Offloader, OffloadRetry
from ledger.position import Position
from ledger.storage.bucket import LedgerBucket
from ledger.storage.byte_source import BlockCache
from ledger.storage.object_fs import BucketConfig
from tests.offload_checks import assert_offloaded_or_whole

TOPIC = "persistent://public/default/offload-crash"
ENTRIES_PER_LEDGER = 10
SEALED_LEDGERS = 3
CHILD_BOUND_S = 60
GRACE_MS = 3_600_000
REPO = str(Path(__file__).resolve().parents[3])
POINTS = ["uploading", "after-upload", "after-verify", "after-commit", "before-local-record", "after-local-record"]
CONFIG = ManagedLedgerConfig(max_entries_per_ledger=ENTRIES_PER_LEDGER)

CHILD = """
import os, signal, sys
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.offload import Offloader, OffloadRetry
from ledger.storage.bucket import LedgerBucket
from ledger.storage.object_fs import BucketConfig

data, bucket_url, endpoint, topic, point, per_ledger = sys.argv[1:7]
bucket = BucketConfig.from_url(bucket_url, endpoint=endpoint or None, region="us-east-1" if endpoint else None)
data_dir = DataDir.open(data, bucket=bucket)
ledger = ManagedLedger.open(topic, data_dir.ledgers, data_dir.metadata, ManagedLedgerConfig(max_entries_per_ledger=int(per_ledger)))
calls = []

def die(*args, **details):
    calls.append(1)
    if len(calls) >= (1 if point.endswith("local-record") else 2):
        os.kill(os.getpid(), signal.SIGKILL)

if point == "uploading":
    real_replace = os.replace
    def replace(source, target):
        die()
        real_replace(source, target)
    os.replace = replace
elif point == "after-upload":
    real_verify = LedgerBucket.verify
    def verify(self, local_path, name):
        die()
        return real_verify(self, local_path, name)
    LedgerBucket.verify = verify
else:
    seam = {"after-verify": "ledgers.offloaded.before", "after-commit": "ledgers.offloaded.after",
            "before-local-record": "ledgers.local_deleted.before",
            "after-local-record": "ledgers.local_deleted.after"}[point]
    data_dir.metadata.fault_points[seam] = die
offloader = Offloader(data_dir.ledgers, data_dir.metadata, retry=OffloadRetry(tries_max=1))
offloader.offload_ledgers(ledger, [record.ledger_id for record in ledger.ledger_list()[:-1]])
offloader.delete_local_copies(ledger, -1)
print("not killed")
"""


def _entry(index: int) -> bytes:
    return b"entry-%06d-" % index * (1 + index % 5)


def _expected() -> list[bytes]:
    return [_entry(index) for index in range(SEALED_LEDGERS * ENTRIES_PER_LEDGER + 4)]


def _read_all(ledger: ManagedLedger) -> list[bytes]:
    first = ledger.ledger_list()[0].ledger_id
    return [entry.data for entry in ledger.read_entries(Position(first, 0), 10_000)]


def _prepare(data: Path, bucket: BucketConfig) -> None:
    data_dir = DataDir.open(str(data), bucket=bucket)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, CONFIG)
    for future in [ledger.append(entry) for entry in _expected()]:
        future.result(timeout=CHILD_BOUND_S)
    ledger.close()
    data_dir.close()


def _bucket(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> BucketConfig:
    if kind == "filesystem":
        return BucketConfig("filesystem", str(tmp_path / "bucket"))
    s3: BucketConfig = request.getfixturevalue("s3_bucket")
    return BucketConfig(s3.driver, s3.bucket, "crash", s3.endpoint, s3.region)


class Clock:
    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


@pytest.mark.slow
@pytest.mark.parametrize(("point", "kind"), [*((point, "filesystem") for point in POINTS),
                                             ("after-upload", "aws-s3"), ("after-commit", "aws-s3")])
def test_a_kill_at_any_step_of_an_offload_leaves_each_ledger_offloaded_or_whole(
    tmp_path: Path, request: pytest.FixtureRequest, point: str, kind: str,
) -> None:
    bucket = _bucket(kind, tmp_path, request)
    data = tmp_path / "data"
    _prepare(data, bucket)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(data), bucket.to_url(), bucket.endpoint or "", TOPIC, point,
         str(ENTRIES_PER_LEDGER)],
        env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, timeout=CHILD_BOUND_S, check=False)
    assert child.returncode == -signal.SIGKILL, child.stdout.decode() + child.stderr.decode()

    clock = Clock()
    data_dir = DataDir.open(str(data), bucket=bucket)
    try:
        data_dir.collect_orphans()
        assert_offloaded_or_whole(data_dir, bucket, TOPIC)
        ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, CONFIG)
        assert _read_all(ledger) == _expected()
        records = data_dir.metadata.topic_ledgers(TOPIC)
        recorded = {record.ledger_id for record in records if record.offloaded}
        if point in ("after-commit", "before-local-record", "after-local-record"):
            assert recorded  # the kill came after the first record
        if point == "after-local-record":
            assert any(record.local_deleted for record in records)

        offloader = Offloader(data_dir.ledgers, data_dir.metadata, clock=clock,
                              retry=OffloadRetry(tries_max=3, backoff_first_s=0.01))
        objects = LedgerBucket(bucket, BlockCache(0))
        orphans = sorted(found.name for found in objects.objects() if found.ledger_id not in recorded)
        if point in ("uploading", "after-upload", "after-verify"):
            assert orphans  # the second ledger's copy (or temporary copy), never recorded
        assert offloader.collect_orphan_objects(GRACE_MS) == []  # young: may be an offload in progress
        clock.offset_s = GRACE_MS / 1000 + 60
        assert offloader.collect_orphan_objects(GRACE_MS) == orphans
        assert sorted(found.ledger_id for found in objects.objects()) == sorted(recorded)

        closed = [record.ledger_id for record in ledger.ledger_list()[:-1]]
        offloader.offload_ledgers(ledger, closed)
        offloader.delete_local_copies(ledger, -1)
        offloader.shutdown()
        assert [(record.offloaded, record.local_deleted) for record in ledger.ledger_list()[:-1]] == [
            (True, True)] * len(closed)
        assert data_dir.ledgers.list() == [ledger.ledger_list()[-1].ledger_id]  # only the current one is local
        assert _read_all(ledger) == _expected()
        ledger.close()
    finally:
        data_dir.close()
    reopened = DataDir.open(str(data), bucket=bucket)
    try:
        reopened.collect_orphans()
        ledger = ManagedLedger.open(TOPIC, reopened.ledgers, reopened.metadata, CONFIG)
        assert _read_all(ledger) == _expected()
        ledger.close()
    finally:
        reopened.close()
