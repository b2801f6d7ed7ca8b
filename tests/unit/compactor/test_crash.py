"""Crash safety of the compaction run (STYLE P13; reference pulsar-compaction.md §1.3-§1.5).

Every test runs a real data dir in ``tmp_path`` (file ledger store with group commit,
SQLite metadata) whose ledger store is wrapped in ``FaultyLedgerStore``:

1. a keyed workload (single messages, batches, tombstones, key-less messages) over several
   ledgers;
2. one successful compaction publishes the **old view** (horizon ``stop_old``);
3. more updates and tombstones follow; compacting them would publish the **new view**
   (horizon ``stop_new``);
4. the second compaction crashes (``SimulatedCrash``, a ``BaseException`` that no
   ``except Exception`` swallows, so the run stops there as under ``kill -9``) at one point
   of the matrix below, or fails with an ordinary error;
5. "kill -9": the managed ledger is abandoned without being closed, the stores are shut down
   and the lock released; the data dir is reopened, ``collect_orphans`` runs, the topic is
   restored;
6. readers get exactly the old view or exactly the new one, never a mix: the expectation is
   ``compactor.local.algorithm.compact`` over the raw entries up to that horizon, followed by the
   raw tail. The ``CompactedTopicLedger`` property always names a sealed ledger that exists,
   the orphan collector removes exactly the unreferenced ledger, and a further run converges
   on the compaction of everything with no ledger left over.

The crash matrix (reference §1.5): during phase one (first, middle, last read), between the
phases, during phase two (first and last read, first, middle and last append), while
sealing, after sealing but before the transaction, inside the transaction before it
commits, and after the transaction but before the old ledger is deleted. Besides crashes:
an ordinary failure (an ``Exception``) before the transaction deletes the new ledger and
leaves the old view serving; a failure to delete the old ledger after it leaves an orphan
for the next start; a phase-one read slower than ``phase_one_read_timeout_s`` fails the run
with ``CompactionTimeoutError``. A stuck read of either the
previous compacted ledger or the raw topic times out without waiting for the read.

Shutting the store down in step 5 makes the appends the group-commit flusher still held
durable: a crash after the OS took the writes. Losing them instead would only shorten the
unreferenced ledger that start-up deletes.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compactor.errors import CompactionTimeoutError
from compactor.local.algorithm import CompactedEntry, compact
from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.view.reader import CompactedReader
from compactor.view.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION, CompactedTopic
from cursor import ManagedCursor
from cursor.store import CursorRecord, CursorStore
from ledger import (
    EARLIEST,
    DataDir,
    FaultyLedgerStore,
    LedgerIOError,
    LedgerStore,
    ManagedLedger,
    ManagedLedgerConfig,
    MetadataError,
    Position,
    SimulatedCrash,
)
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/crash"
KEYS = tuple(f"key-{index}" for index in range(12))  # few keys: they collide often
# Small ledgers and small reads: the workload spans seven ledgers or more, and each phase makes
# enough store reads for "first", "middle" and "last" to be different reads.
ENTRIES_PER_LEDGER = 8
CONFIG = CompactionConfig(incremental=False, read_batch_entries=4)
READER_BATCH_ENTRIES = 7
READER_ROUNDS_MAX = 1_000  # a reader that has not reached the end by then loops
OLD_ENTRIES, NEW_ENTRIES, TAIL_ENTRIES = 32, 24, 10
TRANSACTION_FAULT_POINT = "cursor.save.between_position_and_properties"
BEFORE_TRANSACTION_FAULT_POINT = "cursor.save.before"


# -- the workload --------------------------------------------------------------------------


def _metadata(sequence_id: int, key: str | None = None) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(
        producer_name="producer", sequence_id=sequence_id, publish_time=1_000
    )
    if key is not None:
        metadata.partition_key = key
    return metadata


def _batch(rng: random.Random, value: bytes, sequence_id: int) -> bytes:
    slots = []
    for index in range(rng.randint(1, 4)):
        single = pb.SingleMessageMetadata()
        roll = rng.random()
        if roll < 0.85:
            single.partition_key = rng.choice(KEYS)
        slots.append((single, b"" if roll < 0.2 else value + b"/%d" % index))  # b"": tombstone
    codec = rng.choice([pb.NONE, pb.ZLIB])
    return encode_batch(_metadata(sequence_id), slots, codec, with_checksum=False)


def _workload(seed: int, count: int) -> list[bytes]:
    """``count`` entries: ~30% batches, 15% tombstones, 5% key-less, the rest updates."""
    rng = random.Random(seed)
    entries = []
    for sequence_id in range(count):
        value = b"value-%d-%d" % (seed, sequence_id)
        roll = rng.random()
        if roll < 0.3:
            entries.append(_batch(rng, value, sequence_id))
            continue
        if roll < 0.45:
            metadata, value = _metadata(sequence_id, rng.choice(KEYS)), b""  # a tombstone
        elif roll < 0.5:
            metadata = _metadata(sequence_id)  # no key
        else:
            metadata = _metadata(sequence_id, rng.choice(KEYS))
        entries.append(encode_entry(metadata, value, with_checksum=False))
    return entries


def _append(ledger: ManagedLedger, entries: Sequence[bytes]) -> None:
    futures = [ledger.append(data) for data in entries]
    for future in futures:
        future.result(timeout=10)


# -- one "process" over the data dir -------------------------------------------------------


@dataclass
class Broker:
    """What one process opened on the data dir, and what start-up collected."""

    data_dir: DataDir
    store: FaultyLedgerStore
    ledger: ManagedLedger
    topic: CompactedTopic
    orphans: list[int]


_OPENED: list[DataDir] = []


@pytest.fixture(autouse=True)
def _close_data_dirs() -> Iterator[None]:
    """Release what a failing test left open (closing twice is harmless)."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def _start(path: Path, wrap: Callable[[LedgerStore], LedgerStore] | None = None) -> Broker:
    """Start as compactd does: lock, collect orphans, open the topic, restore its view."""
    data_dir = DataDir.open(str(path))
    _OPENED.append(data_dir)
    _assert_published_ledger_is_sealed(data_dir)
    orphans = collect_orphans(data_dir)
    _assert_published_ledger_is_sealed(data_dir)
    store = FaultyLedgerStore(data_dir.ledgers)
    outer: LedgerStore = store if wrap is None else wrap(store)
    config = ManagedLedgerConfig(max_entries_per_ledger=ENTRIES_PER_LEDGER)
    ledger = ManagedLedger.open(TOPIC, outer, data_dir.metadata, config)
    return Broker(data_dir, store, ledger, CompactedTopic.restore(ledger, CursorStore(data_dir.database)), orphans)


