"""Issue 29 point 4 end to end: a broker offloading through a faulty S3 endpoint keeps serving,
records nothing half-uploaded, and loses nothing acknowledged.

``compactd serve`` offloads to the moto S3 server through ``tests.s3_fault_proxy.FaultProxy``.
While a producer keeps sending (every send waits for its receipt) the proxy answers the
bucket's writes and reads with 503s, connection resets, truncated bodies and slow answers,
and admin offloads are triggered over and over. Then, with the proxy clean again:

* every message the producer had acknowledged is read back by a consumer, in order, once;
* each ledger internal stats flag ``offloaded`` has an object in the bucket byte-identical to
  its local file (the deletion lag keeps local copies), and no ledger without the flag was
  recorded as such: what the faults broke was retried (the offloader's backoff, the AWS SDK's
  retries) or left for a later trigger, never recorded half-done;
* a last offload after the faults succeeds and flags every ledger before the current one.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow.fs as pafs
import pytest

from ledger.storage.object_fs import BucketConfig
from tests.integration.api.test_offload_e2e import QUIET, WAIT_S, internal_stats
from tests.integration.wire.helpers import wait_until
from tests.s3_fault_proxy import Fault, FaultProxy
from tests.s3_server import S3Server
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREFIX = "cluster-f"
FAULT_ROUNDS = 6  # admin offloads triggered while the proxy misbehaves
PAYLOAD = b"x" * 200
ENTRIES_PER_LEDGER = 40
SEND_INTERVAL_S = 0.005  # the producer's pace: a few ledgers a second


class Serve(ServeProcess):
    """``compactd serve`` offloading to ``bucket`` (no threshold: admin offloads only)."""

    def __init__(self, data_dir: Path, log_path: Path, bucket: BucketConfig) -> None:
        assert bucket.endpoint is not None and bucket.region is not None
        super().__init__(data_dir, log_path, "--fsync", "none", "--compaction-monitor-interval-seconds", "0",
                         "--managed-ledger-max-entries-per-ledger", str(ENTRIES_PER_LEDGER),
                         "--managed-ledger-offload-driver", "aws-s3",
                         "--s3-managed-ledger-offload-bucket", bucket.bucket,
                         "--s3-managed-ledger-offload-service-endpoint", bucket.endpoint,
                         "--s3-managed-ledger-offload-region", bucket.region,
                         "--managed-ledger-offload-prefix", PREFIX)
        self.http = httpx.Client(base_url=self.http_url, timeout=30)

    def _close(self) -> None:
        self.http.close()
        super()._close()


def _faults(proxy: FaultProxy) -> None:
    """One round of trouble on the bucket's writes and reads."""
    proxy.inject(Fault.STATUS, status=503, method="PUT", times=2)
    proxy.inject(Fault.RESET, method="PUT", times=1)
    proxy.inject(Fault.STATUS, status=500, method="GET", path=r"/ledgers/", times=1)
    proxy.inject(Fault.TRUNCATE, method="GET", path=r"/ledgers/", times=1)
    proxy.inject(Fault.SLOW, delay_s=0.3, times=2)


def test_offloads_through_a_faulty_endpoint_keep_serving_and_record_nothing_half_done(
        s3_server: S3Server, tmp_path: Path) -> None:
    upstream = s3_server.bucket(prefix=PREFIX)
    with FaultProxy(s3_server.endpoint) as proxy:
        bucket = BucketConfig("aws-s3", upstream.bucket, PREFIX, proxy.endpoint, upstream.region)
        serve = Serve(tmp_path / "data", tmp_path / "serve.log", bucket)
        try:
            _run(serve, proxy, BucketConfig("aws-s3", upstream.bucket, PREFIX, s3_server.endpoint, upstream.region),
                 tmp_path)
        finally:
            if serve.running:
                assert serve.terminate() == 0, serve.log_path.read_text()


