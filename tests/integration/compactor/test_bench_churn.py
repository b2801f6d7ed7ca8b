"""``bench.churn`` (issue 30, point 5) runs end to end at a small size and reports what it says.

Not its figures (a benchmark asserts nothing about speed here): the JSON object holds both
runs with their bytes and times, the ratios are those of the runs' figures, the two views
deliver the same message ids, the incremental run wrote only the backlog's survivors and
marked the updated keys dead, and the full rewrite wrote the whole view.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

KEYS, SHARE, BATCH = 2000, 0.05, 10


def test_the_churn_bench_compares_an_incremental_run_with_a_full_rewrite_of_the_same_view(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.churn", "--keys", str(KEYS), "--update-share", str(SHARE),
         "--batch-size", str(BATCH), "--reader-passes", "1", "--dir", str(tmp_path), "--json"],
        check=True, capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[3],
    )
    result = json.loads(completed.stdout)
    incremental, full = result["incremental"], result["full_rewrite"]
    for run in (incremental, full):
        assert {"bytes_read", "bytes_written", "run_s", "reader_messages_per_s"} <= run.keys()
        assert run["reader_messages"] == KEYS  # every key once: the updates replaced, not added
    updated = round(KEYS * SHARE)
    assert result["setup"]["updated_keys"] == updated
    assert incremental["dead_marked"] == updated and incremental["ledgers"] == 2
    # the backlog's entries, each written once (every updated key once): their bytes and a frame each
    assert incremental["entries_written"] == result["setup"]["update_entries"]
    assert result["setup"]["update_bytes"] < incremental["bytes_written"] < 2 * result["setup"]["update_bytes"]
    assert full["ledgers"] == 1 and full["bytes_written"] > result["setup"]["view_bytes"] * 0.9
    assert result["identical"] is True
    assert result["bytes_written_ratio"] == incremental["bytes_written"] / full["bytes_written"]
    assert result["run_s_ratio"] == incremental["run_s"] / full["run_s"]
    assert result["reader_throughput_ratio"] == (
        incremental["reader_messages_per_s"] / full["reader_messages_per_s"])
    assert result["acceptance"]["bytes_written_ratio"] == (result["bytes_written_ratio"] <= 0.05)
    assert result["acceptance"]["run_s_ratio"] == (result["run_s_ratio"] <= 0.10)
    assert result["acceptance"]["reader_throughput_ratio"] == (result["reader_throughput_ratio"] >= 0.9)
    assert not list(tmp_path.iterdir())  # the data dirs are gone