def _kill(broker: Broker) -> None:
    """``kill -9``: nothing is closed or sealed; the stores stop and the lock goes."""
    broker.store.disarm()
    broker.data_dir.close()


def _compaction_cursor(data_dir: DataDir) -> CursorRecord:
    record = CursorStore(data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION)
    assert record is not None
    return record


def _assert_published_ledger_is_sealed(data_dir: DataDir) -> None:
    """The persisted ``CompactedTopicLedger``, if any, names a sealed ledger that exists."""
    record = CursorStore(data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION)
    if record is None or COMPACTED_TOPIC_LEDGER not in record.properties:
        return
    ledger_id = record.properties[COMPACTED_TOPIC_LEDGER]
    assert ledger_id in data_dir.ledgers.list()
    assert data_dir.ledgers.info(ledger_id).sealed


# -- what readers must see -----------------------------------------------------------------


def _expected(ledger: ManagedLedger, horizon: Position | None) -> list[CompactedEntry]:
    """The reference: everything up to ``horizon`` compacted, then the raw tail."""
    raw = ledger.read_entries(ledger.first_position(), 100_000)
    covered = [entry for entry in raw if horizon is not None and entry.position <= horizon]
    tail = [CompactedEntry(entry.position, entry.data) for entry in raw[len(covered):]]
    return compact(covered) + tail


def _read_compacted(topic: CompactedTopic) -> list[CompactedEntry]:
    """Everything a read-compacted reader starting from the earliest message gets."""
    cursor = ManagedCursor.open_non_durable(topic.ledger, "reader", EARLIEST)
    reader = CompactedReader(topic, cursor, from_earliest=True)
    seen: list[CompactedEntry] = []
    for _ in range(READER_ROUNDS_MAX):
        batch = reader.read(READER_BATCH_ENTRIES)
        if not batch:
            return seen
        seen.extend(batch)
    raise AssertionError("the reader never reached the end of the topic")


