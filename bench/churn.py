"""Churn: an incremental run against a full rewrite of the same view (issue 30, point 5).

Run: ``.venv/bin/python -m bench.churn --keys 10000000 --update-share 0.01 --json``.
``--json`` prints one JSON object on stdout (the progress goes to stderr):

* ``workload`` and ``setup`` (what was built and how long it took);
* ``incremental`` and ``full_rewrite``, each: ``bytes_read``, ``bytes_written``, ``run_s``
  (the run's wall time; ``RunFigures.bytes_read`` / ``bytes_written``: what the run read,
  key indexes included, and wrote), ``run_cpu_s`` (the CPU time the process spent in the
  run, every thread's: steadier than the wall time on a shared machine), the run's other figures (``dead_marked``, ``merged_ledgers``,
  ``entries_written``, ``duration_s``), what the process did at the system-call level
  (``os_read_bytes`` / ``os_write_bytes``: ``rchar`` / ``wchar`` of ``/proc/self/io``
  over the run, SQLite's writes included), its peak RSS, the view it left (``ledgers``,
  ``view_bytes``), and ``reader_messages_per_s``: a read-compacted reader's throughput
  over that view (below);
* ``bytes_written_ratio``, ``run_s_ratio``, ``reader_throughput_ratio`` (incremental ÷
  full rewrite; ``run_cpu_s_ratio`` beside them, unchecked), ``identical`` (both views deliver the same message ids) and
  ``acceptance``: each ratio checked against the issue's threshold (≤ 0.05, ≤ 0.10, ≥ 0.9).

What it does:

1. **setup** (a child process): a data dir written with ``SyncPolicy.NONE`` for speed; one
   topic (default ``ManagedLedgerConfig``) of ``--keys`` keys, each written once, in batches
   of ``--batch-size`` slots of ``--value-bytes`` random bytes (the slots are laid out
   directly, as ``message.encoder.encode_batch`` would lay them, and framed with
   ``reframe_batch``: the fastest way to write millions of messages), appended with up to
   ``APPENDS_IN_FLIGHT_MAX`` in flight; one full compaction makes the compacted view of
   every key; then ``--update-share`` × ``--keys`` distinct keys, drawn at random, are
   written again (new values, the same batch layout). The key index of every sealed
   ledger is built, the raw ones as the broker's background builder does when a ledger
   is sealed, the view's as the first incremental run over it would (its time is
   ``setup.view_index_build_s``): the state an incremental run meets in steady state.
2. The data dir is copied twice (``shutil.copytree``), before any run.
3. **incremental** and **full_rewrite** (one child process each, on its own copy, the
   data dir's default ``SyncPolicy.GROUP``): ``Compactor().compact(topic)`` (incremental,
   the default) and ``compact(topic, rewrite=True)``, timed; then the reader pass.

**Reader throughput** is measured through the broker's own read-compacted path, not a
pulsar-client: ``compactor.view.reader.CompactedReader`` (what dispatch drives) from the
earliest message with a non-durable cursor, ``READER_BATCH_ENTRIES`` entries a read, over
the whole view, counting the messages delivered (a batch's surviving slots, dead marks
applied); messages/s = messages / the median wall time of ``--reader-passes`` passes. A real client at 10 M messages would measure
the client (tens of µs a message in Python), not the view.

Memory stays bounded: the setup streams the entries (the update keys are one array of
``--update-share`` × ``--keys`` integers), and each run is the compactor's own.
A benchmark, not a test: it asserts nothing, it reports.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from bench import _child
from bench._child import peak_rss_bytes
from compactor.local.key_index import ensure_index
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.view.reader import CompactedReader
from compactor.view.topic import CompactedTopic
from cursor import ManagedCursor
from cursor.store import CursorStore
from ledger import EARLIEST
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage.base import LedgerState, SyncPolicy
from ledger.storage.file import FileLedgerStore
from message.encoder import encode_slot, reframe_batch
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/bench-churn"
APPENDS_IN_FLIGHT_MAX = 1000
READER_BATCH_ENTRIES = 100
PUBLISH_TIME_MS = 1_700_000_000_000
THRESHOLDS = {"bytes_written_ratio": 0.05, "run_s_ratio": 0.10, "reader_throughput_ratio": 0.9}
"""The issue's acceptance: the first two at most, the third at least."""
KEY_DIGITS = 9  # key names "key-000000000": up to a billion keys, all of one length


