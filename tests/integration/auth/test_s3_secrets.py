"""AWS credentials never leave the environment (issue 29 point 6; the S3 side of
``test_auth_e2e.py::test_secrets_never_reach_logs_bodies_metrics_or_the_process_title``).

Every process here gets ``AWS_SECRET_ACCESS_KEY`` only from its environment (the AWS default
chain, ``tests.s3_server.AWS_ENV``), as in production; the secret must not appear in any
log, stdout/stderr, REST body (stats, internal stats, metrics, offload status and
policies) or ``/proc/PID/cmdline``.

* ``test_aws_credentials_never_reach_a_backup_to_s3`` — ``compactd backup --to s3://…`` of a
  running broker (debug logs): the command's title is read while the fault proxy holds its
  upload, so it is alive; its output, the broker's log and bodies are checked.
* ``test_aws_credentials_never_reach_an_offloading_brokers_logs_stats_or_title`` — a broker
  offloading to S3 (``--managed-ledger-offload-driver aws-s3`` …): skipped until the offload
  settings (``managed_ledger_offload_driver``, helper branch w-offapi) are in
  ``api.config.Settings``; it enables itself when they are.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from api.config import Settings
from tests.integration.wire.helpers import wait_until
from tests.s3_fault_proxy import Fault, FaultProxy
from tests.s3_server import AWS_ENV, S3Server
from tests.serve_process import PROCESS_TIMEOUT_S, ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
COMPACTD = str(Path(sys.executable).with_name("compactd"))
SECRET = AWS_ENV["AWS_SECRET_ACCESS_KEY"]
WAIT_S = 30.0
MESSAGES = 12
OFFLOAD_SETTING = "managed_ledger_offload_driver"


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    processes: list[ServeProcess] = []

    def start(*flags: str) -> ServeProcess:
        process = ServeProcess(tmp_path / "data", tmp_path / f"serve-{len(processes)}.log", "--log-level", "debug",
                               "--managed-ledger-max-entries-per-ledger", "4", *flags)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.running:
            process.terminate()


def produce(serve: ServeProcess, topic: str) -> None:
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for number in range(MESSAGES):
            producer.send(f"m{number}".encode())
        producer.close()
    finally:
        client.close()


def title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def bodies(serve: ServeProcess, topic: str, *extra_paths: str) -> list[str]:
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
    with httpx.Client(base_url=serve.http_url, timeout=10) as http:
        return [http.get(url).text for url in (path + "/stats", path + "/internalStats", "/metrics", *extra_paths)]


def test_aws_credentials_never_reach_a_backup_to_s3(started: Callable[..., ServeProcess], s3_server: S3Server,
                                                    tmp_path: Path) -> None:
    serve = started()
    topic = f"persistent://public/default/secret-{uuid.uuid4().hex[:8]}"
    produce(serve, topic)
    with FaultProxy(s3_server.endpoint) as proxy:
        bucket = s3_server.bucket(endpoint=proxy.endpoint, prefix="b")
        proxy.inject(Fault.TIMEOUT, method="PUT", hold_s=WAIT_S)  # the first upload waits: the command is alive
        backup = subprocess.Popen(
            [COMPACTD, "backup", "--admin-url", serve.http_url, "--to", bucket.to_url(),
             "--endpoint", proxy.endpoint, "--region", "us-east-1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: proxy.faults(Fault.TIMEOUT), "the upload to reach the proxy", WAIT_S)
            backup_title = title(backup.pid)
            proxy.release()
            stdout, stderr = backup.communicate(timeout=PROCESS_TIMEOUT_S)
        finally:
            if backup.poll() is None:
                backup.kill()
                backup.wait()
    assert backup.returncode == 0, stderr
    assert "backup" in backup_title and bucket.to_url() in backup_title  # the title was read
    restore = subprocess.run([COMPACTD, "restore", "--from", bucket.to_url(), "--endpoint", s3_server.endpoint,
                              "--data-dir", str(tmp_path / "restored")],
                             capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert restore.returncode == 0, restore.stderr
    seen = bodies(serve, topic)
    broker_title = title(serve.process.pid)
    assert serve.terminate() == 0
    log = serve.log_path.read_text()
    assert "backup" in log  # the broker logged at debug level while it served the backup
    for text in (backup_title, stdout, stderr, restore.stdout, restore.stderr, broker_title, log, *seen):
        assert SECRET not in text


@pytest.mark.skipif(OFFLOAD_SETTING not in {field.name for field in dataclasses.fields(Settings)},
                    reason=f"needs the offload settings ({OFFLOAD_SETTING} …, helper branch w-offapi) in "
                           "api.config.Settings")
@pytest.mark.slow  # a broker offloading through the fault proxy
def test_aws_credentials_never_reach_an_offloading_brokers_logs_stats_or_title(
        started: Callable[..., ServeProcess], s3_server: S3Server) -> None:
    with FaultProxy(s3_server.endpoint) as proxy:
        bucket = s3_server.bucket(endpoint=proxy.endpoint, prefix="cluster")
        proxy.inject(Fault.STATUS, status=503, method="PUT", times=2)  # retried: the error paths log too
        serve = started("--managed-ledger-offload-driver", "aws-s3", "--s3-managed-ledger-offload-bucket", bucket.bucket,
                        "--s3-managed-ledger-offload-service-endpoint", proxy.endpoint,
                        "--s3-managed-ledger-offload-region", "us-east-1", "--managed-ledger-offload-prefix", "cluster",
                        "--managed-ledger-offload-threshold-in-bytes", "0")
        topic = f"persistent://public/default/offloaded-{uuid.uuid4().hex[:8]}"
        produce(serve, topic)
        path = "/admin/v2/persistent/" + topic.removeprefix("persistent://")
        with httpx.Client(base_url=serve.http_url, timeout=10) as http:
            def offloaded() -> bool:
                ledgers = http.get(path + "/internalStats").json()["ledgers"]
                return any(ledger.get("offloaded") for ledger in ledgers)
            wait_until(offloaded, "a ledger offloaded", WAIT_S)
        seen = bodies(serve, topic, path + "/offload", "/admin/v2/namespaces/public/default/offloadThreshold",
                      "/admin/v2/namespaces/public/default/offloadDeletionLagMs", "/openapi.json")
        broker_title = title(serve.process.pid)
        assert serve.terminate() == 0
    log = serve.log_path.read_text()
    assert proxy.faults(Fault.STATUS)
    for text in (broker_title, log, *seen):
        assert SECRET not in text