def _assert_serves(topic: CompactedTopic, horizon: Position) -> None:
    """``topic`` serves the complete view compacted up to ``horizon``, nothing else."""
    view = topic.view
    assert view is not None
    assert view.horizon == horizon
    expected = _expected(topic.ledger, horizon)
    assert list(view.iter_all()) == [entry for entry in expected if entry.position <= horizon]
    assert _read_compacted(topic) == expected


def _assert_no_stray_ledgers(broker: Broker) -> None:
    """Only the topic's data ledgers and the published compacted ledger exist."""
    view = broker.topic.view
    assert view is not None
    data_ledgers = {record.ledger_id for record in broker.ledger.ledger_list()}
    assert set(broker.data_dir.ledgers.list()) == data_ledgers | {view.ledger_id}
    record = _compaction_cursor(broker.data_dir)
    assert record.properties[COMPACTED_TOPIC_LEDGER] == view.ledger_id
    assert broker.data_dir.ledgers.info(view.ledger_id).sealed


def _assert_converges(broker: Broker, path: Path) -> None:
    """The next run, with more appended, publishes the compaction of everything, leaving
    no ledger behind; a run with nothing new changes nothing; a restart collects nothing."""
    _append(broker.ledger, _workload(3, TAIL_ENTRIES))
    stop = broker.ledger.last_confirmed_position()
    Compactor(CONFIG).compact(broker.topic)
    _assert_serves(broker.topic, stop)
    _assert_no_stray_ledgers(broker)
    assert Compactor(CONFIG).compact(broker.topic).ledger_id == -1
    _kill(broker)
    restarted = _start(path)
    assert restarted.orphans == []
    _assert_serves(restarted.topic, stop)
    _assert_no_stray_ledgers(restarted)
    restarted.data_dir.close()


# -- the scenario --------------------------------------------------------------------------


@dataclass
class Scenario:
    """A topic with a published old view and more raw data after its horizon."""

    broker: Broker
    stop_old: Position
    stop_new: Position
    old_ledger_id: int
    phase_one_reads: int = 0
    survivors: int = 0


def _scenario(path: Path, wrap: Callable[[LedgerStore], LedgerStore] | None = None) -> Scenario:
    broker = _start(path, wrap)
    _append(broker.ledger, _workload(1, OLD_ENTRIES))
    stop_old = broker.ledger.last_confirmed_position()
    figures = Compactor(CONFIG).compact(broker.topic)
    _append(broker.ledger, _workload(2, NEW_ENTRIES))
    stop_new = broker.ledger.last_confirmed_position()
    assert len(broker.ledger.ledger_list()) >= 7
    return Scenario(broker, stop_old, stop_new, figures.ledger_id)


def _measure(scenario: Scenario) -> Scenario:
    """Fill in how many reads phase one makes and how many entries phase two writes.

    Phase one is measured by failing the run where phase two begins (creating the new
    ledger): an ordinary failure there must change nothing, which is checked too.
    """
    broker = scenario.broker
    ledgers_before = broker.data_dir.ledgers.list()
    reads_before = broker.store.calls.get("read", 0)
    broker.store.fail_on("create")
    with pytest.raises(LedgerIOError):
        Compactor(CONFIG).compact(broker.topic)
    scenario.phase_one_reads = broker.store.calls["read"] - reads_before
    assert scenario.phase_one_reads >= 5  # the old compacted ledger, then raw reads
    assert broker.data_dir.ledgers.list() == ledgers_before
    scenario.survivors = len(compact([
        entry for entry in broker.ledger.read_entries(broker.ledger.first_position(), 100_000)
        if entry.position <= scenario.stop_new
    ]))
    assert scenario.survivors >= 3
    return scenario


# -- crash points --------------------------------------------------------------------------


def _crash_on(operation: str, after: Callable[[Scenario], int]) -> Callable[[Scenario], None]:
    def arm(scenario: Scenario) -> None:
        scenario.broker.store.crash_on(operation, after=after(scenario))

    return arm


def _new_ledger(scenario: Scenario, ledgers_before: set[int]) -> int:
    (ledger_id,) = set(scenario.broker.data_dir.ledgers.list()) - ledgers_before
    return ledger_id


