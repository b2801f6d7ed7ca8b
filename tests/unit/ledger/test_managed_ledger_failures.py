"""A failed append never breaks a topic for good (Pulsar's answer to a BookKeeper write error).

The failed ledger is sealed at its last durable entry and the managed ledger rolls over to
a new one, so that the next append succeeds; appends in flight behind the failure fail, and
none is reported durable unless it is. When the roll-over itself cannot be done (the disk
is still full), the append fails and a later one tries again: the topic recovers by itself.

A full disk is the fault here. The real disk cannot fill up on cue, so ``FullDisk`` stands
in for the ``os`` module as ``ledger.storage.file`` sees it (the narrowest seam: only that
module's writes and syncs fail), and SQLite's own ``PRAGMA max_page_count`` fills the real
metadata database.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import ledger.storage.file as file_module
from ledger.errors import LedgerIOError, MetadataError
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import (
    FaultyLedgerStore,
    FileLedgerStore,
    LedgerStore,
    MemoryLedgerStore,
    SyncPolicy,
    file_io,
)

TOPIC = "persistent://public/default/full-disk"
FUTURE_TIMEOUT_S = 10


class FullDisk:
    """``os`` for the file store; while ``full`` is set, a write stores the first half of
    its bytes and then fails with ENOSPC (as a disk that runs out mid-write does), and a
    sync fails with ENOSPC. ``refuse`` names the calls that fail."""

    def __init__(self) -> None:
        self.full = False
        self.refuse = {"write", "pwrite", "fsync", "fdatasync"}
        self.refused = 0
        self._half_written = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _check(self, call: str) -> None:
        if self.full and call in self.refuse:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        if self.full and "pwrite" in self.refuse and not self._half_written and len(data) > 1:
            self._half_written = True
            return os.pwrite(fd, data[: len(data) // 2], offset)
        self._half_written = False
        self._check("pwrite")
        return os.pwrite(fd, data, offset)

    def write(self, fd: int, data: Any) -> int:
        self._check("write")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._check("fsync")
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._check("fdatasync")
        os.fdatasync(fd)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    full_disk = FullDisk()
    monkeypatch.setattr(file_module, "os", full_disk)
    monkeypatch.setattr(file_io, "os", full_disk)  # the store's plain file operations
    return full_disk


class Topic:
    """A managed ledger on a file store and a real metadata database, and what it acknowledged."""

    def __init__(self, root: Path, sync: SyncPolicy, **config: int) -> None:
        # No back-off after a failed roll-over: each append retries it (the back-off has
        # tests of its own, test_roll_over_backoff)
        self.root, self.sync, self.config = root, sync, ManagedLedgerConfig(**{"roll_over_retry_ms": 0, **config})
        self.metadata = MetadataStore(str(root / "metadata.db"))
        self.store = FileLedgerStore(str(root / "ledgers"), sync=sync)
        self.ml = ManagedLedger.open(TOPIC, self.store, self.metadata, self.config)
        self.acknowledged: list[tuple[Position, bytes]] = []
        self.failed = 0
        self.filler_ledgers = 0

    def append(self, data: bytes) -> bool:
        """Append and wait for the outcome; True when it was acknowledged."""
        future = self.ml.append(data)
        error = future.exception(timeout=FUTURE_TIMEOUT_S)
        if error is not None:
            assert isinstance(error, LedgerIOError), repr(error)
            assert error.retriable
            self.failed += 1
            return False
        self.acknowledged.append((future.result(), data))
        return True

    def fill_metadata(self, full: bool) -> None:
        """Cap the database at its size and fill its pages (with another topic's ledger rows),
        so that a new ledger row needs a page SQLite may not allocate: SQLITE_FULL."""
        if not full:
            self.metadata._query("PRAGMA max_page_count = 1000000")
            return
        pages = int(self.metadata._query("PRAGMA page_count")[0][0])
        self.metadata._query(f"PRAGMA max_page_count = {pages}")
        with contextlib.suppress(MetadataError):
            while True:
                self.filler_ledgers += 1
                self.metadata.add_ledger("filler", 10**12 + self.filler_ledgers, role="data", created_at_ms=1)

    def restart(self) -> None:
        """Stop without closing the managed ledger (as a crash would), then open again."""
        self.store.shutdown()
        self.store = FileLedgerStore(str(self.root / "ledgers"), sync=self.sync)
        self.ml = ManagedLedger.open(TOPIC, self.store, self.metadata, self.config)

    def close(self) -> None:
        self.store.shutdown()
        self.metadata.close()

    def assert_consistent(self) -> None:
        assert_consistent(self.ml, self.store, self.metadata, self.acknowledged)


def assert_consistent(
    ml: ManagedLedger, store: LedgerStore, metadata: MetadataStore, acknowledged: list[tuple[Position, bytes]],
    *, empty_allowed: bool = False,
) -> None:
    """Reads return exactly what was acknowledged, where it was acknowledged; the ledger
    list, the ledger store and the metadata rows agree. ``empty_allowed``: an empty sealed
    ledger may stay listed while the metadata refuses to drop it."""
    read = [(entry.position, entry.data) for entry in ml.read_entries(ml.first_position(), 10_000)]
    assert read == acknowledged
    assert ml.number_of_entries == len(acknowledged)
    assert ml.total_size == sum(len(data) for _, data in acknowledged)
    if acknowledged:
        assert ml.last_confirmed_position() == acknowledged[-1][0]
    listed = ml.ledger_list()
    rows = {row.ledger_id: row for row in metadata.topic_ledgers(TOPIC)}
    assert [record.ledger_id for record in listed] == sorted(rows)
    for record in listed[:-1]:  # every ledger but the current one: sealed, never empty
        info = store.info(record.ledger_id)
        assert (record.entries > 0 or empty_allowed) and info.sealed and record.closed_at_ms
        assert (info.entries, info.size_bytes) == (record.entries, record.size_bytes)
        assert (rows[record.ledger_id].entries, rows[record.ledger_id].size_bytes) == (
            record.entries, record.size_bytes)
    assert set(store.list()) >= set(rows)


@pytest.fixture
def topics(tmp_path: Path) -> Iterator[list[Topic]]:
    opened: list[Topic] = []
    yield opened
    for topic in opened:
        topic.close()


def _open(topics: list[Topic], root: Path, sync: SyncPolicy, **config: int) -> Topic:
    topic = Topic(root, sync, **config)
    topics.append(topic)
    return topic


@pytest.mark.parametrize("sync", [SyncPolicy.GROUP, SyncPolicy.ALWAYS], ids=["group", "always"])
def test_a_failed_write_fails_its_appends_seals_the_ledger_at_its_last_durable_entry_and_the_next_append_rolls_over(
    tmp_path: Path, disk: FullDisk, topics: list[Topic], sync: SyncPolicy
) -> None:
    topic = _open(topics, tmp_path, sync)
    for i in range(3):
        assert topic.append(b"kept %d" % i)
    failed_ledger = topic.ml.current_ledger_id
    disk.full = True
    doomed = [topic.ml.append(b"doomed %d" % i) for i in range(5)]
    for future in doomed:  # in flight behind the failure: every one fails, none is acknowledged
        assert isinstance(future.exception(timeout=FUTURE_TIMEOUT_S), LedgerIOError)
    assert disk.refused > 0
    disk.full = False

    assert topic.append(b"after")
    after = topic.acknowledged[-1][0]
    assert after == Position(after.ledger_id, 0) and after.ledger_id > failed_ledger
    info = topic.store.info(failed_ledger)
    assert info.sealed and info.entries == 3
    assert [(r.ledger_id, r.entries) for r in topic.ml.ledger_list()] == [(failed_ledger, 3), (after.ledger_id, 1)]
    topic.assert_consistent()
    topic.restart()  # what the failed writes left in the file was cut, not sealed in
    assert topic.store.info(failed_ledger).entries == 3
    topic.assert_consistent()


def test_a_ledger_that_fails_before_holding_anything_leaves_the_list(
    tmp_path: Path, disk: FullDisk, topics: list[Topic]
) -> None:
    topic = _open(topics, tmp_path, SyncPolicy.GROUP)
    failed_ledger = topic.ml.current_ledger_id
    disk.full = True
    assert not topic.append(b"doomed")
    disk.full = False
    assert topic.append(b"after")
    assert [r.ledger_id for r in topic.ml.ledger_list()] == [topic.acknowledged[0][0].ledger_id]
    assert failed_ledger not in topic.store.list()
    assert failed_ledger not in [row.ledger_id for row in topic.metadata.topic_ledgers(TOPIC)]
    topic.assert_consistent()


@pytest.mark.parametrize("sync", [SyncPolicy.GROUP, SyncPolicy.ALWAYS], ids=["group", "always"])
def test_while_the_disk_stays_full_every_append_fails_and_the_topic_recovers_by_itself_once_it_frees(
    tmp_path: Path, disk: FullDisk, topics: list[Topic], sync: SyncPolicy
) -> None:
    topic = _open(topics, tmp_path, sync, max_entries_per_ledger=3)
    for i in range(4):
        assert topic.append(b"before %d" % i)
    disk.full = True
    topic.fill_metadata(full=True)  # the metadata database is on the same full disk
    for i in range(6):  # each retries the roll-over past the failed ledger, and fails cleanly
        assert not topic.append(b"while full %d" % i)
    topic.assert_consistent()
    disk.full = False
    topic.fill_metadata(full=False)
    for i in range(7):
        assert topic.append(b"after %d" % i)
    topic.assert_consistent()
    topic.restart()
    topic.assert_consistent()
    assert topic.append(b"after the restart")
    topic.assert_consistent()


FAIL_POINTS = {
    # name: the file-store calls that fail (None: the metadata database is full instead)
    "group-commit-sync": {"fdatasync"},
    "short-write": {"pwrite", "write"},
    "seal-and-create-fsync": {"fsync"},
    "every-write-and-sync": {"write", "pwrite", "fsync", "fdatasync"},
    "metadata-database": None,
}


@pytest.mark.parametrize("sync", [SyncPolicy.GROUP, SyncPolicy.ALWAYS], ids=["group", "always"])
@pytest.mark.parametrize("fail_point", sorted(FAIL_POINTS))
@pytest.mark.parametrize(("first_failing", "failing_appends"), [(5, 1), (2, 6), (9, 4)])
def test_every_fail_point_fails_only_unacknowledged_appends_and_the_topic_recovers(
    tmp_path: Path, disk: FullDisk, topics: list[Topic], sync: SyncPolicy, fail_point: str,
    first_failing: int, failing_appends: int,
) -> None:
    """A table over where the fault hits (data write, group sync, seal, create, metadata),
    when (inside a ledger, at a roll-over) and for how long."""
    topic = _open(topics, tmp_path, sync, max_entries_per_ledger=3)
    refuse = FAIL_POINTS[fail_point]
    if refuse is not None:
        disk.refuse = refuse
    for i in range(16):
        fault = first_failing <= i < first_failing + failing_appends
        disk.full = fault and refuse is not None
        topic.fill_metadata(full=fault and refuse is None)
        topic.append(b"entry %d " % i + b"x" * (i % 5))
        topic.assert_consistent()
    disk.full = False
    topic.fill_metadata(full=False)
    assert topic.append(b"after")  # recovered by itself
    assert topic.failed <= failing_appends
    topic.assert_consistent()
    topic.restart()
    topic.assert_consistent()


class FaultyMetadata:
    """A metadata store whose ledger-row writes fail on cue with the error a full database
    gives (``MetadataError``); SQLite fails an UPDATE of a row in place only by chance."""

    WRITES = ("add_ledger", "close_ledger", "remove_ledgers")

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.failing: dict[str, int | None] = {}  # write -> failing calls left (None: until disarmed)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name not in self.WRITES:
            return method

        def write(*args: Any, **kwargs: Any) -> Any:
            if name in self.failing:
                left = self.failing[name]
                if left is not None:
                    if left <= 1:
                        del self.failing[name]
                    else:
                        self.failing[name] = left - 1
                raise MetadataError(f"injected: database or disk is full at {name}")
            return method(*args, **kwargs)

        return write


class FailuresAgainstTheModel(RuleBasedStateMachine):
    """Random appends with faults armed at random calls of the ledger store (appends, the
    seal and creation of a roll-over, deletes of empty ledgers) and of the metadata's
    ledger rows, for one call or a while, and restarts: after every step, exactly the
    acknowledged entries are readable and the list, store and metadata agree; once the
    faults are gone, the next append succeeds."""

    def __init__(self) -> None:
        super().__init__()
        self.backend = MemoryLedgerStore()
        self.store = FaultyLedgerStore(self.backend)
        self.metadata = MetadataStore(":memory:")
        self.faulty_metadata = FaultyMetadata(self.metadata)
        self.ml = self._open()
        self.acknowledged: list[tuple[Position, bytes]] = []

    def _open(self) -> ManagedLedger:
        return ManagedLedger.open(TOPIC, self.store, self.faulty_metadata,  # type: ignore[arg-type]
                                  ManagedLedgerConfig(max_entries_per_ledger=3, roll_over_retry_ms=0))

    def teardown(self) -> None:
        self.metadata.close()

    @rule(data=st.binary(max_size=12))
    def append(self, data: bytes) -> None:
        future = self.ml.append(data)
        error = future.exception(timeout=FUTURE_TIMEOUT_S)
        if error is None:
            self.acknowledged.append((future.result(), data))
        else:
            assert isinstance(error, LedgerIOError) and error.retriable

    @rule(operation=st.sampled_from(["append", "create", "close", "info", "delete"]),
          after=st.integers(min_value=0, max_value=3), times=st.sampled_from([1, 2, 5, None]))
    def arm_a_fault(self, operation: str, after: int, times: int | None) -> None:
        self.store.fail_on(operation, after=after, times=times)

    @rule(write=st.sampled_from(FaultyMetadata.WRITES), times=st.sampled_from([1, 2, None]))
    def arm_a_metadata_fault(self, write: str, times: int | None) -> None:
        self.faulty_metadata.failing[write] = times

    def disarm(self) -> None:
        self.store.disarm()
        self.faulty_metadata.failing.clear()

    @rule(data=st.binary(max_size=12))
    def recovers_once_the_store_works(self, data: bytes) -> None:
        self.disarm()
        position = self.ml.append(data).result(timeout=FUTURE_TIMEOUT_S)
        self.acknowledged.append((position, data))
        assert_consistent(self.ml, self.backend, self.metadata, self.acknowledged)  # no empty ledger left

    @rule()
    def restart(self) -> None:
        """A crash and a restart: the log is exactly what was acknowledged."""
        self.disarm()
        self.ml = self._open()

    @invariant()
    def only_acknowledged_entries_are_readable(self) -> None:
        assert_consistent(self.ml, self.backend, self.metadata, self.acknowledged, empty_allowed=True)


def test_failures_at_random_calls_never_lose_or_invent_entries() -> None:
    run_state_machine_as_test(
        FailuresAgainstTheModel,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None),
    )
