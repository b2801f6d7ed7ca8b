"""Local engine vs Spark engine: one full compaction run of the same topic, each in its own process.

Run: ``.venv/bin/python bench/spark.py [--messages 5000000] [--keys 1000000] [--master local[2]]``
(needs the ``spark`` extra and Java; ``--messages 500000 --keys 100000`` for a quick look).

Workload (``bench/_workload.py``, seeded): ``--messages`` messages over ``--keys`` keys drawn
uniformly, ``--value-bytes`` random bytes each, a ``--tombstones`` fraction of tombstones, in
batch entries of ``--batch-size`` slots (a producer with batching on). It is written once
into a data dir (``DataDir`` + ``ManagedLedger``, ``--entries-per-ledger`` entries a ledger,
``SyncPolicy.NONE`` for setup speed) and copied afresh for each run.

Each run is a fresh child process that opens its copy and times ``Compactor.compact`` with
``CompactionConfig(engine=...)``:

* **local**: phase one in the process (``compactor.algorithm``);
* **spark**: the whole pipeline (both phases, the compacted ledgers written by the
  executors) as a Spark job on ``--master`` (default ``local[2]``); the Spark session is
  started, and warmed with a run over the first ten entries whose ledgers are deleted
  (which starts the Python planner and workers), *before* the timed run, and that start is
  reported apart (``session s``): a broker keeps its session for every run.

Figures per engine (median of ``--runs``): wall time of the run and of phase one,
records/s (messages read / wall time, and / phase-one time), and the driver's peak RSS:
the Python process's ``VmHWM`` (``/proc/self/status``) and, for Spark, the driver JVM's
(``local[N]`` runs the executors in that JVM too; the Python workers are not counted). The
two engines' compacted ledgers are hashed: the bench fails if they differ.
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
from compactor.engine import LedgerRange, RewriteInput
from compactor.runner import CompactionConfig, Compactor
from compactor.topic import CompactedTopic
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.position import Position
from ledger.storage.base import SyncPolicy

TOPIC = "persistent://public/default/bench-spark"
MIB = 1024 * 1024


def _ledger_config(spec: dict[str, Any]) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(max_entries_per_ledger=spec["entries_per_ledger"])


def child_setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the topic into ``spec["dir"]``."""
    workload = Workload(spec["messages"], spec["keys"], value_bytes=spec["value_bytes"],
                        tombstone_fraction=spec["tombstones"], batch_size=spec["batch_size"], seed=spec["seed"])
    started = time.perf_counter()
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy.NONE)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    size = 0
    for data in workload.encoded():
        ledger.append(data)
        size += len(data)
    ledgers = len([record for record in ledger.ledger_list() if record.entries])
    ledger.close()
    data_dir.close()
    return {"seconds": time.perf_counter() - started, "entries": workload.entries, "bytes": size, "ledgers": ledgers}