def _crash_after_seal(scenario: Scenario) -> None:
    """Crash as the run asks the metadata store to publish, before the transaction begins."""
    ledgers_before = set(scenario.broker.data_dir.ledgers.list())

    def crash(**_: object) -> None:
        assert scenario.broker.data_dir.ledgers.info(_new_ledger(scenario, ledgers_before)).sealed
        raise SimulatedCrash("crash after the seal, before the transaction")

    scenario.broker.data_dir.database.fault_points[BEFORE_TRANSACTION_FAULT_POINT] = crash  # this process dies


def _crash_in_transaction(scenario: Scenario) -> None:
    """Crash inside the publishing transaction, before it commits (it rolls back)."""
    ledgers_before = set(scenario.broker.data_dir.ledgers.list())

    def crash(**_: object) -> None:
        assert scenario.broker.data_dir.ledgers.info(_new_ledger(scenario, ledgers_before)).sealed
        raise SimulatedCrash("crash inside the transaction")

    scenario.broker.data_dir.database.fault_points[TRANSACTION_FAULT_POINT] = crash


@dataclass(frozen=True)
class CrashPoint:
    """Where the run dies, and what the restarted process must find.

    Attributes:
        name: the test id.
        arm: arms the crash on a measured scenario.
        new_ledger: "none" (no ledger created yet), "open" (partially written) or "sealed".
        published: the transaction committed: the new view serves, the old ledger is garbage.
    """

    name: str
    arm: Callable[[Scenario], None]
    new_ledger: str
    published: bool = False


# How many calls of an operation succeed before the faulty one. Phase two reads the same
# stream as phase one, so its reads are numbered phase_one_reads .. 2 * phase_one_reads - 1.
def _first(scenario: Scenario) -> int:
    return 0


def _middle_read(scenario: Scenario) -> int:
    return scenario.phase_one_reads // 2


def _last_read(scenario: Scenario) -> int:
    return scenario.phase_one_reads - 1


def _middle_append(scenario: Scenario) -> int:
    return scenario.survivors // 2


def _last_append(scenario: Scenario) -> int:
    return scenario.survivors - 1


def _in_phase_two(read: Callable[[Scenario], int]) -> Callable[[Scenario], int]:
    return lambda scenario: scenario.phase_one_reads + read(scenario)


CRASH_POINTS = [
    CrashPoint("phase-one-first-read", _crash_on("read", _first), "none"),
    CrashPoint("phase-one-middle-read", _crash_on("read", _middle_read), "none"),
    CrashPoint("phase-one-last-read", _crash_on("read", _last_read), "none"),
    CrashPoint("between-phases", _crash_on("create", _first), "none"),
    CrashPoint("phase-two-first-read", _crash_on("read", _in_phase_two(_first)), "open"),
    CrashPoint("phase-two-last-read", _crash_on("read", _in_phase_two(_last_read)), "open"),
    CrashPoint("phase-two-first-append", _crash_on("append", _first), "open"),
    CrashPoint("phase-two-middle-append", _crash_on("append", _middle_append), "open"),
    CrashPoint("phase-two-last-append", _crash_on("append", _last_append), "open"),
    CrashPoint("sealing", _crash_on("close", _first), "open"),
    CrashPoint("after-seal-before-transaction", _crash_after_seal, "sealed"),
    CrashPoint("inside-transaction", _crash_in_transaction, "sealed"),
    CrashPoint(
        "after-transaction-before-old-ledger-deleted", _crash_on("delete", _first), "sealed",
        published=True,
    ),
]


