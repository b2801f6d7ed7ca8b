"""Compaction: records/s of each phase, bytes per live key and peak RSS, batched and not.

Run: ``.venv/bin/python -m bench.compaction [--runs 3] [--messages 1000000] [--keys 100000] [--json]``
(or ``bench/compaction.py``). ``--json`` prints one JSON object on stdout (the tables go to
stderr): the workload, then for ``batched`` and ``non_batched`` the medians of the full runs
(b): ``phase_one_records_per_s``, ``phase_two_records_per_s``, ``run_records_per_s``,
``peak_rss_bytes``, ``io_floor_ratio``; ``bytes_per_live_key`` from (e);
``index_build_records_per_s`` (null with ``--no-key-index``); and the figures behind them.

Workload (``bench/_workload.py``, seeded, so every process rebuilds the same stream):
``--messages`` messages whose keys are drawn uniformly from ``--keys`` keys, values of
``--value-bytes`` random bytes, a ``--tombstones`` fraction of them tombstones (empty
value); laid out once as one non-batched entry per message and once as batch entries of
``--batch-size`` slots, all compressed with ``--compression``.

For each layout and each of ``--runs`` runs, every configuration runs in a fresh child
process (this script with ``--child``), so that the peak RSS of one does not include
another's. Peak RSS is the child's ``VmHWM`` (``/proc/self/status``): Linux carries
``getrusage().ru_maxrss`` over from the parent through fork and exec, so a child's
``ru_maxrss`` is never below its parent's peak.

* **pure**: the entries are built in memory (positions as a managed ledger with the
  default roll-over would give them); ``phase_one`` and ``phase_two`` of
  ``compactor.local.algorithm`` are timed over that list. Records/s = messages read / phase time.
  Bytes per live key = the key map's ``nbytes`` (merged) / live keys, next to a plain
  ``dict[str, Position]`` (Pulsar's key → message id map) built over the same keys and
  positions in the same process, measured with ``tracemalloc``. The peak RSS of this child
  includes the input list (its RSS before the phases is printed beside it).
* **runner**: the topic is written once per layout into a real data dir (``DataDir`` +
  ``ManagedLedger`` with the default ``ManagedLedgerConfig``; written with
  ``SyncPolicy.NONE`` for setup speed) and copied afresh for each run; the child opens the
  copy (``--sync``, default ``group``, the data dir's default) and times
  ``Compactor().compact(CompactedTopic.restore(ml))`` end to end, reading ``RunFigures``.
  Its peak RSS is the compactor's own footprint over a streamed topic.

* **memory**: once per layout, untimed: ``phase_one`` over the entries built as the stream
  reaches them, under ``tracemalloc`` (numpy reports its buffers to it). Bytes per live
  key = what phase one's result still holds when it returns (the merged key map and its
  packer) / live keys; the peak it held at once (update buffer, merge copies) beside it.
* **index** (unless ``--no-key-index``): once per layout, after the setup, the key index of
  every sealed ledger is built (``compactor.local.key_index.ensure_index``, what the broker's
  background builder does when a ledger is sealed), timed: ``index_build_records_per_s``
  = index rows / seconds. The runs' copies carry the indexes, so a run reads them
  (``compactor.local.indexed``); the runner child imports pyarrow before its timer starts, as a
  worker process has after its first round. ``--no-key-index`` measures the parsing rounds.
  With the key index, (e) is measured by ``child_memory_indexed`` instead: one round's
  phase one over the indexes of every sealed ledger, under ``tracemalloc`` (retained: the
  merged key map; peak: a ledger's index columns, the keyed rows waiting to be merged,
  the merge's copies).
* **I/O floor** (``bench/_io_floor.py``), in each runner child after its run, on the same
  files: plain reads of every input ledger file and a write of the compacted ledger's bytes
  to a new file with fsync. ``io_floor_ratio`` = that time / the run's wall time.

A child that only imports the same modules gives the baseline RSS. Figures are medians
over ``--runs``. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from bench import _child
from bench._child import current_rss_bytes, peak_rss_bytes
from bench._io_floor import io_floor
from bench._io_floor import ledger_files as _ledger_files
from bench._workload import CODECS, Workload
from compactor.engine import LedgerRange
from compactor.local.algorithm import phase_one, phase_two
from compactor.local.index_source import IndexSource
from compactor.local.indexed import DELETED, IndexedRound
from compactor.local.key_index import ensure_index
from compactor.local.rounds import capacity_keys
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.view.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import Entry, ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage.base import LedgerState, SyncPolicy
from ledger.storage.file import FileLedgerStore

TOPIC = "persistent://public/default/bench-compaction"
APPENDS_IN_FLIGHT_MAX = 1000
MIB = 1024 * 1024


# --- measuring in a child -------------------------------------------------------------------


def _workload(spec: dict[str, Any]) -> Workload:
    return Workload(
        messages=spec["messages"], keys=spec["keys"], value_bytes=spec["value_bytes"],
        tombstone_fraction=spec["tombstones"], batch_size=spec["batch_size"],
        compression=spec["compression"], seed=spec["seed"],
    )


def child_idle(spec: dict[str, Any]) -> dict[str, Any]:
    return {"peak_rss": peak_rss_bytes()}


def child_setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the layout's topic into ``spec["dir"]`` (SyncPolicy.NONE)."""
    workload = _workload(spec)
    started = time.perf_counter()
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy.NONE)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, ManagedLedgerConfig())
    pending: deque[Future[Position]] = deque()
    size = 0
    for data in workload.encoded():
        pending.append(ledger.append(data))
        size += len(data)
        while len(pending) > APPENDS_IN_FLIGHT_MAX:
            pending.popleft().result()
    while pending:
        pending.popleft().result()
    ledgers = len([record for record in ledger.ledger_list() if record.entries])
    ledger.close()
    data_dir.close()
    return {"seconds": time.perf_counter() - started, "entries": workload.entries, "bytes": size, "ledgers": ledgers}