def child_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``Compactor.compact`` of the topic in ``spec["dir"]`` on ``spec["engine"]``."""
    engine = spec["engine"]
    spark_engine: Any = None
    session_s, jvm_pid = 0.0, 0
    data_dir = DataDir.open(spec["dir"], sync=SyncPolicy.NONE)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, _ledger_config(spec))
    topic = CompactedTopic.restore(ledger, CursorStore(data_dir.database))
    if engine == "spark":
        from compactor.spark import SparkEngine

        started = time.perf_counter()
        spark_engine = SparkEngine(spec["master"])
        # Warm up as a broker's long-lived session is: the first phase-one job starts the
        # Python planner and workers and compiles the aggregation (seconds); later ones
        # reuse them. The warm-up reads the first ten entries only.
        first = ledger.ledger_list()[0]
        warm = spark_engine.compact(RewriteInput(
            data_dir.ledgers.root, (LedgerRange(first.ledger_id, 0, min(9, first.entries - 1)),),  # type: ignore[attr-defined]
            Position(first.ledger_id, 9)), data_dir.ledgers)
        for ledger_id in warm.ledger_ids:
            data_dir.ledgers.delete(ledger_id)
        session_s = time.perf_counter() - started
        jvm_pid = spark_engine.session().sparkContext._gateway.proc.pid
    compactor = Compactor(CompactionConfig(engine=engine, spark_master=spec["master"]), spark_engine=spark_engine)
    started = time.perf_counter()
    figures = compactor.compact(topic)
    wall_s = time.perf_counter() - started
    python_rss = peak_rss_bytes()
    jvm_rss = peak_rss_bytes(jvm_pid) if jvm_pid else 0
    view = topic.view
    digest = hashlib.sha256()
    if view is not None:
        for entry in view.iter_all():
            digest.update(entry.position.ledger_id.to_bytes(8, "big") + entry.position.entry_id.to_bytes(8, "big"))
            digest.update(entry.data)
    ledger.close()
    data_dir.close()
    if spark_engine is not None:
        spark_engine.stop()
    return {
        "wall_s": wall_s, "phase_one_s": figures.phase_one_s, "phase_two_s": figures.phase_two_s,
        "session_s": session_s, "messages_read": figures.messages_read, "entries_read": figures.entries_read,
        "entries_written": figures.entries_written, "removed_events": figures.removed_events,
        "python_rss": python_rss, "jvm_rss": jvm_rss, "digest": digest.hexdigest(),
    }


CHILDREN = {"setup": child_setup, "run": child_run}


def spawn(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return _child.spawn(__file__, kind, spec, env=env, quiet=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--tombstones", type=float, default=0.01, help="fraction of messages that are tombstones")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per batch entry")
    parser.add_argument("--entries-per-ledger", type=int, default=5000)
    parser.add_argument("--master", default="local[2]", help="Spark master URL of the spark engine")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where the data dirs go (default: a temp dir)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, spec = args.child
        print(json.dumps(CHILDREN[kind](json.loads(spec))))
        return

    base = {
        "messages": args.messages, "keys": args.keys, "value_bytes": args.value_bytes, "tombstones": args.tombstones,
        "batch_size": args.batch_size, "entries_per_ledger": args.entries_per_ledger, "seed": args.seed,
        "master": args.master,
    }
    root = tempfile.mkdtemp(prefix="bench-spark-", dir=args.dir)
    results: dict[str, list[dict[str, Any]]] = {"local": [], "spark": []}
    try:
        template = os.path.join(root, "template")
        setup = spawn("setup", {**base, "dir": template})
        for run in range(args.runs):
            for engine, runs in results.items():
                copy = os.path.join(root, f"{engine}-{run}")
                shutil.copytree(template, copy)
                try:
                    runs.append(spawn("run", {**base, "engine": engine, "dir": copy}))
                finally:
                    shutil.rmtree(copy, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"workload: {args.messages:,} messages over {args.keys:,} keys, {args.value_bytes} B values, "
          f"{args.tombstones:.1%} tombstones, batches of {args.batch_size}; {setup['entries']:,} entries in "
          f"{setup['ledgers']} ledgers, {setup['bytes'] / MIB:,.1f} MiB (written in {setup['seconds']:.1f} s)")
    print(f"spark master: {args.master}; {os.cpu_count()} CPUs; median of {args.runs} run(s), each in a fresh process")
    print()
    print(f"  {'engine':<7} {'wall s':>7} {'p1 s':>7} {'p2 s':>7} {'rec/s (wall)':>13} {'rec/s (p1)':>12} "
          f"{'py RSS MiB':>11} {'JVM RSS MiB':>12} {'session s':>10}")
    for engine, runs in results.items():
        def median(name: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(float(run[name]) for run in runs)
        messages = runs[0]["messages_read"]
        print(f"  {engine:<7} {median('wall_s'):>7.2f} {median('phase_one_s'):>7.2f} {median('phase_two_s'):>7.2f} "
              f"{messages / median('wall_s'):>13,.0f} {messages / median('phase_one_s'):>12,.0f} "
              f"{median('python_rss') / MIB:>11,.0f} {median('jvm_rss') / MIB:>12,.0f} {median('session_s'):>10.1f}")
    digests = {run["digest"] for runs in results.values() for run in runs}
    kept = results["local"][0]["entries_written"]
    print()
    print(f"compacted ledgers identical across engines and runs: {len(digests) == 1} ({kept:,} entries kept)")
    if len(digests) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