@pytest.mark.parametrize("point", CRASH_POINTS, ids=lambda point: point.name)
def test_a_crash_then_restart_serves_a_whole_view_and_the_next_run_converges(
    tmp_path: Path, point: CrashPoint
) -> None:
    scenario = _measure(_scenario(tmp_path))
    ledgers_before = set(scenario.broker.data_dir.ledgers.list())
    point.arm(scenario)
    with pytest.raises(SimulatedCrash):
        Compactor(CONFIG).compact(scenario.broker.topic)

    created = sorted(set(scenario.broker.data_dir.ledgers.list()) - ledgers_before)
    assert len(created) == (0 if point.new_ledger == "none" else 1)
    if created:
        sealed = scenario.broker.data_dir.ledgers.info(created[0]).sealed
        assert sealed is (point.new_ledger == "sealed")
    _kill(scenario.broker)

    broker = _start(tmp_path)
    view = broker.topic.view
    assert view is not None
    if point.published:
        assert broker.orphans == [scenario.old_ledger_id]
        assert view.ledger_id == created[0]
        _assert_serves(broker.topic, scenario.stop_new)
    else:
        assert broker.orphans == created
        assert view.ledger_id == scenario.old_ledger_id
        assert _compaction_cursor(broker.data_dir).mark_delete_position == scenario.stop_old
        _assert_serves(broker.topic, scenario.stop_old)
    _assert_no_stray_ledgers(broker)
    _assert_converges(broker, tmp_path)


@pytest.mark.parametrize(("operation", "after"), [("read", 2), ("append", 2), ("close", 0)])
def test_a_crash_in_the_first_run_leaves_the_raw_topic_serving(
    tmp_path: Path, operation: str, after: int
) -> None:
    broker = _start(tmp_path)
    _append(broker.ledger, _workload(1, OLD_ENTRIES))
    ledgers_before = set(broker.data_dir.ledgers.list())
    broker.store.crash_on(operation, after=after)
    with pytest.raises(SimulatedCrash):
        Compactor(CONFIG).compact(broker.topic)
    created = sorted(set(broker.data_dir.ledgers.list()) - ledgers_before)
    _kill(broker)

    broker = _start(tmp_path)
    assert broker.orphans == created
    assert broker.topic.view is None
    assert COMPACTED_TOPIC_LEDGER not in _compaction_cursor(broker.data_dir).properties
    assert _read_compacted(broker.topic) == _expected(broker.ledger, None)
    _assert_converges(broker, tmp_path)


# -- ordinary failures -----------------------------------------------------------------------


def _fail_on(operation: str, after: Callable[[Scenario], int]) -> Callable[[Scenario], None]:
    def arm(scenario: Scenario) -> None:
        scenario.broker.store.fail_on(operation, after=after(scenario))

    return arm


def _fail_in_transaction(scenario: Scenario) -> None:
    def fail(**_: object) -> None:
        raise MetadataError("injected failure inside the transaction")

    scenario.broker.data_dir.database.fault_points[TRANSACTION_FAULT_POINT] = fail


FAILURES: list[tuple[str, Callable[[Scenario], None], type[Exception]]] = [
    ("phase-one-read", _fail_on("read", _middle_read), LedgerIOError),
    ("create", _fail_on("create", _first), LedgerIOError),
    ("phase-two-read", _fail_on("read", _in_phase_two(_middle_read)), LedgerIOError),
    ("phase-two-append", _fail_on("append", _middle_append), LedgerIOError),
    ("seal", _fail_on("close", _first), LedgerIOError),
    ("transaction", _fail_in_transaction, MetadataError),
]


@pytest.mark.parametrize(("arm", "error"), [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES])
def test_a_failure_before_the_transaction_deletes_the_new_ledger_and_keeps_the_old_view(
    tmp_path: Path, arm: Callable[[Scenario], None], error: type[Exception]
) -> None:
    scenario = _measure(_scenario(tmp_path))
    broker = scenario.broker
    failures_before = broker.topic.record.failures
    ledgers_before = broker.data_dir.ledgers.list()
    arm(scenario)
    with pytest.raises(error):
        Compactor(CONFIG).compact(broker.topic)

    assert broker.topic.record.failures == failures_before + 1
    assert broker.topic.record.last_error.startswith(error.__name__)
    assert broker.data_dir.ledgers.list() == ledgers_before  # the new ledger is gone
    record = _compaction_cursor(broker.data_dir)
    assert record.mark_delete_position == scenario.stop_old
    assert record.properties[COMPACTED_TOPIC_LEDGER] == scenario.old_ledger_id
    _assert_serves(broker.topic, scenario.stop_old)

    broker.store.disarm()
    broker.data_dir.database.fault_points.clear()
    Compactor(CONFIG).compact(broker.topic)  # the retry, without a restart
    _assert_serves(broker.topic, scenario.stop_new)
    _assert_no_stray_ledgers(broker)
    _assert_converges(broker, tmp_path)


