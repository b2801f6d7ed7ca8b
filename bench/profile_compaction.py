"""Profiles of a full compaction run (py-spy), summarised per phase and function.

Run: ``.venv/bin/python -m bench.profile_compaction [--messages 1000000] [--keys 100000]
[--out DIR]`` (needs ``py-spy`` in the same environment: ``pip install py-spy``).

For each layout (non-batched, batched ``--batch-size``) it writes the topic once with
``bench/compaction.py``'s setup child, then records that benchmark's runner child
(``Compactor().compact`` end to end, the same code the benchmark times) under
``py-spy record --format raw --nolineno`` and prints, per phase, the functions with the
most samples: *self* (the sampled frame is the function) and *total* (the function is on
the stack). Samples are put in a phase by their stack: under ``_phase_two`` → phase two;
under ``_local_phase_one`` → phase one (over key indexes, the default, which the
setup builds first as the broker's background builder would: ``IndexedRound.survivors``
and ``IndexedRound.plan``; ``--no-key-index`` profiles the parsing rounds); on a thread-pool worker → phase one reads (phase
one reads the store on one, beside the main thread); under the file store's
``_flush_loop`` → flusher (phase two's appends made durable); anything else (opening the
topic, publishing) → other. py-spy leaves out threads it sees idle, though a thread
waiting in Python code (``Condition.wait``) may still be sampled. The *total* lists leave
out the common path: functions on at least 99.5 % of a phase's stacks.

The raw stacks are kept in ``--out`` (default: a temp dir) for a closer look, e.g. with
``py-spy``'s speedscope or flamegraph formats. A benchmark tool: it asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _child

COMPACTION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compaction.py")
PHASES = (("phase two", {"Compactor._phase_two", "IndexedRound.survivors"}),
          ("phase one", {"Compactor._local_phase_one", "IndexedRound.plan"}),
          ("phase one reads", {"_worker"}), ("flusher", {"FileLedgerStore._flush_loop"}))
COMMON_SHARE = 0.995  # a function on at least this share of a phase's stacks is its common path


def phase_of(frames: list[str]) -> str:
    """Which phase a sampled stack belongs to (module docstring)."""
    functions = {frame.partition(" (")[0] for frame in frames}
    for phase, markers in PHASES:
        if functions & markers:
            return phase
    return "other"


def summarise(raw_path: str, top: int) -> dict[str, dict[str, object]]:
    """Per phase: samples, and the ``top`` functions by self and by total samples."""
    samples: collections.Counter[str] = collections.Counter()
    self_counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total_counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(raw_path) as raw:
        for line in raw:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_text)
            frames = stack.split(";")
            phase = phase_of(frames)
            samples[phase] += count
            self_counts[phase][_short(frames[-1])] += count
            for function in {_short(frame) for frame in frames}:
                total_counts[phase][function] += count
    all_samples = sum(samples.values())
    return {
        phase: {
            "samples": count, "share_of_run": count / all_samples,
            "self": [(name, n / count) for name, n in self_counts[phase].most_common(top)],
            "total": [(name, n / count) for name, n in total_counts[phase].most_common()
                      if n / count < COMMON_SHARE][:top],
        }
        for phase, count in samples.most_common()
    }


def _short(frame: str) -> str:
    """``function (path)`` with the path cut to its last two parts."""
    function, _, path = frame.partition(" (")
    return f"{function} ({'/'.join(path.rstrip(')').split('/')[-2:])})"


def profile(layout: str, spec: dict[str, object], root: str, rate: int) -> str:
    """Record one runner child of ``layout``; returns the raw stacks' path."""
    template, copy = os.path.join(root, f"{layout}-template"), os.path.join(root, f"{layout}-run")
    _child.spawn(COMPACTION, "setup", {**spec, "dir": template})
    if spec["key_index"]:  # as the broker's background builder leaves the sealed ledgers
        _child.spawn(COMPACTION, "index", {**spec, "dir": template})
    shutil.copytree(template, copy)
    raw = os.path.join(root, f"{layout}.raw.txt")
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    subprocess.run(
        [py_spy, "record", "--format", "raw", "--nolineno", "--rate", str(rate), "--output", raw, "--",
         sys.executable, COMPACTION, "--child", "runner", json.dumps({**spec, "dir": copy})],
        check=True, stdout=subprocess.DEVNULL,
    )
    shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(template, ignore_errors=True)
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", default=None, help="where the raw stacks are kept (default: a temp dir)")
    parser.add_argument("--summarise", nargs="+", metavar="RAW", help="only summarise raw stacks recorded before")
    parser.add_argument("--no-key-index", action="store_true", help="profile the parsing rounds (no key index)")
    args = parser.parse_args()
    if args.summarise:
        for raw in args.summarise:
            report(raw, raw, args.top)
        return
    root = args.out or tempfile.mkdtemp(prefix="bench-profile-")
    os.makedirs(root, exist_ok=True)
    base = {"messages": args.messages, "keys": args.keys, "value_bytes": args.value_bytes, "tombstones": 0.01,
            "compression": "none", "seed": 1, "sync": "group", "key_index": not args.no_key_index}
    for layout, batch_size in (("non-batched", 1), (f"batched-x{args.batch_size}", args.batch_size)):
        raw = profile(layout, {**base, "batch_size": batch_size}, root, args.rate)
        report(f"{layout}: {args.messages:,} messages, {args.keys:,} keys ({raw})", raw, args.top)


def report(title: str, raw: str, top: int) -> None:
    """Print ``summarise(raw, top)`` under ``title``."""
    print(f"\n== {title}")
    for phase, figures in summarise(raw, top).items():
        print(f"  -- {phase}: {figures['samples']} samples, {figures['share_of_run']:.0%} of the run")
        for kind in ("self", "total"):
            rows = figures[kind]
            assert isinstance(rows, list)
            print(f"     {kind}:")
            for name, share in rows:
                print(f"       {share:6.1%}  {name}")


if __name__ == "__main__":
    main()