def _dict_baseline(workload: Workload, entries_per_ledger: int) -> tuple[int, int]:
    """(traced bytes, live keys) of Pulsar's map: key string → message id, with tombstones
    removing their key. Keys and positions are made afresh per message, as parsing would."""
    import tracemalloc

    names = [name.encode() for name in workload.key_names]
    key_index, tombstone = workload.key_index.tolist(), workload.tombstone.tolist()
    batch_size = workload.batch_size
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    latest: dict[str, Position] = {}
    for message in range(workload.messages):
        key = names[key_index[message]].decode()
        if tombstone[message]:
            latest.pop(key, None)
            continue
        entry = message // batch_size
        batch_index = -1 if batch_size == 1 else message % batch_size
        latest[key] = Position(1 + entry // entries_per_ledger, entry % entries_per_ledger, batch_index)
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return traced, len(latest)


def child_index(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the key index of every sealed ledger of the topic in ``spec["dir"]``, as the
    broker's background builder does when a ledger is sealed (timed; written beside the
    ledgers, so the runs' copies have them)."""
    store = FileLedgerStore(os.path.join(spec["dir"], "ledgers"), sync=SyncPolicy.NONE, read_only=True)
    started = time.perf_counter()
    rows = 0
    for ledger_id in store.list():
        if store.info(ledger_id).state is LedgerState.CLOSED:
            rows += len(ensure_index(store, ledger_id, compacted=False))
    seconds = time.perf_counter() - started
    store.shutdown()
    return {"seconds": seconds, "rows": rows, "peak_rss": peak_rss_bytes()}


def child_pure(spec: dict[str, Any]) -> dict[str, Any]:
    """Both phases over an in-memory list of entries."""
    workload = _workload(spec)
    entries_per_ledger = ManagedLedgerConfig().max_entries_per_ledger
    entries = workload.in_memory(entries_per_ledger)
    rss_input = current_rss_bytes()
    started = time.perf_counter()
    result = phase_one(entries)
    phase_one_s = time.perf_counter() - started
    map_bytes_unmerged = result.key_map.nbytes
    live_keys = len(result.key_map)  # merges what is still buffered
    map_bytes = result.key_map.nbytes
    started = time.perf_counter()
    kept_entries = kept_messages = 0
    for survivor in phase_two(entries, result):
        kept_entries += 1
        kept_messages += survivor.messages
    phase_two_s = time.perf_counter() - started
    peak_rss = peak_rss_bytes()  # read before the dict baseline allocates anything
    dict_bytes, dict_keys = _dict_baseline(workload, entries_per_ledger)
    return {
        "messages_read": result.messages_read, "entries": result.entries_read, "phase_one_s": phase_one_s,
        "phase_two_s": phase_two_s, "live_keys": live_keys, "map_bytes": map_bytes,
        "map_bytes_unmerged": map_bytes_unmerged, "merges": result.key_map.merges, "kept_entries": kept_entries,
        "kept_messages": kept_messages, "dict_bytes": dict_bytes, "dict_keys": dict_keys,
        "rss_input": rss_input, "peak_rss": peak_rss,
    }


def child_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """The key map's memory, measured with ``tracemalloc`` (numpy reports its buffers to it)
    over a real ``phase_one`` of the workload's entries, each built as the stream reaches
    it: ``retained`` is what phase one's result still holds when it returns (the merged key
    map, its packer), ``peak`` the most phase one held at once (buffer and merge copies, one
    entry's transient objects). Slow under tracemalloc, so not timed and run once."""
    import tracemalloc

    workload = _workload(spec)
    entries_per_ledger = ManagedLedgerConfig().max_entries_per_ledger
    stream = (
        Entry(Position(1 + index // entries_per_ledger, index % entries_per_ledger), data)
        for index, data in enumerate(workload.encoded())
    )
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = phase_one(stream)
    live_keys = len(result.key_map)  # merges what is still buffered, as phase two will
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "live_keys": live_keys, "retained_bytes": retained - before, "peak_bytes": peak - before,
        "map_nbytes": result.key_map.nbytes,
    }


def child_memory_indexed(spec: dict[str, Any]) -> dict[str, Any]:
    """``child_memory`` for a run over the key indexes: the phase one of one round over
    every sealed ledger of the topic in ``spec["dir"]`` (``compactor.local.indexed``), under
    ``tracemalloc``: ``retained`` is the merged key map (high, low, value per key),
    ``peak`` the most phase one held at once (index columns of one ledger, keyed rows
    waiting to be merged, the merge's copies)."""
    import tracemalloc

    import pyarrow.parquet  # noqa: F401 - imported before the trace, as in a warm worker

    store = FileLedgerStore(os.path.join(spec["dir"], "ledgers"), sync=SyncPolicy.NONE, read_only=True)
    ranges = tuple(LedgerRange(ledger_id, 0, store.info(ledger_id).entries - 1) for ledger_id in store.list()
                   if store.info(ledger_id).state is LedgerState.CLOSED and store.info(ledger_id).entries)
    source = IndexSource(store, lambda size: None)
    one = IndexedRound(ranges, capacity_keys=capacity_keys(CompactionConfig().memory_budget_bytes),
                       keep_tombstones_since_ms=None, retain_null_key=False, load=source.load, read=source.read)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    one.plan()
    retained, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    key_map = one.key_map
    source.close()
    store.shutdown()
    return {
        "live_keys": int(np.count_nonzero(key_map.value != DELETED)), "retained_bytes": retained - before,
        "peak_bytes": peak - before, "map_nbytes": int(key_map.high.nbytes + key_map.low.nbytes + key_map.value.nbytes),
    }


def child_runner(spec: dict[str, Any]) -> dict[str, Any]:
    """One full ``Compactor().compact`` of the topic in ``spec["dir"]``."""
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy(spec["sync"]))
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, ManagedLedgerConfig())
    topic = CompactedTopic.restore(ledger, CursorStore(data_dir.database))
    ledgers_dir = os.path.join(spec["dir"], "ledgers")
    inputs = _ledger_files(ledgers_dir)
    if spec["key_index"]:
        importlib.import_module("pyarrow.parquet")  # as in a worker after its first round
    rss_open = current_rss_bytes()
    started = time.perf_counter()
    figures = Compactor(CompactionConfig(key_index=spec["key_index"])).compact(topic)
    wall_s = time.perf_counter() - started
    peak_rss = peak_rss_bytes()  # read before the I/O floor's buffers exist
    ledger.close()
    data_dir.close()
    [output] = sorted(set(_ledger_files(ledgers_dir)) - set(inputs))
    inputs = [path for path in inputs if os.path.exists(path)]  # closing removes an empty open ledger
    floor = io_floor(inputs, output, os.path.join(spec["dir"], "io-floor.out"))
    return {**floor, "io_floor_ratio": floor["io_floor_s"] / wall_s,
        "wall_s": wall_s, "phase_one_s": figures.phase_one_s, "phase_two_s": figures.phase_two_s,
        "duration_s": figures.duration_s, "messages_read": figures.messages_read,
        "entries_read": figures.entries_read, "bytes_read": figures.bytes_read,
        "entries_written": figures.entries_written, "bytes_written": figures.bytes_written,
        "removed_events": figures.removed_events, "key_map_bytes": figures.key_map_bytes,
        "rss_open": rss_open, "peak_rss": peak_rss,
    }


CHILDREN = {
    "idle": child_idle, "setup": child_setup, "index": child_index, "pure": child_pure, "runner": child_runner, "memory": child_memory,
    "memory_indexed": child_memory_indexed,
}


# --- the parent --------------------------------------------------------------------------------


def spawn(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _child.spawn(__file__, kind, spec)


def median(results: list[dict[str, Any]], name: str) -> float:
    return statistics.median(float(result[name]) for result in results)


def rate(results: list[dict[str, Any]], count: str, seconds: str) -> float:
    return statistics.median(float(result[count] / result[seconds]) for result in results)


def expected_live_keys(workload: Workload) -> int:
    last: dict[int, bool] = {}
    for key, tombstone in zip(workload.key_index.tolist(), workload.tombstone.tolist()):
        last[key] = tombstone
    return sum(1 for tombstone in last.values() if not tombstone)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--tombstones", type=float, default=0.01, help="fraction of messages that are tombstones")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per entry in the batched layout")
    parser.add_argument("--compression", choices=sorted(CODECS), default="none")
    parser.add_argument("--sync", choices=[policy.value for policy in SyncPolicy], default="group",
                        help="sync policy of the data dir during the compaction run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where the data dirs go (default: a temp dir)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object of the figures on stdout (the tables go to stderr)")
    parser.add_argument("--no-pure", action="store_true", help="skip the pure phases over in-memory entries (a)")
    parser.add_argument("--no-key-index", action="store_true",
                        help="runs parse every entry (CompactionConfig(key_index=False)); no index is built")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, spec = args.child
        print(json.dumps(CHILDREN[kind](json.loads(spec))))
        return
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        measured = measure(args)
        print_tables(*measured)
    if args.json:
        print(json.dumps(summary(args, *measured)))


Measured = tuple[
    float, dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]],
    dict[str, dict[str, Any]],
]
"""(idle peak RSS, setups, pure results, runner results, key map memory), per layout name."""