def test_a_failure_to_delete_the_old_ledger_leaves_an_orphan_for_the_next_start(
    tmp_path: Path,
) -> None:
    scenario = _scenario(tmp_path)
    broker = scenario.broker
    broker.store.fail_on("delete")
    figures = Compactor(CONFIG).compact(broker.topic)  # published: the run succeeds

    assert broker.topic.record.failures == 0
    view = broker.topic.view
    assert view is not None and view.ledger_id == figures.ledger_id != scenario.old_ledger_id
    assert scenario.old_ledger_id in broker.data_dir.ledgers.list()
    _assert_serves(broker.topic, scenario.stop_new)
    _kill(broker)

    broker = _start(tmp_path)
    assert broker.orphans == [scenario.old_ledger_id]
    _assert_serves(broker.topic, scenario.stop_new)
    _assert_no_stray_ledgers(broker)
    _assert_converges(broker, tmp_path)


# -- the phase-one read timeout --------------------------------------------------------------


class SlowReads:
    """Composes around a store: ``read`` of ``ledger_ids`` first waits ``delay_s``, or until
    ``release`` is set."""

    def __init__(self, inner: LedgerStore) -> None:
        self.inner = inner
        self.ledger_ids: set[int] = set()
        self.delay_s = 0.0
        self.release = threading.Event()

    def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> Sequence[bytes]:
        if ledger_id in self.ledger_ids:
            self.release.wait(self.delay_s)
        return self.inner.read(ledger_id, first_entry_id, last_entry_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


SLOW_READ_S = 0.2  # bounded: the timed-out read still finishes before the run returns
STUCK_READ_S = 0.6  # "never" returns, as far as a run bounded by READ_TIMEOUT_S is concerned
READ_TIMEOUT_S = 0.05


def _assert_times_out_then_recovers(scenario: Scenario, slow_ledger_ids: set[int]) -> None:
    broker = scenario.broker
    slow = broker.ledger.store
    assert isinstance(slow, SlowReads)
    ledgers_before = broker.data_dir.ledgers.list()
    slow.ledger_ids, slow.delay_s = slow_ledger_ids, SLOW_READ_S
    config = CompactionConfig(incremental=False, read_batch_entries=4, phase_one_read_timeout_s=READ_TIMEOUT_S)
    compactor = Compactor(config)
    with pytest.raises(CompactionTimeoutError):
        compactor.compact(broker.topic)

    slow.delay_s = 0.0
    assert broker.topic.record.failures == 1
    assert broker.topic.record.last_error.startswith("CompactionTimeoutError")
    assert broker.data_dir.ledgers.list() == ledgers_before
    assert _compaction_cursor(broker.data_dir).mark_delete_position == scenario.stop_old
    assert broker.topic.view is not None and broker.topic.view.ledger_id == scenario.old_ledger_id
    _assert_serves(broker.topic, scenario.stop_old)
    compactor.compact(broker.topic)
    _assert_serves(broker.topic, scenario.stop_new)
    _assert_no_stray_ledgers(broker)


def test_a_slow_raw_read_in_phase_one_times_out_and_the_old_view_keeps_serving(
    tmp_path: Path,
) -> None:
    scenario = _scenario(tmp_path, SlowReads)
    data_ledgers = {record.ledger_id for record in scenario.broker.ledger.ledger_list()}
    _assert_times_out_then_recovers(scenario, data_ledgers)


def test_a_slow_read_of_the_previous_compacted_ledger_times_out_too(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, SlowReads)
    _assert_times_out_then_recovers(scenario, {scenario.old_ledger_id})


def test_the_read_timeout_bounds_the_run_when_a_read_is_stuck(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, SlowReads)
    broker = scenario.broker
    slow = broker.ledger.store
    assert isinstance(slow, SlowReads)
    slow.ledger_ids = {record.ledger_id for record in broker.ledger.ledger_list()}
    slow.delay_s = STUCK_READ_S
    config = CompactionConfig(incremental=False, read_batch_entries=4, phase_one_read_timeout_s=READ_TIMEOUT_S)
    started = time.monotonic()
    try:
        with pytest.raises(CompactionTimeoutError):
            Compactor(config).compact(broker.topic)
        elapsed_s = time.monotonic() - started
    finally:
        slow.release.set()
    assert elapsed_s < STUCK_READ_S / 2
