"""Spark engine per master and the local engine: one full compaction run of the same topic, each in its own process.

Run: ``.venv/bin/python -m bench.spark [--messages 5000000] [--keys 1000000] [--masters local[1],local[2]] [--json]``
(needs the ``spark`` extra and Java; ``--messages 500000 --keys 100000`` for a quick look).

Workload (``bench/_workload.py``, seeded): ``--messages`` messages over ``--keys`` keys drawn
uniformly, ``--value-bytes`` random bytes each, a ``--tombstones`` fraction of tombstones, in
batch entries of ``--batch-size`` slots (a producer with batching on). It is written once
into a data dir (``DataDir`` + ``ManagedLedger``, ``--entries-per-ledger`` entries a ledger,
``SyncPolicy.NONE`` for setup speed), beside a warm-up topic of the same shape a tenth of its
size, and their sealed ledgers are given their key indexes (``compactor.local.key_index``), as
the broker's background builds give them (``--no-index``: left without, so the first run builds them); the data dir
is copied afresh for each run.

Each run is a fresh child process, the *broker*, that opens its copy and times
``Compactor.compact`` of the topic with ``CompactionConfig(engine=...)``:

* **local** (``local_engine``): the whole run with the default memory budget, its rounds in a
  worker process as the broker runs them (``--local-in-process``: in the broker's process);
* **local-bounded** (``--bounded``): the same with ``--bounded-budget-bytes`` as the budget,
  so the run goes in rounds (``compactor.local.rounds``);
* **spark**, once per master of ``--masters`` (``masters``): the run as Spark jobs on that
  master; the session is started and warmed by compacting the warm-up topic *before* the
  timed run (so that the JVM's JIT has compiled the run's paths, as in a broker that has
  compacted before), and that start and warm-up are reported apart (``session_s``): a
  broker keeps its session for every run. The local engines are warmed alike (their worker process starts).

Figures per run (median of ``--runs``): wall time of the run, ``phase_one_s`` and
``phase_two_s`` (Spark: the key indexes' build stage, if any, and the aggregation; then the
groups' rewrite job), ``records_per_s`` (messages read / wall time), ``speedup_vs_local1``
(records/s over ``local[1]``'s, when it ran), ``cores_busy`` (the machine's busy CPU
seconds during the run over its wall time: how many cores the run kept busy, on a machine
running nothing else), ``broker_peak_rss_bytes`` (the broker's Python
process, ``VmHWM``), ``driver_peak_rss_bytes``: the Spark driver's Python process (the
broker) plus its JVM (``local[N]`` runs the executors' JVM side in it too), and
``executors_peak_rss_bytes``: the executors' Python workers together (for the local engine,
its worker process). The engines' compacted views (every entry's position and bytes, in
order) are hashed: ``identical`` is true when every run's agrees, and the bench exits 1 when
they do not. ``load_average`` is the machine's 1-minute load before and after.
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
from bench._child import busy_cpu_s, peak_rss_bytes
from bench._workload import Workload
from compactor.local.key_index import ensure_index
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.view.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.storage.base import SyncPolicy
from ledger.storage.file import FileLedgerStore

TOPIC = "persistent://public/default/bench-spark"
WARMUP_TOPIC = "persistent://public/default/bench-spark-warmup"
WARMUP_FRACTION = 10  # the warm-up topic: a tenth of the workload, of its shape
WARMUP_MESSAGES_MIN = 10
MIB = 1024 * 1024
ENGINES = ("local", "local-bounded", "spark")
LOCAL_ENGINE = "local_engine"


def _ledger_config(spec: dict[str, Any]) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(max_entries_per_ledger=spec["entries_per_ledger"])


def child_setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the topic, and the warm-up topic, into ``spec["dir"]``."""
    workload = Workload(spec["messages"], spec["keys"], value_bytes=spec["value_bytes"],
                        tombstone_fraction=spec["tombstones"], batch_size=spec["batch_size"], seed=spec["seed"])
    started = time.perf_counter()
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy.NONE)
    warmup = ManagedLedger.open(WARMUP_TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    messages = max(WARMUP_MESSAGES_MIN, spec["messages"] // WARMUP_FRACTION)
    for data in Workload(messages, max(1, spec["keys"] // WARMUP_FRACTION), value_bytes=spec["value_bytes"],
                         tombstone_fraction=spec["tombstones"], batch_size=spec["batch_size"],
                         seed=spec["seed"] + 1).encoded():
        warmup.append(data)
    warmup_records = [record for record in warmup.ledger_list() if record.entries]
    warmup.close()
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    size = 0
    for data in workload.encoded():
        ledger.append(data)
        size += len(data)
    records = [record for record in ledger.ledger_list() if record.entries]
    ledger.close()
    written_s = time.perf_counter() - started
    indexed = 0
    if spec["index"]:
        store = FileLedgerStore(os.path.join(os.path.abspath(spec["dir"]), "ledgers"), sync=SyncPolicy.NONE,
                                read_only=True)
        try:
            for record in warmup_records + records:
                if not record.is_open:
                    ensure_index(store, record.ledger_id, compacted=False)
                    indexed += record in records
        finally:
            store.shutdown()
    data_dir.close()
    return {"seconds": written_s, "index_s": time.perf_counter() - started - written_s, "entries": workload.entries,
            "bytes": size, "ledgers": len(records), "indexed": indexed}


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


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (the JVM's Python workers, their daemon), from /proc."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found.extend(children)
        todo.extend(children)
    return found


def child_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``Compactor.compact`` of the topic in ``spec["dir"]`` on ``spec["engine"]``."""
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy.NONE)
    cursors = CursorStore(data_dir.database)
    compactor = Compactor(_config(spec))
    jvm_pid = 0
    # Warm up as a broker's long-lived compactor is: the first run starts the worker process,
    # or the JVM, the Python planner and workers, compiles the plans (seconds) and, on a topic
    # of the workload's shape, lets the JVM's JIT compile the run's paths; later ones reuse them.
    started = time.perf_counter()
    warmup = ManagedLedger.open(WARMUP_TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    compactor.compact(CompactedTopic.restore(warmup, cursors))
    session_s = time.perf_counter() - started
    if spec["engine"] == "spark":
        jvm_pid = _jvm_pid()
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    topic = CompactedTopic.restore(ledger, cursors)
    busy, started = busy_cpu_s(), time.perf_counter()
    figures = compactor.compact(topic)
    wall_s = time.perf_counter() - started
    cores_busy = (busy_cpu_s() - busy) / wall_s
    python_rss = peak_rss_bytes()
    jvm_rss = peak_rss_bytes(jvm_pid) if jvm_pid else 0
    if jvm_pid:  # the executors' Python workers (reused between tasks: alive after the job)
        worker_rss = sum(peak_rss_bytes(pid) for pid in _descendants(jvm_pid))
    else:
        worker_rss = max((peak_rss_bytes(pid) for pid in compactor.worker_pids()), default=0)
    timings = dict(getattr(compactor._spark_engine, "last_run", {}) or {})
    view = topic.view
    digest = hashlib.sha256()
    if view is not None:
        for entry in view.iter_all():
            digest.update(entry.position.ledger_id.to_bytes(8, "big") + entry.position.entry_id.to_bytes(8, "big"))
            digest.update(len(entry.data).to_bytes(8, "big") + entry.data)
    ledger.close()
    compactor.close()
    data_dir.close()
    phase_one_s = timings.get("phase_one_s", figures.phase_one_s)
    phase_two_s = wall_s - phase_one_s if timings else figures.phase_two_s
    return {
        "wall_s": wall_s, "cores_busy": cores_busy, "phase_one_s": phase_one_s, "phase_two_s": phase_two_s,
        "index_build_s": timings.get("index_build_s", 0.0), "indexes_built": timings.get("indexes_built", 0),
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
        "records_per_s": messages / median("wall_s"), "wall_s": median("wall_s"), "cores_busy": median("cores_busy"),
        "phase_one_s": median("phase_one_s"), "phase_two_s": median("phase_two_s"),
        "phase_one_records_per_s": messages / max(median("phase_one_s"), 1e-9),
        "index_build_s": median("index_build_s"),
        "session_s": median("session_s"), "rounds": int(median("rounds")), "messages_read": int(median("messages_read")),
        "entries_written": runs[0]["entries_written"], "broker_peak_rss_bytes": python_rss,
        "driver_peak_rss_bytes": python_rss + jvm_rss, "driver_python_peak_rss_bytes": python_rss,
        "driver_jvm_peak_rss_bytes": jvm_rss, "executors_peak_rss_bytes": int(median("worker_rss")), "runs": len(runs),
    }


def _print_table(args: argparse.Namespace, setup: dict[str, Any], runs: dict[str, dict[str, Any]],
                 identical: bool, load: tuple[float, float]) -> None:
    print(f"workload: {args.messages:,} messages over {args.keys:,} keys, {args.value_bytes} B values, "
          f"{args.tombstones:.1%} tombstones, batches of {args.batch_size}; {setup['entries']:,} entries in "
          f"{setup['ledgers']} ledgers ({setup['indexed']} indexed), {setup['bytes'] / MIB:,.1f} MiB")
    print(f"{os.cpu_count()} CPUs; load average {load[0]:.1f} before, {load[1]:.1f} after; median of {args.runs} "
          "run(s), each in a fresh process")
    print()
    print(f"  {'run':<16} {'wall s':>7} {'p1 s':>7} {'p2 s':>7} {'cores':>5} {'rec/s':>10} {'x local[1]':>10} "
          f"{'broker MiB':>10} {'driver MiB':>10} {'exec MiB':>9} {'session s':>9}")
    for name, figures in runs.items():
        speedup = figures.get("speedup_vs_local1")
        print(f"  {name:<16} {figures['wall_s']:>7.2f} {figures['phase_one_s']:>7.2f} {figures['phase_two_s']:>7.2f} "
              f"{figures['cores_busy']:>5.2f} {figures['records_per_s']:>10,.0f} {'' if speedup is None else f'{speedup:.2f}':>10} "
              f"{figures['broker_peak_rss_bytes'] / MIB:>10,.0f} {figures['driver_peak_rss_bytes'] / MIB:>10,.0f} "
              f"{figures['executors_peak_rss_bytes'] / MIB:>9,.0f} {figures['session_s']:>9.1f}")
    print()
    print(f"compacted views identical across every run: {identical}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--tombstones", type=float, default=0.01, help="fraction of messages that are tombstones")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per batch entry")
    parser.add_argument("--entries-per-ledger", type=int, default=5000)
    parser.add_argument("--masters", default="local[2]", help="comma-separated Spark master URLs, one run each")
    parser.add_argument("--master", default=None, help=argparse.SUPPRESS)  # the former single-master flag
    parser.add_argument("--no-local", action="store_true", help="do not run the local engine")
    parser.add_argument("--bounded", action="store_true", help="also run the local engine in rounds")
    parser.add_argument("--bounded-budget-bytes", type=int, default=32 * MIB,
                        help="memory budget of the local-bounded engine")
    parser.add_argument("--local-in-process", action="store_true",
                        help="run the local engines' rounds in the broker's process, not in a worker process")
    parser.add_argument("--no-index", action="store_true",
                        help="leave the sealed ledgers without key indexes (the first run builds them)")
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

    masters = [master for master in (args.master or args.masters).split(",") if master]
    plan: dict[str, dict[str, Any]] = {}  # run name: what its spec adds
    if not args.no_local:
        plan[LOCAL_ENGINE] = {"engine": "local"}
    if args.bounded:
        plan["local_bounded"] = {"engine": "local-bounded"}
    for master in masters:
        plan[master] = {"engine": "spark", "master": master}
    base = {
        "messages": args.messages, "keys": args.keys, "value_bytes": args.value_bytes, "tombstones": args.tombstones,
        "batch_size": args.batch_size, "entries_per_ledger": args.entries_per_ledger, "seed": args.seed,
        "master": "local[1]", "bounded_budget_bytes": args.bounded_budget_bytes,
        "local_in_process": args.local_in_process, "index": not args.no_index,
    }
    load_before = os.getloadavg()[0]
    root = tempfile.mkdtemp(prefix="bench-spark-", dir=args.dir)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in plan}
    try:
        template = os.path.join(root, "template")
        setup = spawn("setup", {**base, "dir": template})
        for run in range(args.runs):
            for name, runs in results.items():
                copy = os.path.join(root, f"run-{len(runs)}-{abs(hash(name))}")
                shutil.copytree(template, copy)
                try:
                    runs.append(spawn("run", {**base, **plan[name], "dir": copy}))
                    print(f"{name} run {run + 1}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
                finally:
                    shutil.rmtree(copy, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = (load_before, os.getloadavg()[0])

    figures = {name: _summary(runs, args.messages) for name, runs in results.items()}
    one = figures.get("local[1]")
    for name, summary in figures.items():
        summary["speedup_vs_local1"] = None if one is None else summary["records_per_s"] / one["records_per_s"]
    identical = len({run["digest"] for runs in results.values() for run in runs}) == 1
    if args.json:
        print(json.dumps({
            "workload": {**{k: v for k, v in base.items() if k not in ("seed", "master")}, "entries": setup["entries"],
                         "bytes": setup["bytes"], "ledgers": setup["ledgers"], "indexed": setup["indexed"],
                         "cpus": os.cpu_count()},
            "masters": {master: figures[master] for master in masters},
            "local_engine": figures.get(LOCAL_ENGINE), "local_bounded": figures.get("local_bounded"),
            "identical": identical, "load_average": {"before": load[0], "after": load[1]},
        }))
    else:
        _print_table(args, setup, figures, identical, load)
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