def measure(args: argparse.Namespace) -> Measured:
    """Every child of the benchmark, in turn; prints what the workload is."""
    base = {
        "messages": args.messages, "keys": args.keys, "value_bytes": args.value_bytes,
        "tombstones": args.tombstones, "compression": args.compression, "seed": args.seed, "sync": args.sync,
        "key_index": not args.no_key_index,
    }
    live = expected_live_keys(
        Workload(args.messages, args.keys, value_bytes=0, tombstone_fraction=args.tombstones, seed=args.seed)
    )
    print(f"workload: {args.messages:,} messages over {args.keys:,} keys, {args.value_bytes} B values, "
          f"{args.tombstones:.1%} tombstones, compression {args.compression}, seed {args.seed}; "
          f"{live:,} live keys at the end")
    print(f"topic setup: DataDir + ManagedLedger (default ManagedLedgerConfig), written with SyncPolicy.NONE; "
          f"compaction runs with SyncPolicy.{SyncPolicy(args.sync).name}; median of {args.runs} run(s), "
          f"each configuration in a fresh process")
    idle = statistics.median(spawn("idle", base)["peak_rss"] for _ in range(max(1, args.runs)))
    layouts = [("non-batched", 1), (f"batched x{args.batch_size}", args.batch_size)]
    root = tempfile.mkdtemp(prefix="bench-compaction-", dir=args.dir)
    pure: dict[str, list[dict[str, Any]]] = {}
    runner: dict[str, list[dict[str, Any]]] = {}
    setups: dict[str, dict[str, Any]] = {}
    memory: dict[str, dict[str, Any]] = {}
    try:
        for name, batch_size in layouts:
            spec = {**base, "batch_size": batch_size}
            template = os.path.join(root, f"template-{batch_size}")
            setups[name] = spawn("setup", {**spec, "dir": template})
            if spec["key_index"]:
                setups[name]["index"] = spawn("index", {**spec, "dir": template})
            memory[name] = spawn("memory_indexed", {**spec, "dir": template}) if spec["key_index"] else spawn(
                "memory", spec)
            pure[name], runner[name] = [], []
            for run in range(args.runs):
                if not args.no_pure:
                    pure[name].append(spawn("pure", spec))
                copy = os.path.join(root, f"run-{batch_size}-{run}")
                shutil.copytree(template, copy)
                try:
                    runner[name].append(spawn("runner", {**spec, "dir": copy}))
                finally:
                    shutil.rmtree(copy, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return idle, setups, {name: results for name, results in pure.items() if results}, runner, memory


def summary(args: argparse.Namespace, idle: float, setups: dict[str, dict[str, Any]],
            pure: dict[str, list[dict[str, Any]]], runner: dict[str, list[dict[str, Any]]],
            memory: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON object: the workload, then per layout the medians of the full runs."""
    figures: dict[str, Any] = {
        "messages": args.messages, "keys": args.keys, "value_bytes": args.value_bytes,
        "tombstones": args.tombstones, "compression": args.compression, "sync": args.sync, "runs": args.runs,
        "batch_size": args.batch_size, "idle_peak_rss_bytes": int(idle),
    }
    for name, results in runner.items():
        layout = "non_batched" if name == "non-batched" else "batched"
        key_map = memory[name]
        figures[layout] = {
            "phase_one_records_per_s": rate(results, "messages_read", "phase_one_s"),
            "phase_two_records_per_s": rate(results, "messages_read", "phase_two_s"),
            "run_records_per_s": rate(results, "messages_read", "wall_s"),
            "bytes_per_live_key": key_map["retained_bytes"] / key_map["live_keys"],
            "peak_bytes_per_live_key": key_map["peak_bytes"] / key_map["live_keys"],
            "peak_rss_bytes": int(median(results, "peak_rss")),
            "index_build_records_per_s": (
                setups[name]["index"]["rows"] / setups[name]["index"]["seconds"] if "index" in setups[name] else None),
            "run_key_map_peak_bytes_per_live_key": median(results, "key_map_bytes") / key_map["live_keys"],
            "io_floor_ratio": median(results, "io_floor_ratio"),
            "io_floor_s": median(results, "io_floor_s"),
            "wall_s": median(results, "wall_s"),
            "phase_one_s": median(results, "phase_one_s"),
            "phase_two_s": median(results, "phase_two_s"),
            "messages_read": results[0]["messages_read"], "entries_read": results[0]["entries_read"],
            "bytes_read": results[0]["bytes_read"], "bytes_written": results[0]["bytes_written"],
            "live_keys": key_map["live_keys"], "key_map_nbytes": key_map["map_nbytes"],
            "setup_entries": setups[name]["entries"], "setup_ledgers": setups[name]["ledgers"],
        }
        if name in pure:
            figures[layout]["pure_phase_one_records_per_s"] = rate(pure[name], "messages_read", "phase_one_s")
            figures[layout]["pure_phase_two_records_per_s"] = rate(pure[name], "messages_read", "phase_two_s")
    return figures


def print_tables(idle: float, setups: dict[str, dict[str, Any]], pure: dict[str, list[dict[str, Any]]],
                 runner: dict[str, list[dict[str, Any]]], memory: dict[str, dict[str, Any]]) -> None:
    """The human tables (a) to (e)."""
    print()
    print("setup (not timed below):")
    for name, setup in setups.items():
        print(f"  {name:<14} {setup['entries']:>9,} entries in {setup['ledgers']} ledgers, "
              f"{setup['bytes'] / MIB:,.1f} MiB, written in {setup['seconds']:.1f} s")

    print()
    print("(a) pure phases over in-memory entries (compactor.local.algorithm)")
    print(f"  {'layout':<14} {'entries':>9} {'phase 1 rec/s':>14} {'phase 2 rec/s':>14} {'p1 s':>7} {'p2 s':>7} "
          f"{'kept msgs':>10} {'merges':>6}")
    for name, results in pure.items():
        print(f"  {name:<14} {results[0]['entries']:>9,} {rate(results, 'messages_read', 'phase_one_s'):>14,.0f} "
              f"{rate(results, 'messages_read', 'phase_two_s'):>14,.0f} {median(results, 'phase_one_s'):>7.2f} "
              f"{median(results, 'phase_two_s'):>7.2f} {results[0]['kept_messages']:>10,} "
              f"{results[0]['merges']:>6}")

    print()
    print("(b) full run: Compactor().compact(CompactedTopic.restore(ml)) over the data dir")
    print(f"  {'layout':<14} {'wall s':>7} {'rec/s':>10} {'phase 1 s':>9} {'p1 rec/s':>10} {'phase 2 s':>9} "
          f"{'p2 rec/s':>10} {'written':>9} {'MiB out':>8} {'removed':>9}")
    for name, results in runner.items():
        print(f"  {name:<14} {median(results, 'wall_s'):>7.2f} {rate(results, 'messages_read', 'wall_s'):>10,.0f} "
              f"{median(results, 'phase_one_s'):>9.2f} {rate(results, 'messages_read', 'phase_one_s'):>10,.0f} "
              f"{median(results, 'phase_two_s'):>9.2f} {rate(results, 'messages_read', 'phase_two_s'):>10,.0f} "
              f"{results[0]['entries_written']:>9,} {results[0]['bytes_written'] / MIB:>8.1f} "
              f"{results[0]['removed_events']:>9,}")

    print()
    print("(c) memory: key map vs a Python dict[str, Position] (Pulsar's key -> message id map)")
    print(f"  {'layout':<14} {'live keys':>9} {'map B':>11} {'B/key':>6} {'(unmerged B)':>12} "
          f"{'dict B':>11} {'dict B/key':>10} {'dict/map':>8}")
    for name, results in pure.items():
        first = results[0]
        map_per_key = first["map_bytes"] / first["live_keys"]
        dict_per_key = median(results, "dict_bytes") / first["dict_keys"]
        print(f"  {name:<14} {first['live_keys']:>9,} {first['map_bytes']:>11,} {map_per_key:>6.1f} "
              f"{first['map_bytes_unmerged']:>12,} {median(results, 'dict_bytes'):>11,.0f} {dict_per_key:>10.1f} "
              f"{dict_per_key / map_per_key:>7.1f}x")

    print()
    print(f"(d) peak RSS (VmHWM) per child process; idle child with the same imports: {idle / MIB:,.1f} MiB")
    print(f"  {'layout':<14} {'config':<7} {'RSS before':>11} {'peak RSS':>10} {'peak - idle':>12}")
    for name, runner_results in runner.items():
        configs = (("pure", pure.get(name, []), "rss_input"), ("runner", runner_results, "rss_open"))
        for config, results, before in configs:
            if not results:
                continue
            peak = median(results, "peak_rss")
            print(f"  {name:<14} {config:<7} {median(results, before) / MIB:>8,.1f} MiB {peak / MIB:>6,.1f} MiB "
                  f"{(peak - idle) / MIB:>8,.1f} MiB")
    print("  RSS before = pure: after building the in-memory input; runner: after opening the topic")
    print("  VmHWM counts file-backed pages too (a ledger file the store maps while scanning it), not only the heap")

    print()
    print("(e) key map memory traced (tracemalloc, one untimed phase one) and the full run's I/O floor")
    print(f"  {'layout':<14} {'live keys':>9} {'held B/key':>10} {'peak B/key':>10} {'nbytes/key':>10} "
          f"{'read s':>7} {'write s':>7} {'floor s':>7} {'run s':>7} {'floor/run':>9}")
    for name, results in runner.items():
        key_map = memory[name]
        print(f"  {name:<14} {key_map['live_keys']:>9,} {key_map['retained_bytes'] / key_map['live_keys']:>10.1f} "
              f"{key_map['peak_bytes'] / key_map['live_keys']:>10.1f} "
              f"{key_map['map_nbytes'] / key_map['live_keys']:>10.1f} {median(results, 'io_read_s'):>7.2f} "
              f"{median(results, 'io_write_s'):>7.2f} {median(results, 'io_floor_s'):>7.2f} "
              f"{median(results, 'wall_s'):>7.2f} {median(results, 'io_floor_ratio'):>9.3f}")
    print("  held = what phase one's result keeps (the merged map); peak = the most phase one held at once;")
    print("  floor = plain reads of the input ledger files + a write of the output's bytes with fsync, same files")

if __name__ == "__main__":
    main()
