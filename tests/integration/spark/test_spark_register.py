"""``compactor.spark.register`` works as the docs show it (issue 26, point 3).

A user runs the Spark SQL example with a venv's interpreter but the venv not activated: the
``python3`` on ``PATH`` lacks compactd's dependencies. ``register`` points local-mode
workers at the driver's interpreter, so the read works; a worker interpreter the user chose
that lacks a dependency fails ``register`` with one line naming the module and the fix.
The driver (``register_driver.py``) runs in a subprocess: one SparkContext per process, with
its own environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.integration.spark.support import TOPIC, TopicDir, bare_interpreter

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 240  # a JVM, three sessions and their jobs on a loaded 2-core machine
REPO = Path(__file__).resolve().parents[3]
MESSAGES = 7


def _entry(index: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=1_700_000_000_000,
                                  partition_key=f"k{index}")
    return encode_entry(metadata, b"v%d" % index, with_checksum=True)


def test_register_uses_the_drivers_interpreter_locally_and_names_a_missing_module(tmp_path: Path) -> None:
    lacking = bare_interpreter(tmp_path / "lacking", hidden={"crc32c"})
    probe = subprocess.run([str(lacking), "-c", "import pyarrow, numpy\nimport crc32c"],
                           capture_output=True, timeout=60, check=False)
    assert b"No module named 'crc32c'" in probe.stderr, probe.stderr
    path_dir = tmp_path / "bin"
    path_dir.mkdir()
    (path_dir / "python3").symlink_to(bare_interpreter(tmp_path / "plain", hidden={"pyarrow", "numpy", "crc32c"}))

    topic_dir = TopicDir(tmp_path / "data", entries_per_ledger=4)  # 7 messages: one sealed ledger, 3 open
    try:
        topic_dir.append(_entry(index) for index in range(MESSAGES))
        env = {key: value for key, value in os.environ.items()
               if key not in {"PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"}}
        env.update(PATH=f"{path_dir}:{env.get('PATH', '')}", PYTHONPATH=str(REPO), SPARK_LOCAL_IP="127.0.0.1")
        result = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("register_driver.py")), str(tmp_path / "data"), TOPIC,
             str(lacking)],
            env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    finally:
        topic_dir.close()
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    outcome = json.loads(result.stdout.decode().strip().splitlines()[-1])

    assert outcome["lacking"] is not None
    assert outcome["lacking"]["type"] == "SparkWorkerImportError"
    text = outcome["lacking"]["text"]
    assert "\n" not in text and "'crc32c'" in text and "pip install 'compactd[spark]'" in text
    assert "java" not in text.lower() and "Traceback" not in text
    assert outcome["unregistered"] == "failed"  # the python3 on PATH is what Spark starts unless told
    assert outcome["registered"] == MESSAGES  # the sealed ledger and the open one's confirmed entries