# --- the workload ---------------------------------------------------------------------------


class Slots:
    """Batch slots of keys ``key-NNNNNNNNN`` with ``value_bytes`` values, laid out as
    ``encode_slot`` lays them (checked once against it), without a protobuf per slot."""

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = value_bytes
        sample_key = "key-" + "0" * KEY_DIGITS
        single = pb.SingleMessageMetadata(partition_key=sample_key, payload_size=value_bytes)
        template = encode_slot(single, b"\0" * value_bytes)
        self._head, _, self._tail = template[: -value_bytes].partition(sample_key.encode())
        assert self._head + sample_key.encode() + self._tail + b"\0" * value_bytes == template

    def slot(self, key: int, value: bytes) -> bytes:
        return self._head + b"key-%09d" % key + self._tail + value


def batches(keys: np.ndarray, batch_size: int, value_bytes: int, seed: int) -> Iterator[bytes]:
    """Batch entries writing ``keys`` in order, ``batch_size`` slots each, random values."""
    rng = np.random.Generator(np.random.PCG64(seed))
    slots = Slots(value_bytes)
    metadata = pb.MessageMetadata(producer_name="bench-churn", sequence_id=0, publish_time=PUBLISH_TIME_MS,
                                  compression=pb.NONE)
    for first in range(0, len(keys), batch_size):
        chunk = keys[first:first + batch_size].tolist()
        values = rng.bytes(len(chunk) * value_bytes)
        body = b"".join(slots.slot(key, values[i * value_bytes:(i + 1) * value_bytes]) for i, key in enumerate(chunk))
        metadata.sequence_id = first
        metadata.num_messages_in_batch = len(chunk)
        yield reframe_batch(metadata, body, with_checksum=False)


def _append_all(ledger: ManagedLedger, entries: Iterator[bytes]) -> tuple[int, int]:
    """Append ``entries`` with up to ``APPENDS_IN_FLIGHT_MAX`` in flight: (entries, bytes)."""
    pending: deque[Future[Position]] = deque()
    count = size = 0
    for data in entries:
        pending.append(ledger.append(data))
        count, size = count + 1, size + len(data)
        while len(pending) > APPENDS_IN_FLIGHT_MAX:
            pending.popleft().result()
    while pending:
        pending.popleft().result()
    return count, size


def _open(path: str, sync: SyncPolicy) -> tuple[DataDir, ManagedLedger, CompactedTopic]:
    data_dir = DataDir.open(path, sync=sync)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, ManagedLedgerConfig())
    return data_dir, ledger, CompactedTopic.restore(ledger, CursorStore(data_dir.database), create_cursor=True)


def _index_sealed(path: str, ledger_ids: set[int]) -> tuple[float, float]:
    """Build the key index of every sealed ledger: (seconds for the raw ones, seconds for
    those of ``ledger_ids``, the compacted view's)."""
    store = FileLedgerStore(os.path.join(path, "ledgers"), sync=SyncPolicy.NONE, read_only=True)
    seconds = {True: 0.0, False: 0.0}
    try:
        for ledger_id in store.list():
            if store.info(ledger_id).state is LedgerState.CLOSED:
                started = time.perf_counter()
                ensure_index(store, ledger_id, compacted=ledger_id in ledger_ids)
                seconds[ledger_id in ledger_ids] += time.perf_counter() - started
    finally:
        store.shutdown()
    return seconds[False], seconds[True]


