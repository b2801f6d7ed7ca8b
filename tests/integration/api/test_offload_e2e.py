"""Issue 29 point 2 end to end: offload through Pulsar's admin paths on a real ``compactd serve``,
read back by the real pulsar-client, on both drivers (``filesystem``: a directory;
``aws-s3``: the moto S3 server of ``tests.s3_server``).

``test_offloaded_ledgers_are_read_transparently_before_and_after_a_restart``, per driver:

1. a durable subscription holds the topic (nothing is trimmed); messages fill several
   ledgers (4 entries each);
2. ``PUT …/offload`` with the last message's id answers 204, and ``compactd admin topics
   offload-status -w`` then reads SUCCESS with ``firstUnoffloadedMessage`` = (that ledger, 0);
   internal stats flag exactly the ledgers before it ``offloaded``; topic stats'
   ``offloadedStorageSize`` is their size; the bucket holds one object per offloaded ledger
   under the prefix, and their local files are still there (the default deletion lag);
3. ``compactd admin topics offload -s 0`` (the message id chosen from the internal stats:
   the ledger being written) is accepted once the first job is over;
4. the namespace's ``offloadDeletionLagMs`` set to 0: the next trim passes delete the
   offloaded ledgers' local files;
5. a compaction run after the local copies went (its input read from the bucket); a
   consumer, a reader, a seek, and a read-compacted reader all read every message back — and again after a restart of the broker, where the status is
   NOT_RUN (in memory, as Pulsar's) and the ``offloaded`` flags persist;
6. the topic's ``offloadThreshold`` set to 0 (over the namespace's -1): each roll-over
   offloads the ledger it sealed.

Every wait is bounded; every process and client is closed.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.fs as pafs
import pytest
from typer.testing import CliRunner

from api.cli import app
from ledger.storage.object_fs import BucketConfig
from tests.integration.wire.helpers import wait_until
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # two brokers per driver, each a few seconds

WAIT_S = 30.0
ENTRIES_PER_LEDGER = 4
MESSAGES = 18  # ledgers of 4, 4, 4, 4 and 2 entries
KEYS = 5
PREFIX = "cluster-a"
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


class Serve(ServeProcess):
    """``compactd serve`` with offload to ``bucket``, small ledgers, a fast trim pass."""

    def __init__(self, data_dir: Path, log_path: Path, bucket: BucketConfig) -> None:
        if bucket.driver == "filesystem":
            where = ["--managed-ledger-offload-driver", "filesystem", "--file-system-uri", f"file://{bucket.bucket}"]
        else:
            assert bucket.endpoint is not None and bucket.region is not None
            where = ["--managed-ledger-offload-driver", "aws-s3", "--s3-managed-ledger-offload-bucket", bucket.bucket,
                     "--s3-managed-ledger-offload-service-endpoint", bucket.endpoint,
                     "--s3-managed-ledger-offload-region", bucket.region]
        super().__init__(data_dir, log_path, "--fsync", "none", "--compaction-monitor-interval-seconds", "0",
                         "--managed-ledger-max-entries-per-ledger", str(ENTRIES_PER_LEDGER),
                         "--retention-check-interval-seconds", "0.2",
                         "--managed-ledger-offload-prefix", PREFIX, *where)
        self.http = httpx.Client(base_url=self.http_url, timeout=30)

    def _close(self) -> None:
        self.http.close()
        super()._close()


@pytest.fixture(params=["filesystem", "aws-s3"])
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> BucketConfig:
    if request.param == "filesystem":
        return BucketConfig("filesystem", str(tmp_path / "bucket"), PREFIX)
    s3_bucket: BucketConfig = request.getfixturevalue("s3_bucket")
    return BucketConfig("aws-s3", s3_bucket.bucket, PREFIX, s3_bucket.endpoint, s3_bucket.region)


@pytest.fixture
def start(tmp_path: Path, bucket: BucketConfig) -> Iterator[Callable[[], Serve]]:
    started: list[Serve] = []

    def run() -> Serve:
        serve = Serve(tmp_path / "data", tmp_path / "serve.log", bucket)
        started.append(serve)
        return serve

    yield run
    for serve in started:
        if serve.running:
            assert serve.terminate() == 0, (serve.log_path.read_text())
        else:
            serve.kill()


def client(serve: Serve) -> Any:
    return pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)


def internal_stats(serve: Serve, url: str) -> dict[str, Any]:
    response = serve.http.get(url + "/internalStats")
    assert response.status_code == 200, response.text
    return dict(response.json())


def bucket_objects(bucket: BucketConfig) -> set[str]:
    """Names under ``<base>/ledgers/`` in the bucket."""
    fs = bucket.open()
    infos = fs.get_file_info(pafs.FileSelector(f"{bucket.base}/ledgers", allow_not_found=True))
    return {info.path.rsplit("/", 1)[-1] for info in infos if info.type == pafs.FileType.File}


def local_ledger_files(data_dir: Path) -> set[int]:
    return {int(name.split(".")[0]) for name in os.listdir(data_dir / "ledgers") if name.endswith(".ledger")}


def read_everything(serve: Serve, topic: str, *, compacted: bool = False) -> list[tuple[str, bytes]]:
    pulsar_client = client(serve)
    try:
        reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
        seen = []
        deadline = time.monotonic() + WAIT_S
        while reader.has_message_available():
            assert time.monotonic() < deadline, "the topic did not end"
            message = reader.read_next(5000)
            seen.append((message.partition_key(), message.data()))
        reader.close()
        return seen
    finally:
        pulsar_client.close()


def consume_all(serve: Serve, topic: str, subscription: str, count: int, *,
                seek_to: Any = None) -> list[tuple[str, bytes]]:
    """``count`` messages of the durable ``subscription`` (after a seek to ``seek_to``),
    none acknowledged, so the subscription keeps holding the topic."""
    pulsar_client = client(serve)
    try:
        consumer = pulsar_client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Exclusive)
        if seek_to is not None:
            consumer.seek(seek_to)
        seen = []
        for _ in range(count):
            message = consumer.receive(5000)
            seen.append((message.partition_key(), message.data()))
        consumer.close()
        return seen
    finally:
        pulsar_client.close()


def produce(serve: Serve, topic: str, pairs: list[tuple[str, bytes]]) -> list[Any]:
    pulsar_client = client(serve)
    try:
        producer = pulsar_client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(value, partition_key=key) for key, value in pairs]
        producer.close()
        return ids
    finally:
        pulsar_client.close()


def test_offloaded_ledgers_are_read_transparently_before_and_after_a_restart(
        start: Callable[[], Serve], bucket: BucketConfig, tmp_path: Path) -> None:
    topic = f"persistent://public/default/offload-{uuid.uuid4().hex[:8]}"
    url = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    pairs = [(f"k{index % KEYS}", f"v{index}".encode()) for index in range(MESSAGES)]
    latest = {key: value for key, value in pairs}
    serve = start()

    # 1. a subscription holds everything; the messages fill several ledgers
    consume_all(serve, topic, "keeper", 0)
    ids = produce(serve, topic, pairs)
    last = ids[-1]
    before = internal_stats(serve, url)["ledgers"]
    assert len(before) >= 4 and not any(ledger["offloaded"] for ledger in before)

    # 2. offload everything before the last message's ledger
    body = {"ledgerId": last.ledger_id(), "entryId": last.entry_id(), "partitionIndex": -1}
    assert serve.http.put(url + "/offload", json=body).status_code == 204
    result = CliRunner().invoke(app, ["admin", "--admin-url", serve.http_url, "topics", "offload-status", "-w",
                                      "--poll-interval", "0.05", "--wait-timeout", str(WAIT_S), topic])
    assert result.exit_code == 0, result.output
    status = serve.http.get(url + "/offload").json()
    assert status == {"status": "SUCCESS", "lastError": "",
                      "firstUnoffloadedMessage": {"ledgerId": last.ledger_id(), "entryId": 0, "partitionIndex": -1}}
    ledgers = internal_stats(serve, url)["ledgers"]
    offloaded = [ledger["ledgerId"] for ledger in ledgers if ledger["offloaded"]]
    assert offloaded == [ledger["ledgerId"] for ledger in ledgers if ledger["ledgerId"] < last.ledger_id()]
    assert len(offloaded) >= 3
    stats = serve.http.get(url + "/stats").json()
    assert stats["offloadedStorageSize"] == sum(ledger["size"] for ledger in ledgers if ledger["offloaded"]) > 0
    assert {f"{ledger_id:020d}" for ledger_id in offloaded} <= bucket_objects(bucket)
    assert set(offloaded) <= local_ledger_files(tmp_path / "data")  # the default lag: 4 h

    # 3. the job is over: a new one is accepted (and finds nothing more to do); the CLI's
    # size threshold of 0 keeps only the ledger being written
    result = CliRunner().invoke(app, ["admin", "--admin-url", serve.http_url, "topics", "offload", "-s", "0", topic])
    assert result.exit_code == 0, result.output
    assert f"messages before {ledgers[-1]['ledgerId']}:0" in result.stdout
    wait_until(lambda: serve.http.get(url + "/offload").json()["status"] == "SUCCESS",
               "the second offload ends", WAIT_S)

    # 4. deletion lag 0 on the namespace: the trim passes delete the local copies
    response = serve.http.put("/admin/v2/namespaces/public/default/offloadDeletionLagMs", json=0)
    assert response.status_code == 204, response.text
    wait_until(lambda: not set(offloaded) & local_ledger_files(tmp_path / "data"),
               "the offloaded ledgers' local files are deleted", WAIT_S)

    # a compaction run reads its input from the bucket now (the local engine's worker process)
    assert serve.http.put(url + "/compaction").status_code == 204
    wait_until(lambda: serve.http.get(url + "/compaction").json()["status"] == "SUCCESS",
               "the compaction ends", WAIT_S)

    # 5. every reader reads it all back, through the bucket
    def check_reads(serve: Serve) -> None:
        assert read_everything(serve, topic) == pairs
        assert consume_all(serve, topic, "keeper", MESSAGES, seek_to=pulsar.MessageId.earliest) == pairs
        # a seek to a message id goes on after it (as without offload: the seek's own tests)
        assert consume_all(serve, topic, "keeper", MESSAGES - 3, seek_to=ids[2]) == pairs[3:]
        assert sorted(read_everything(serve, topic, compacted=True)) == sorted(latest.items())

    check_reads(serve)

    assert serve.terminate() == 0
    serve = start()
    assert serve.http.get(url + "/offload").json()["status"] == "NOT_RUN"
    assert [ledger["ledgerId"] for ledger in internal_stats(serve, url)["ledgers"]
            if ledger["offloaded"]] == offloaded
    check_reads(serve)

    # 6. the topic's threshold 0 wins over the namespace's -1: each roll-over offloads
    assert serve.http.put("/admin/v2/namespaces/public/default/offloadThreshold", json=-1).status_code == 204
    assert serve.http.post(url + "/offloadThreshold", json=0).status_code == 204
    more = produce(serve, topic, [(f"k{index}", b"more") for index in range(2 * ENTRIES_PER_LEDGER)])
    sealed = {message_id.ledger_id() for message_id in more} - {serve_current(serve, url)}
    wait_until(lambda: sealed <= {
        ledger["ledgerId"] for ledger in internal_stats(serve, url)["ledgers"] if ledger["offloaded"]},
        "the ledgers sealed by roll-overs are offloaded", WAIT_S)


def serve_current(serve: Serve, url: str) -> int:
    """The ledger being written."""
    return int(internal_stats(serve, url)["ledgers"][-1]["ledgerId"])