def _run(serve: Serve, proxy: FaultProxy, direct: BucketConfig, tmp_path: Path) -> None:
    topic = f"persistent://public/default/offload-faults-{uuid.uuid4().hex[:8]}"
    url = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=30, logger=QUIET)
    try:
        consumer = client.subscribe(topic, "keeper")  # holds every ledger: nothing is trimmed
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30_000)
        acknowledged: list[bytes] = []
        stop = threading.Event()
        failures: list[Exception] = []

        def keep_producing() -> None:
            index = 0
            try:
                while not stop.is_set():
                    value = b"%06d" % index + PAYLOAD
                    producer.send(value)  # returns once the broker acknowledged it
                    acknowledged.append(value)
                    index += 1
                    stop.wait(SEND_INTERVAL_S)
            except Exception as error:  # noqa: BLE001 - any failure fails the test below
                failures.append(error)

        producing = threading.Thread(target=keep_producing, name="producer")
        producing.start()
        try:
            wait_until(lambda: len(internal_stats(serve, url)["ledgers"]) >= 3,
                       "a few ledgers written", WAIT_S)
            for _ in range(FAULT_ROUNDS):
                _faults(proxy)
                current = internal_stats(serve, url)["ledgers"][-1]["ledgerId"]
                body = {"ledgerId": current, "entryId": 0, "partitionIndex": -1}
                answer = serve.http.put(url + "/offload", json=body)
                assert answer.status_code in (204, 409), answer.text  # 409: the previous job still runs
                wait_until(lambda: serve.http.get(url + "/offload").json()["status"]
                           in ("SUCCESS", "ERROR"), "the offload job ends", 120)
        finally:
            stop.set()
            producing.join(60)
        assert not producing.is_alive() and not failures, failures
        assert any(hit.fault is not None for hit in proxy.hits), "no fault was injected"

        # the proxy is clean again: a last offload takes every ledger before the current one
        proxy.clear()
        wait_until(lambda: serve.http.get(url + "/offload").json()["status"] != "RUNNING",
                   "the last job of the faulty rounds ends", 120)
        ledgers = internal_stats(serve, url)["ledgers"]
        current = ledgers[-1]["ledgerId"]
        body = {"ledgerId": current, "entryId": 0, "partitionIndex": -1}
        assert serve.http.put(url + "/offload", json=body).status_code == 204
        wait_until(lambda: serve.http.get(url + "/offload").json()["status"] == "SUCCESS",
                   "the clean offload succeeds", 120)
        ledgers = internal_stats(serve, url)["ledgers"]
        flagged = [ledger["ledgerId"] for ledger in ledgers if ledger["offloaded"]]
        assert flagged == [ledger["ledgerId"] for ledger in ledgers
                           if ledger["ledgerId"] < current and ledger["entries"] > 0]
        _check_objects(direct, tmp_path / "data" / "ledgers", flagged)

        # nothing acknowledged is lost: the subscription reads every acknowledged message, in order
        received: list[bytes] = []
        deadline = time.monotonic() + 120
        while len(received) < len(acknowledged):
            assert time.monotonic() < deadline, (len(received), len(acknowledged))
            message = consumer.receive(10_000)
            received.append(message.data())
            consumer.acknowledge(message)
        assert received == acknowledged
    finally:
        client.close()


def _check_objects(bucket: BucketConfig, ledgers_dir: Path, flagged: list[int]) -> None:
    """Each flagged ledger's object equals its local file, byte for byte."""
    fs = bucket.open()
    for ledger_id in flagged:
        local = (ledgers_dir / f"{ledger_id:020d}.ledger").read_bytes()
        with fs.open_input_stream(f"{bucket.base}/ledgers/{ledger_id:020d}") as source:
            stored: Any = source.read()
        assert stored == local, f"ledger {ledger_id}: the bucket's copy differs from the local file"
    names = {info.path.rsplit("/", 1)[-1] for info in fs.get_file_info(
        pafs.FileSelector(f"{bucket.base}/ledgers", allow_not_found=True))}
    assert {f"{ledger_id:020d}" for ledger_id in flagged} <= names
