"""Object storage through the fault proxy (``tests.s3_fault_proxy``) in front of the real moto
S3 server: pyarrow's S3 client, as ``BucketConfig.open`` configures it, recovers from
transient 500/503s, resets, held requests and truncated bodies, never returns a short or
altered object, and gives up with an error (not data) once the faults outlast its retries.
And TLS to an S3-compatible endpoint: verified against ``tls_ca_file``, refused otherwise."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from ledger.storage.object_fs import BucketConfig
from tests.integration.auth.tls_material import issue, make_ca
from tests.s3_fault_proxy import Fault, FaultProxy
from tests.s3_server import S3Server

PAYLOAD_BYTES = 600_000


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint) as running:
        yield running


@pytest.fixture
def bucket(s3_server: S3Server, proxy: FaultProxy) -> BucketConfig:
    return s3_server.bucket(endpoint=proxy.endpoint)


def _write(config: BucketConfig, name: str, data: bytes) -> None:
    with config.open().open_output_stream(f"{config.base}/{name}") as out:
        out.write(data)


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_file(path) as source:
        return source.read()


def _impatient(proxy: FaultProxy, *, attempts: int) -> pafs.S3FileSystem:
    """A client with a 1 s request timeout and few tries: held requests and exhausted
    retries show in seconds."""
    return pafs.S3FileSystem(endpoint_override=proxy.endpoint.removeprefix("http://"), scheme="http",
                             region="us-east-1", connect_timeout=1, request_timeout=1,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts))


@pytest.mark.parametrize("status", [500, 503])
def test_an_upload_retries_through_transient_server_errors(bucket: BucketConfig, proxy: FaultProxy,
                                                           status: int) -> None:
    data = os.urandom(PAYLOAD_BYTES)
    proxy.inject(Fault.STATUS, status=status, method="PUT", times=2)
    _write(bucket, "object", data)
    assert len(proxy.faults(Fault.STATUS)) == 2 and proxy.pending == 0
    proxy.inject(Fault.STATUS, status=status, method="GET", times=2)
    assert _read(bucket.open(), f"{bucket.base}/object") == data
    assert len(proxy.faults(Fault.STATUS)) == 4


@pytest.mark.parametrize("fault", [Fault.RESET, Fault.TRUNCATE])
def test_a_read_cut_short_is_retried_never_served_short(bucket: BucketConfig, proxy: FaultProxy,
                                                        fault: Fault) -> None:
    data = os.urandom(PAYLOAD_BYTES)
    _write(bucket, "object", data)
    proxy.inject(fault, method="GET", times=2)
    assert _read(bucket.open(), f"{bucket.base}/object") == data
    assert len(proxy.faults(fault)) == 2


def test_a_reset_during_an_upload_is_retried(bucket: BucketConfig, proxy: FaultProxy) -> None:
    data = os.urandom(PAYLOAD_BYTES)
    proxy.inject(Fault.RESET, method="PUT")
    _write(bucket, "object", data)
    assert len(proxy.faults(Fault.RESET)) == 1
    assert _read(bucket.open(), f"{bucket.base}/object") == data


@pytest.mark.parametrize("fault", [Fault.STATUS, Fault.TRUNCATE])
def test_faults_outlasting_the_retries_raise_instead_of_returning_data(bucket: BucketConfig, proxy: FaultProxy,
                                                                       fault: Fault) -> None:
    _write(bucket, "object", os.urandom(PAYLOAD_BYTES))
    proxy.inject(fault, method="GET", times=100)
    with pytest.raises(OSError, match="SLOW_DOWN|SERVICE_UNAVAILABLE" if fault is Fault.STATUS else "partial"):
        _read(_impatient(proxy, attempts=2), f"{bucket.base}/object")


def test_a_held_request_times_out_and_is_retried(bucket: BucketConfig, proxy: FaultProxy) -> None:
    data = os.urandom(PAYLOAD_BYTES)
    _write(bucket, "object", data)
    proxy.inject(Fault.TIMEOUT, method="GET", hold_s=30)
    started = time.monotonic()
    assert _read(_impatient(proxy, attempts=3), f"{bucket.base}/object") == data
    assert len(proxy.faults(Fault.TIMEOUT)) == 1
    assert time.monotonic() - started < 30  # the client gave up on the hold, not the proxy


def test_a_slow_answer_is_waited_for(bucket: BucketConfig, proxy: FaultProxy) -> None:
    data = os.urandom(PAYLOAD_BYTES)
    _write(bucket, "object", data)
    proxy.inject(Fault.SLOW, method="GET", delay_s=0.5)
    started = time.monotonic()
    assert _read(bucket.open(), f"{bucket.base}/object") == data
    assert time.monotonic() - started >= 0.5
    assert [hit.method for hit in proxy.faults(Fault.SLOW)] == ["GET"]


def test_a_rule_matches_only_its_method_and_path(bucket: BucketConfig, proxy: FaultProxy) -> None:
    _write(bucket, "kept", b"k")
    proxy.inject(Fault.STATUS, method="GET", path=r"/elsewhere/")
    assert _read(bucket.open(), f"{bucket.base}/kept") == b"k"
    assert proxy.faults(Fault.STATUS) == [] and proxy.pending == 1


@pytest.mark.slow  # the refused client retries its handshake with backoff (several seconds)
def test_tls_to_an_s3_endpoint_is_verified_against_the_given_ca(s3_server: S3Server, tmp_path: Path) -> None:
    authority, stranger = make_ca(tmp_path), make_ca(tmp_path, "another CA")
    certificate = issue(authority, tmp_path, "s3", "localhost", server=True)
    with FaultProxy(s3_server.endpoint, certfile=str(certificate.cert_path),
                    keyfile=str(certificate.key_path)) as tls_proxy:
        assert tls_proxy.endpoint.startswith("https://")
        name = s3_server.bucket().bucket
        trusted = BucketConfig("aws-s3", name, endpoint=tls_proxy.endpoint, region="us-east-1",
                               tls_ca_file=str(authority.cert_path))
        _write(trusted, "object", b"over TLS")
        assert _read(trusted.open(), f"{trusted.base}/object") == b"over TLS"
        served = len(tls_proxy.hits)
        foreign = BucketConfig("aws-s3", name, endpoint=tls_proxy.endpoint, region="us-east-1",
                               tls_ca_file=str(stranger.cert_path))
        with pytest.raises(OSError, match="SSL|certificate"):
            _read(foreign.open(), f"{foreign.base}/object")
        assert len(tls_proxy.hits) == served  # no request got through the refused handshake
