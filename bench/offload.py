"""Offload: throughput to the bucket next to the local disk, and read latency of an offloaded entry.

Run: ``.venv/bin/python -m bench.offload [--driver aws-s3|filesystem] [--ledgers 8] [--ledger-mb 4]
[--entry-bytes 1024] [--reads 30] [--json]`` (or ``bench/offload.py``). ``--json`` prints one
JSON object on stdout (the table goes to stderr).

The bucket: ``aws-s3`` (default) is moto's S3 server started on loopback in this process
(``moto[server]``, the tests' server; dummy ``AWS_*`` credentials unless the environment has
some), or the S3-compatible store at ``--endpoint`` with an existing ``--bucket`` (credentials
from the AWS default chain); ``filesystem`` is a directory under ``--dir``.

* **offload**: a topic of ``--ledgers`` sealed ledgers of about ``--ledger-mb`` MB each
  (``DataDir`` + ``ManagedLedger``, entries of ``--entry-bytes`` random bytes) is offloaded
  by ``ledger.offload.Offloader.offload_ledgers``, what the broker runs: each ledger
  uploaded, read back and checked (size, CRC32C), then recorded. ``offload_mb_per_s`` =
  the ledgers' bytes / that time. Beside it, in the same run and on the same disk,
  ``local_sequential_write_mb_per_s``: the same number of bytes written to one new file in
  1 MiB writes, then fsync'd.
* **read latency**: the offloaded ledgers' local copies are then let go
  (``delete_local_copies`` with no lag), so reads come from the bucket. Each of ``--reads``
  samples opens a fresh read-only ``FileLedgerStore`` on the data dir (an empty block
  cache, as a broker after a restart or a Spark executor) and times the read of one entry
  at a random position of a random ledger (``cold``: the object is opened, its records
  walked and CRC-checked through the cache), then the read of another entry of the same
  ledger (``cached``). The same is done on a second topic of the same shape that stays
  local (``local_cold``: file opened and scanned, the page cache warm; ``local_cached``).
  Each is reported as median and p99 in milliseconds.

A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.fs as pafs  # after the path: runnable as a script

from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.offload import Offloader
from ledger.storage import SyncPolicy
from ledger.storage.file import FileLedgerStore
from ledger.storage.object_fs import BucketConfig

MB = 1_000_000
_WRITE_CHUNK = 1024 * 1024
_DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
              "AWS_EC2_METADATA_DISABLED": "true"}


@contextmanager
def bucket_for(args: argparse.Namespace, scratch: str) -> Iterator[tuple[BucketConfig, str]]:
    """The bucket to offload to, and a word for where it is."""
    if args.driver == "filesystem":
        yield BucketConfig("filesystem", os.path.join(scratch, "bucket"), "bench"), "a local directory"
        return
    if args.endpoint:
        if not args.bucket:
            sys.exit("--endpoint needs --bucket (an existing bucket)")
        yield BucketConfig("aws-s3", args.bucket, f"bench-{secrets.token_hex(4)}", args.endpoint,
                           args.region), args.endpoint
        return
    from moto.server import ThreadedMotoServer

    for key, value in _DUMMY_AWS.items():
        os.environ.setdefault(key, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        name = f"bench-{secrets.token_hex(4)}"
        pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1",
                          allow_bucket_creation=True).create_dir(name)
        yield BucketConfig("aws-s3", name, "bench", endpoint, "us-east-1"), "moto on loopback"
    finally:
        server.stop()


def write_topic(data_dir: DataDir, topic: str, args: argparse.Namespace) -> tuple[ManagedLedger, list[int], int]:
    """A topic of ``--ledgers`` sealed ledgers (and an open one holding one entry): the
    ledger, the sealed ledgers' ids and their bytes."""
    per_ledger = max(1, args.ledger_mb * MB // args.entry_bytes)
    ledger = ManagedLedger.open(topic, data_dir.ledgers, data_dir.metadata,
                                ManagedLedgerConfig(max_entries_per_ledger=per_ledger))
    payload = os.urandom(args.entry_bytes)
    pending = [ledger.append(payload) for _ in range(per_ledger * args.ledgers + 1)]
    for future in pending:
        future.result(timeout=120)
    sealed = [record for record in ledger.ledger_list() if record.closed_at_ms]
    files = data_dir.ledgers.file_powers()
    assert files is not None
    size = sum(os.path.getsize(os.path.join(files.root, f"{record.ledger_id:020d}.ledger")) for record in sealed)
    return ledger, [record.ledger_id for record in sealed], size


def sequential_write_mb_per_s(directory: str, size: int) -> float:
    """MB/s of writing ``size`` bytes to a new file in 1 MiB writes, then fsync."""
    path = os.path.join(directory, "sequential-write")
    block = os.urandom(_WRITE_CHUNK)
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as file:
        written = 0
        while written < size:
            written += file.write(block[: min(_WRITE_CHUNK, size - written)])
        os.fsync(file.fileno())
    elapsed = time.perf_counter() - started
    os.unlink(path)
    return size / elapsed / MB


def read_latencies(root: str, bucket: BucketConfig | None, ledgers: dict[int, int], reads: int,
                   rng: random.Random) -> tuple[list[float], list[float]]:
    """(cold, cached) read times in ms over ``reads`` samples; ``ledgers``: id -> entries."""
    cold, cached = [], []
    ids = sorted(ledgers)
    for _ in range(reads):
        store = FileLedgerStore(root, read_only=True, bucket=bucket)
        try:
            ledger_id = rng.choice(ids)
            first, second = rng.randrange(ledgers[ledger_id]), rng.randrange(ledgers[ledger_id])
            cold.append(_timed(lambda: store.read(ledger_id, first, first)))  # noqa: B023 - called at once
            cached.append(_timed(lambda: store.read(ledger_id, second, second)))  # noqa: B023
        finally:
            store.shutdown()
    return cold, cached


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"median": round(statistics.median(ordered), 3), "p99": round(p99, 3)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    scratch = tempfile.mkdtemp(prefix="bench-offload-", dir=args.dir)
    rng = random.Random(args.seed)
    try:
        with bucket_for(args, scratch) as (bucket, where):
            data_dir = DataDir.open(os.path.join(scratch, "data"), sync=SyncPolicy.NONE, bucket=bucket)
            try:
                offloaded, offloaded_ids, size = write_topic(data_dir, "persistent://public/default/offloaded", args)
                local, local_ids, _ = write_topic(data_dir, "persistent://public/default/local", args)
                entries = {record.ledger_id: record.entries for record in offloaded.ledger_list()
                           if record.ledger_id in offloaded_ids}
                local_entries = {record.ledger_id: record.entries for record in local.ledger_list()
                                 if record.ledger_id in local_ids}
                disk_mb_per_s = sequential_write_mb_per_s(scratch, size)
                offloader = Offloader(data_dir.ledgers, data_dir.metadata)
                try:
                    started = time.perf_counter()
                    offloader.offload_ledgers(offloaded, offloaded_ids)
                    offload_s = time.perf_counter() - started
                    offloader.delete_local_copies(offloaded, -1)
                finally:
                    offloader.shutdown()
                files = data_dir.ledgers.file_powers()
                assert files is not None
                root = files.root
                gone = [ledger_id for ledger_id in offloaded_ids
                        if not os.path.exists(os.path.join(root, f"{ledger_id:020d}.ledger"))]
                cold, cached = read_latencies(root, bucket, {i: entries[i] for i in gone}, args.reads, rng)
                local_cold, local_cached = read_latencies(root, None, local_entries, args.reads, rng)
                offloaded.close()
                local.close()
            finally:
                data_dir.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "driver": bucket.driver, "bucket": where, "ledgers": len(offloaded_ids), "offloaded_bytes": size,
        "entry_bytes": args.entry_bytes, "reads": args.reads,
        "offload_mb_per_s": round(size / offload_s / MB, 2),
        "local_sequential_write_mb_per_s": round(disk_mb_per_s, 2),
        "read_latency_ms": {"offloaded_cold": summary(cold), "offloaded_cached": summary(cached),
                            "local_cold": summary(local_cold), "local_cached": summary(local_cached)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--driver", choices=("aws-s3", "filesystem"), default="aws-s3")
    parser.add_argument("--endpoint", default=None, help="an S3-compatible endpoint instead of moto")
    parser.add_argument("--bucket", default=None, help="an existing bucket at --endpoint")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--ledgers", type=int, default=8)
    parser.add_argument("--ledger-mb", type=int, default=4)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--reads", type=int, default=30)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--dir", default=None, help="where the data dir goes (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args()
    result = run(args)
    table = sys.stderr if args.json else sys.stdout
    print(f"{result['ledgers']} ledgers, {result['offloaded_bytes'] / MB:.1f} MB, to {result['driver']} "
          f"({result['bucket']})", file=table)
    print(f"  offload (upload, read back, record) {result['offload_mb_per_s']:>9.1f} MB/s", file=table)
    print(f"  local sequential write + fsync       {result['local_sequential_write_mb_per_s']:>9.1f} MB/s", file=table)
    print(f"  read one entry, ms {'median':>10} {'p99':>9}", file=table)
    for name, figures in result["read_latency_ms"].items():
        print(f"  {name:<18} {figures['median']:>10.3f} {figures['p99']:>9.3f}", file=table)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