def child_setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Steps 1 of the module docstring, in ``spec["dir"]``."""
    keys, share = spec["keys"], spec["update_share"]
    batch_size, value_bytes = spec["batch_size"], spec["value_bytes"]
    started = time.perf_counter()
    data_dir, ledger, topic = _open(spec["dir"], SyncPolicy.NONE)
    entries, size = _append_all(ledger, batches(np.arange(keys, dtype=np.int64), batch_size, value_bytes, spec["seed"]))
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    initial = Compactor(CompactionConfig(engine="local")).compact(topic, rewrite=True)
    compact_s = time.perf_counter() - started
    view = topic.view
    assert view is not None
    rng = np.random.Generator(np.random.PCG64(spec["seed"] + 1))
    updated = rng.choice(keys, size=max(1, round(keys * share)), replace=False)
    started = time.perf_counter()
    update_entries, update_size = _append_all(ledger, batches(updated, batch_size, value_bytes, spec["seed"] + 2))
    update_s = time.perf_counter() - started
    view_ledgers = set(view.ledger_ids)
    ledger.close()
    data_dir.close()
    raw_index_s, view_index_s = _index_sealed(spec["dir"], view_ledgers)
    return {
        "entries": entries, "bytes": size, "write_s": write_s, "initial_compaction_s": compact_s,
        "view_entries": view.entries, "view_bytes": view.size, "initial_bytes_written": initial.bytes_written,
        "updated_keys": len(updated), "update_entries": update_entries, "update_bytes": update_size,
        "update_write_s": update_s, "raw_index_build_s": raw_index_s, "view_index_build_s": view_index_s,
        "peak_rss": peak_rss_bytes(),
    }


# --- one run and the reader over its view -----------------------------------------------------


def _io() -> dict[str, int]:
    with open("/proc/self/io") as io:
        return {name: int(value) for name, value in (line.split(": ") for line in io)}


def _cpu_s() -> float:
    """CPU seconds of this process so far, every thread's (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_view(topic: CompactedTopic) -> tuple[int, float, str]:
    """A read-compacted reader from the earliest message over the whole topic: (messages,
    seconds, digest of the delivered ids: each entry's position and delivered slots)."""
    cursor = ManagedCursor.open_non_durable(topic.ledger, "bench-reader", EARLIEST)
    reader = CompactedReader(topic, cursor, from_earliest=True)
    digest = hashlib.blake2b(digest_size=16)
    messages = 0
    started = time.perf_counter()
    while batch := reader.read(READER_BATCH_ENTRIES):
        for entry in batch:
            messages += len(entry.surviving) if entry.batch_size else 1
        digest.update(repr([(e.position.ledger_id, e.position.entry_id, e.surviving) for e in batch]).encode())
    return messages, time.perf_counter() - started, digest.hexdigest()


