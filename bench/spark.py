"""Local engine, bounded local engine and Spark engine: one full compaction run of the same topic, each in its own process.

Run: ``.venv/bin/python -m bench.spark [--messages 20000000] [--keys 5000000] [--master local[2]] [--json]``
(needs the ``spark`` extra and Java; ``--messages 500000 --keys 100000`` for a quick look).

Workload (``bench/_workload.py``, seeded): ``--messages`` messages over ``--keys`` keys drawn
uniformly, ``--value-bytes`` random bytes each, a ``--tombstones`` fraction of tombstones, in
batch entries of ``--batch-size`` slots (a producer with batching on). It is written once
into a data dir (``DataDir`` + ``ManagedLedger``, ``--entries-per-ledger`` entries a ledger,
``SyncPolicy.NONE`` for setup speed), beside a ten-message warm-up topic, and copied afresh
for each run.

Each run is a fresh child process, the *broker*, that opens its copy and times
``Compactor.compact`` of the topic with ``CompactionConfig(engine=...)``:

* **local**: the whole run with the default memory budget, its rounds in a worker process
  as the broker runs them (``--local-in-process``: in the broker's process);
* **local-bounded**: the same with ``--bounded-budget-bytes`` as the budget, so the run
  goes in rounds (``compactor.rounds``);
* **spark**: the run as Spark jobs on ``--master`` (default ``local[2]``); the session is
  started and warmed by compacting the warm-up topic *before* the timed run, and that start
  is reported apart (``session_s``): a broker keeps its session for every run. The local
  engines are warmed alike (their worker process starts).

Figures per engine (median of ``--runs``): wall time of the run and of phase one,
``records_per_s`` (messages read / wall time), ``broker_peak_rss_bytes`` (the broker's
Python process, ``VmHWM``), and ``driver_peak_rss_bytes``: the Spark driver's Python
process (the broker) plus its JVM (``local[N]`` runs the executors in that JVM too; the
Python workers are not counted); for the local engines the driver is the broker, and
``worker_peak_rss_bytes`` is the worker process's that ran the rounds. The
engines' compacted views (every entry's position and bytes, in order) are hashed:
``identical`` is true when they agree across engines and runs, and the bench exits 1 when
they do not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _child
from bench._child import peak_rss_bytes
from bench._workload import Workload
from compactor.runner import CompactionConfig, Compactor
from compactor.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.storage.base import SyncPolicy

TOPIC = "persistent://public/default/bench-spark"
WARMUP_TOPIC = "persistent://public/default/bench-spark-warmup"
WARMUP_MESSAGES = 10
MIB = 1024 * 1024
ENGINES = ("local", "local-bounded", "spark")


def _ledger_config(spec: dict[str, Any]) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(max_entries_per_ledger=spec["entries_per_ledger"])


def child_setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the topic, and the warm-up topic, into ``spec["dir"]``."""
    workload = Workload(spec["messages"], spec["keys"], value_bytes=spec["value_bytes"],
                        tombstone_fraction=spec["tombstones"], batch_size=spec["batch_size"], seed=spec["seed"])
    started = time.perf_counter()
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy.NONE)
    warmup = ManagedLedger.open(WARMUP_TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    for data in Workload(WARMUP_MESSAGES, WARMUP_MESSAGES, value_bytes=10, batch_size=1, seed=0).encoded():
        warmup.append(data)
    warmup.close()
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    size = 0
    for data in workload.encoded():
        ledger.append(data)
        size += len(data)
    ledgers = len([record for record in ledger.ledger_list() if record.entries])
    ledger.close()
    data_dir.close()
    return {"seconds": time.perf_counter() - started, "entries": workload.entries, "bytes": size, "ledgers": ledgers}


def _config(spec: dict[str, Any]) -> CompactionConfig:
    """The engine's configuration; the local engines' rounds run in a worker process, as
    the broker's do (``--compaction-worker-process``), unless ``--local-in-process``."""
    workers = 0 if spec["local_in_process"] else 1
    if spec["engine"] == "local-bounded":
        return CompactionConfig(engine="local", memory_budget_bytes=spec["bounded_budget_bytes"],
                                worker_processes=workers)
    return CompactionConfig(engine=spec["engine"], spark_master=spec["master"], worker_processes=workers)


def _jvm_pid() -> int:
    """The pid of the Spark driver's JVM this process started (0: none)."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    gateway = None if context is None else context._gateway
    return int(gateway.proc.pid) if gateway is not None and gateway.proc is not None else 0


def child_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``Compactor.compact`` of the topic in ``spec["dir"]`` on ``spec["engine"]``."""
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy.NONE)
    cursors = CursorStore(data_dir.database)
    compactor = Compactor(_config(spec))
    jvm_pid = 0
    # Warm up as a broker's long-lived compactor is: the first run starts the worker process,
    # or the JVM, the Python planner and workers and compiles the plans (seconds); later
    # ones reuse them.
    started = time.perf_counter()
    warmup = ManagedLedger.open(WARMUP_TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    compactor.compact(CompactedTopic.restore(warmup, cursors))
    session_s = time.perf_counter() - started
    if spec["engine"] == "spark":
        jvm_pid = _jvm_pid()
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    topic = CompactedTopic.restore(ledger, cursors)
    started = time.perf_counter()
    figures = compactor.compact(topic)
    wall_s = time.perf_counter() - started
    python_rss = peak_rss_bytes()
    jvm_rss = peak_rss_bytes(jvm_pid) if jvm_pid else 0
    worker_rss = max((peak_rss_bytes(pid) for pid in compactor.worker_pids()), default=0)
    view = topic.view
    digest = hashlib.sha256()
    if view is not None:
        for entry in view.iter_all():
            digest.update(entry.position.ledger_id.to_bytes(8, "big") + entry.position.entry_id.to_bytes(8, "big"))
            digest.update(len(entry.data).to_bytes(8, "big") + entry.data)
    ledger.close()
    compactor.close()
    data_dir.close()
    return {
        "wall_s": wall_s, "phase_one_s": figures.phase_one_s, "phase_two_s": figures.phase_two_s,
        "session_s": session_s, "messages_read": figures.messages_read, "entries_read": figures.entries_read,
        "entries_written": figures.entries_written, "removed_events": figures.removed_events,
        "rounds": figures.rounds, "python_rss": python_rss, "jvm_rss": jvm_rss, "worker_rss": worker_rss,
        "digest": digest.hexdigest(),
    }


CHILDREN = {"setup": child_setup, "run": child_run}


def spawn(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return _child.spawn(__file__, kind, spec, env=env, quiet=True)


def _summary(runs: list[dict[str, Any]], messages: int) -> dict[str, Any]:
    """One engine's figures: medians over its runs; records/s count the topic's ``messages``
    once (a run in rounds reads some of them again)."""
    def median(name: str) -> float:
        return statistics.median(float(run[name]) for run in runs)

    python_rss, jvm_rss = int(median("python_rss")), int(median("jvm_rss"))
    return {
        "records_per_s": messages / median("wall_s"), "wall_s": median("wall_s"),
        "phase_one_s": median("phase_one_s"), "phase_two_s": median("phase_two_s"),
        "phase_one_records_per_s": messages / max(median("phase_one_s"), 1e-9),
        "session_s": median("session_s"), "rounds": int(median("rounds")), "messages_read": int(median("messages_read")),
        "entries_written": runs[0]["entries_written"], "broker_peak_rss_bytes": python_rss,
        "driver_peak_rss_bytes": python_rss + jvm_rss, "driver_python_peak_rss_bytes": python_rss,
        "driver_jvm_peak_rss_bytes": jvm_rss, "worker_peak_rss_bytes": int(median("worker_rss")), "runs": len(runs),
    }


def _print_table(args: argparse.Namespace, setup: dict[str, Any], engines: dict[str, dict[str, Any]],
                 identical: bool) -> None:
    print(f"workload: {args.messages:,} messages over {args.keys:,} keys, {args.value_bytes} B values, "
          f"{args.tombstones:.1%} tombstones, batches of {args.batch_size}; {setup['entries']:,} entries in "
          f"{setup['ledgers']} ledgers, {setup['bytes'] / MIB:,.1f} MiB (written in {setup['seconds']:.1f} s)")
    print(f"spark master: {args.master}; {os.cpu_count()} CPUs; bounded budget {args.bounded_budget_bytes / MIB:,.0f} "
          f"MiB; median of {args.runs} run(s), each in a fresh process")
    print()
    print(f"  {'engine':<14} {'wall s':>7} {'p1 s':>7} {'p2 s':>7} {'rounds':>6} {'rec/s':>10} "
          f"{'broker MiB':>10} {'driver MiB':>10} {'JVM MiB':>8} {'worker MiB':>10} {'session s':>9}")
    for name, figures in engines.items():
        print(f"  {name:<14} {figures['wall_s']:>7.2f} {figures['phase_one_s']:>7.2f} {figures['phase_two_s']:>7.2f} "
              f"{figures['rounds']:>6} {figures['records_per_s']:>10,.0f} "
              f"{figures['broker_peak_rss_bytes'] / MIB:>10,.0f} {figures['driver_peak_rss_bytes'] / MIB:>10,.0f} "
              f"{figures['driver_jvm_peak_rss_bytes'] / MIB:>8,.0f} {figures['worker_peak_rss_bytes'] / MIB:>10,.0f} "
              f"{figures['session_s']:>9.1f}")
    print()
    print(f"compacted views identical across engines and runs: {identical}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--tombstones", type=float, default=0.01, help="fraction of messages that are tombstones")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per batch entry")
    parser.add_argument("--entries-per-ledger", type=int, default=5000)
    parser.add_argument("--master", default="local[2]", help="Spark master URL of the spark engine")
    parser.add_argument("--bounded-budget-bytes", type=int, default=32 * MIB,
                        help="memory budget of the local-bounded engine")
    parser.add_argument("--local-in-process", action="store_true",
                        help="run the local engines' rounds in the broker's process, not in a worker process")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of " + ", ".join(ENGINES))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where the data dirs go (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, spec = args.child
        print(json.dumps(CHILDREN[kind](json.loads(spec))))
        return

    names = [name for name in args.engines.split(",") if name]
    if unknown := set(names) - set(ENGINES):
        parser.error(f"unknown engine(s) {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    base = {
        "messages": args.messages, "keys": args.keys, "value_bytes": args.value_bytes, "tombstones": args.tombstones,
        "batch_size": args.batch_size, "entries_per_ledger": args.entries_per_ledger, "seed": args.seed,
        "master": args.master, "bounded_budget_bytes": args.bounded_budget_bytes,
        "local_in_process": args.local_in_process,
    }
    root = tempfile.mkdtemp(prefix="bench-spark-", dir=args.dir)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        template = os.path.join(root, "template")
        setup = spawn("setup", {**base, "dir": template})
        for run in range(args.runs):
            for engine, runs in results.items():
                copy = os.path.join(root, f"{engine}-{run}")
                shutil.copytree(template, copy)
                try:
                    runs.append(spawn("run", {**base, "engine": engine, "dir": copy}))
                    print(f"{engine} run {run + 1}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
                finally:
                    shutil.rmtree(copy, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    engines = {name: _summary(runs, args.messages) for name, runs in results.items()}
    identical = len({run["digest"] for runs in results.values() for run in runs}) == 1
    if args.json:
        print(json.dumps({
            "workload": {**{k: v for k, v in base.items() if k != "seed"}, "entries": setup["entries"],
                         "bytes": setup["bytes"], "ledgers": setup["ledgers"], "cpus": os.cpu_count()},
            "engines": engines, "identical": identical,
        }))
    else:
        _print_table(args, setup, engines, identical)
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
