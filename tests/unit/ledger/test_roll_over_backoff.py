"""A failed roll-over backs off (issue 25): for ``roll_over_retry_ms`` after a roll-over
failed on a full disk, appends that need one fail at once and touch no file, producers
are told so (``ready_for_appends``), the failures are logged at most once per
``ROLL_OVER_WARNING_INTERVAL_MS``, and the first try after the back-off, once space
frees, takes appends again — no restart.

The full disk is ``FullDisk`` (ENOSPC injected at the ledger files' OS calls: the real
disk cannot fill up on cue here; tests/integration/wire/test_full_disk_fs.py fills a real
one); the clock is injected, so the back-off is stepped through, never slept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledger.storage.file as file_module
from ledger.errors import LedgerIOError
from ledger.managed_ledger import ROLL_OVER_WARNING_INTERVAL_MS, ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.storage import FileLedgerStore, SyncPolicy, file_io
from tests.unit.ledger.test_managed_ledger_failures import FullDisk

TOPIC = "persistent://public/default/backoff"
BOUND_S = 10.0
RETRY_MS = 10_000


class Clock:
    """Seconds since the epoch, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    disk = FullDisk()
    monkeypatch.setattr(file_module, "os", disk)
    monkeypatch.setattr(file_io, "os", disk)
    return disk


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[tuple[ManagedLedger, Clock]]:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    clock = Clock()
    managed = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(roll_over_retry_ms=RETRY_MS),
                                 clock=clock, roll_over_in_background=True)
    yield managed, clock
    managed.close()
    store.shutdown()
    metadata.close()


def _fails(managed: ManagedLedger, data: bytes) -> LedgerIOError:
    error = managed.append(data).exception(BOUND_S)
    assert isinstance(error, LedgerIOError), error
    return error


def _warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum("roll-over failed" in record.getMessage() for record in caplog.records
               if record.levelno == logging.WARNING)


def _fill(managed: ManagedLedger, disk: FullDisk) -> None:
    """A write fails (the ledger is fenced), then the roll past it fails: the back-off starts."""
    managed.append(b"m0").result(BOUND_S)
    disk.full = True
    _fails(managed, b"m1")  # its write fails
    _fails(managed, b"m2")  # the roll past the failed ledger fails: its seal cannot be written


def test_a_failed_roll_over_fails_appends_at_once_without_io_until_its_back_off_ends(
        opened: tuple[ManagedLedger, Clock], full_disk: FullDisk, caplog: pytest.LogCaptureFixture) -> None:
    managed, clock = opened
    caplog.set_level(logging.WARNING, logger="ledger.managed_ledger")
    _fill(managed, full_disk)
    assert _warnings(caplog) == 1
    refused = full_disk.refused
    for i in range(50):  # the back-off: failed at once, no roll-over thread, no file call, no log line
        future = managed.append(b"x%d" % i)
        assert future.done() and isinstance(future.exception(), LedgerIOError), future
        ready = managed.ready_for_appends()
        assert ready.done() and isinstance(ready.exception(), LedgerIOError), "a producer would be taken"
    assert "next try is in" in str(future.exception())
    assert full_disk.refused == refused, "an append touched the full disk during the back-off"
    assert _warnings(caplog) == 1

    clock.advance_ms(RETRY_MS)  # the back-off ends; the disk is still full: one more try, which fails
    _fails(managed, b"m3")
    assert full_disk.refused > refused, "no roll-over was tried after the back-off"
    assert _warnings(caplog) == 2  # one line per interval

    clock.advance_ms(RETRY_MS)
    full_disk.full = False  # space frees: the next try (here a producer's) takes appends again
    assert managed.ready_for_appends().result(BOUND_S) is None
    position = managed.append(b"after").result(BOUND_S)
    assert [entry.data for entry in managed.read_entries(managed.first_position(), 10)] == [b"m0", b"after"]
    assert managed.last_confirmed_position() == position


def test_tries_more_often_than_the_warning_interval_log_one_line_per_interval(
        tmp_path: Path, full_disk: FullDisk, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ledger.managed_ledger")
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    clock = Clock()
    retry_ms = ROLL_OVER_WARNING_INTERVAL_MS // 10
    managed = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(roll_over_retry_ms=retry_ms),
                                 clock=clock, roll_over_in_background=True)
    try:
        _fill(managed, full_disk)
        tries = 30
        for _ in range(tries):  # three intervals of tries, each one failing
            clock.advance_ms(retry_ms)
            refused = full_disk.refused
            _fails(managed, b"x")
            assert full_disk.refused > refused, "the try after the back-off did not happen"
        assert _warnings(caplog) == 1 + tries * retry_ms // ROLL_OVER_WARNING_INTERVAL_MS
        assert "9 failed tries not logged" in caplog.records[-1].getMessage()
    finally:
        full_disk.full = False
        managed.close()
        store.shutdown()
        metadata.close()