def child_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One run on the copy ``spec["dir"]`` (``spec["rewrite"]``: a full rewrite), then the
    reader pass over the view it left."""
    data_dir, ledger, topic = _open(spec["dir"], SyncPolicy.GROUP)
    try:
        compactor = Compactor(CompactionConfig(engine="local"))
        before, cpu_before = _io(), _cpu_s()
        started = time.perf_counter()
        figures = compactor.compact(topic, rewrite=spec["rewrite"])
        run_s = time.perf_counter() - started
        after, run_cpu_s = _io(), _cpu_s() - cpu_before
        peak_rss = peak_rss_bytes()
        view = topic.view
        assert view is not None
        passes = [read_view(topic) for _ in range(spec["reader_passes"])]
        messages, _, digest = passes[0]
        assert all(one[0] == messages and one[2] == digest for one in passes), "the reader passes differ"
        read_s = statistics.median(one[1] for one in passes)
        return {
            "bytes_read": figures.bytes_read, "bytes_written": figures.bytes_written, "run_s": run_s,
            "run_cpu_s": run_cpu_s,
            "duration_s": figures.duration_s, "entries_read": figures.entries_read,
            "entries_written": figures.entries_written, "dead_marked": figures.dead_marked,
            "merged_ledgers": figures.merged_ledgers, "rounds": figures.rounds,
            "os_read_bytes": after["rchar"] - before["rchar"], "os_write_bytes": after["wchar"] - before["wchar"],
            "peak_rss": peak_rss, "ledgers": len(view.ledger_ids), "view_entries": view.entries,
            "view_bytes": view.size, "reader_messages": messages, "reader_s": read_s,
            "reader_messages_per_s": messages / read_s if read_s else 0.0, "reader_digest": digest,
        }
    finally:
        compactor.close()
        ledger.close()
        data_dir.close()


CHILDREN = {"setup": child_setup, "run": child_run}


# --- the parent -------------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="bench-churn-", dir=args.dir)
    try:
        spec = {"keys": args.keys, "update_share": args.update_share, "batch_size": args.batch_size,
                "value_bytes": args.value_bytes, "seed": args.seed}
        print(f"workload: {args.keys:,} keys in batches of {args.batch_size}, {args.value_bytes} B values; "
              f"{args.update_share:.2%} of the keys updated; under {root}")
        base = os.path.join(root, "base")
        setup = _child.spawn(__file__, "setup", {**spec, "dir": base})
        print(f"setup: {json.dumps(setup)}")
        results = {}
        for name, rewrite in (("incremental", False), ("full_rewrite", True)):
            copy = os.path.join(root, name)
            started = time.perf_counter()
            shutil.copytree(base, copy, ignore=shutil.ignore_patterns("LOCK"))
            print(f"{name}: copied the data dir in {time.perf_counter() - started:.1f} s")
        if not args.keep:
            shutil.rmtree(base)
        for name, rewrite in (("incremental", False), ("full_rewrite", True)):
            copy = os.path.join(root, name)
            results[name] = _child.spawn(__file__, "run", {"dir": copy, "rewrite": rewrite,
                                                           "reader_passes": args.reader_passes})
            if not args.keep:
                shutil.rmtree(copy)
            print(f"{name}: {json.dumps(results[name])}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    incremental, full = results["incremental"], results["full_rewrite"]
    ratios = {
        "bytes_written_ratio": _ratio(incremental["bytes_written"], full["bytes_written"]),
        "run_s_ratio": _ratio(incremental["run_s"], full["run_s"]),
        "run_cpu_s_ratio": _ratio(incremental["run_cpu_s"], full["run_cpu_s"]),
        "reader_throughput_ratio": _ratio(incremental["reader_messages_per_s"], full["reader_messages_per_s"]),
    }
    acceptance = {
        name: value is not None and (value >= THRESHOLDS[name] if name == "reader_throughput_ratio"
                                     else value <= THRESHOLDS[name])
        for name, value in ratios.items() if name in THRESHOLDS
    }
    return {
        "workload": {**spec, "reader": "compactor.view.reader.CompactedReader (the broker's read-compacted path)"},
        "setup": setup, "incremental": incremental, "full_rewrite": full, **ratios,
        "identical": incremental["reader_digest"] == full["reader_digest"]
        and incremental["reader_messages"] == full["reader_messages"],
        "thresholds": THRESHOLDS, "acceptance": acceptance,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys of the compacted view")
    parser.add_argument("--update-share", type=float, default=0.01, help="share of the keys written again")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per batch entry")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reader-passes", type=int, default=3, help="reader passes over each view (median)")
    parser.add_argument("--dir", default=None, help="where the data dirs go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="leave the data dirs behind")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress on stderr)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, spec = args.child
        print(json.dumps(CHILDREN[kind](json.loads(spec))))
        return
    if not 0 < args.update_share <= 1 or args.keys < 1 or args.keys >= 10**KEY_DIGITS:
        parser.error(f"--keys must be 1..{10**KEY_DIGITS - 1} and --update-share in (0, 1]")
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        result = measure(args)
        if not args.json:
            print(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
