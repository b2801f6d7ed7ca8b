"""``compactor.spark.register`` ships compactd to Python workers that lack it (issue 13, point 6).

The Spark driver runs in a subprocess (``bare_worker_read.py``: one SparkContext per
process, and the module session of ``test_spark_local`` has its own interpreter) whose
``PYSPARK_PYTHON`` is a *bare* interpreter: the same Python started with ``-S`` (no site
processing, so no ``.pth`` file, hence no editable install of compactd), a ``PYTHONPATH``
of only a directory of links to the site-packages entries *other than* compactd's
packages and install hooks (so PyArrow, NumPy, protobuf... are there, compactd is not,
whether it is installed editable or not), started in an empty directory (``python -m``
puts the working directory on ``sys.path``) and ignoring the ``PYTHONPATH`` Spark hands it.
The test first checks that this interpreter cannot import compactd; the driver then shows
a read failing on the worker without ``register`` and succeeding with it, batch and
streaming. The rows also
carry keys that are not UTF-8: ``key_bytes`` must give their bytes exactly.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from google.protobuf.internal import api_implementation

from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.integration.spark.support import TOPIC, TopicDir, bare_interpreter

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUN_TIMEOUT_S = 240  # a JVM and two jobs on a loaded 2-core machine
REPO = Path(__file__).resolve().parents[3]


def _entry(key: str | None, value: bytes, *, b64: bool = False) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1_700_000_000_000)
    if key is not None:
        metadata.partition_key = key
        metadata.partition_key_b64_encoded = b64
    return encode_entry(metadata, value, with_checksum=True)


def _raw_key_entry(raw_key: bytes, value: bytes) -> bytes:
    """An entry whose ``partition_key`` holds bytes that are not UTF-8 (a lax producer's)."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1_700_000_000_000,
                                  partition_key="\u00e9")
    serialized = metadata.SerializeToString().replace("\u00e9".encode(), raw_key)
    return struct.pack(">I", len(serialized)) + serialized + value


def test_register_ships_compactd_to_workers_that_cannot_import_it_and_keys_keep_their_bytes(
    tmp_path: Path,
) -> None:
    bare = bare_interpreter(tmp_path)
    probe = subprocess.run([str(bare), "-c", "import pyarrow, pyspark, numpy, google.protobuf\nimport compactor"],
                           capture_output=True, timeout=60, check=False)
    assert b"No module named 'compactor'" in probe.stderr, probe.stderr

    binary = b"\x00\xff\xfe bin"
    entries = [_entry("clé", b"v1"), _entry(base64.b64encode(binary).decode(), b"v2", b64=True),
               _entry(None, b"v3")]
    expected = [("clé", "clé".encode().hex(), b"v1".hex()), (base64.b64encode(binary).decode(), binary.hex(),
                b"v2".hex()), (None, None, b"v3".hex())]
    if api_implementation.Type() != "python":  # the pure-Python runtime refuses such keys
        entries.append(_raw_key_entry(b"\xff\xfe", b"v4"))
        expected.append(("\ufffd\ufffd", b"\xff\xfe".hex(), b"v4".hex()))
    topic_dir = TopicDir(tmp_path / "data", entries_per_ledger=3)  # closing it seals its last ledger
    try:
        topic_dir.append(entries)
    finally:
        topic_dir.close()

    env = {**os.environ, "PYSPARK_PYTHON": str(bare), "PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("bare_worker_read.py")), str(tmp_path / "data"), TOPIC],
        env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    outcome = json.loads(result.stdout.decode().strip().splitlines()[-1])

    assert outcome["unshipped_error"] is not None
    assert "No module named 'compactor'" in outcome["unshipped_error"]
    assert [tuple(row) for row in outcome["rows"]] == expected
    assert outcome["streamed"] == len(expected)  # the stream reader's workers import the shipped code too
