"""A real full disk under ``compactd serve`` (issue 25): the data dir on a tmpfs of a few
MiB, filled by a file of the test's, and the real client.

A synchronous send fails within its send timeout (before issue 25 it neither failed nor
returned for minutes: each reconnect restarted the client's send timer), the broker logs
its failed roll-over tries at most once per 10 s, and once space frees the same producer
sends again, the broker never restarted; the failed sends were never stored.

Mounting needs root (CI runs as root); elsewhere the test skips, saying why. The unit test
of the back-off (tests/unit/ledger/test_roll_over_backoff.py) injects ENOSPC instead.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.wire.helpers import unique_topic
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

DISK_BYTES = 8 * 1024 * 1024
SEND_TIMEOUT_MS = 3000
MESSAGE = b"x" * (256 * 1024)  # more than a page: a write to a full tmpfs fails
RECOVERY_BOUND_S = 30.0
WARNING_INTERVAL_S = 10.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of ``DISK_BYTES`` mounted on a directory under ``tmp_path``."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0700", "tmpfs",
                                  str(mount_point)], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.skip(f"cannot mount a small tmpfs here: {error}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False, capture_output=True, timeout=30)


def _fill(path: Path) -> None:
    """Write ``path`` until the file system is full."""
    with path.open("wb") as filler, contextlib.suppress(OSError):
        while True:
            filler.write(bytes(64 * 1024))
            filler.flush()
    assert os.statvfs(path.parent).f_bavail == 0, "the disk did not fill"


@pytest.mark.slow
def test_a_full_disk_fails_a_send_within_its_timeout_and_the_same_producer_sends_once_space_frees(
        small_disk: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    server = ServeProcess(small_disk / "data", log_path, "--managed-ledger-roll-over-retry-ms", "500")
    client = pulsar.Client(server.broker_url, operation_timeout_seconds=30)
    topic = unique_topic("real-full-disk")
    try:
        producer = client.create_producer(topic, send_timeout_millis=SEND_TIMEOUT_MS, batching_enabled=False)
        producer.send(b"m0")
        _fill(small_disk / "filler")
        filled_at = time.monotonic()
        for attempt in range(3):  # the first send meets the full disk, the next ones a refused producer
            started = time.monotonic()
            with pytest.raises(pulsar.Timeout):
                producer.send(MESSAGE + b"%d" % attempt)
            assert time.monotonic() - started < SEND_TIMEOUT_MS / 1000 + 2.0, "a send outlived its timeout"
        full_for_s = time.monotonic() - filled_at
        log = log_path.read_text()
        tries_logged = log.count("roll-over failed")
        assert 1 <= tries_logged <= 1 + full_for_s / WARNING_INTERVAL_S, log[-4000:]

        (small_disk / "filler").unlink()
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while True:  # the same producer: its waiting reconnect is taken on the next try
            try:
                producer.send(b"after")
                break
            except pulsar.Timeout:
                assert time.monotonic() < deadline, "the topic did not take sends once space freed"
        assert server.running, "the broker stopped"
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        stored = []
        while True:
            try:
                stored.append(reader.read_next(timeout_millis=2000).data())
            except pulsar.Timeout:
                break
        assert stored == [b"m0", b"after"], "a failed send was stored, or an acknowledged one lost"
    finally:
        client.close()
        server.terminate()
