"""Incremental runs (issue 30): views with dead marks, every reader skipping them, merges,
and the crash rules at every publish and merge point.

Every test runs a real data dir (file ledgers, SQLite). The reference is always a full
rewrite: ``compactor.local.algorithm.compact`` over every raw entry up to the view's horizon,
with the same tombstone cut-off. A view is compared *logically*: per delivered entry its
original position, its surviving slots and its bytes with every other slot emptied
(``CompactedEntry.emptied``: what a full rewrite stores), which is what a read-compacted
reader delivers (the client drops the slots the ack_set hides).

The stores: ``files`` (the data dir's ``FileLedgerStore``: runs over key indexes),
``parsed`` (the same wrapped in ``FaultyLedgerStore``, which shows no files: runs parse,
and dead marks come from indexes built in memory) and ``rounds`` (files, with a key map
of four keys: a run in several rounds, each an incremental publish).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor.engine import KEY_MAP_BYTES_PER_KEY
from compactor.local.algorithm import CompactedEntry, compact
from compactor.runs.merges import TIER_BASE_BYTES, LedgerShape, ledgers_max, plan_merges, tier
from compactor.runs.runner import (
    MEMORY_BUDGET_BYTES_DEFAULT,
    CompactionConfig,
    Compactor,
    collect_orphans,
)
from compactor.view.manifest import CompactedManifests
from compactor.view.marks import LedgerMarks
from compactor.view.reader import CompactedReader, last_message_id
from compactor.view.topic import COMPACTION_SUBSCRIPTION, CompactedTopic
from cursor import CursorStore, ManagedCursor
from ledger import (
    EARLIEST,
    DataDir,
    FaultyLedgerStore,
    ManagedLedger,
    ManagedLedgerConfig,
    Position,
    SimulatedCrash,
)
from ledger.storage.base import LedgerStore
from message.encoder import encode_batch, encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/incremental"
KEYS = tuple(f"key-{index}" for index in range(16))
NOW_MS = 1_000_000
RETENTION_MS = 5_000


# -- the workload --------------------------------------------------------------------------


def _metadata(sequence_id: int, publish_ms: int, key: str | None = None) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(producer_name="producer", sequence_id=sequence_id, publish_time=publish_ms)
    if key is not None:
        metadata.partition_key = key
    return metadata


def workload(seed: int, count: int, publish_ms: int, keys: Sequence[str] = KEYS) -> list[bytes]:
    """``count`` entries: batches (some slots key-less or tombstones), tombstones,
    key-less messages and updates, over few keys (they supersede each other often)."""
    rng = random.Random(seed)
    entries = []
    for sequence_id in range(count):
        value = b"value-%d-%d" % (seed, sequence_id)
        roll = rng.random()
        if roll < 0.35:
            slots = []
            for index in range(rng.randint(1, 5)):
                single = pb.SingleMessageMetadata()
                kind = rng.random()
                if kind < 0.9:
                    single.partition_key = rng.choice(keys)
                slots.append((single, b"" if kind < 0.15 else value + b"/%d" % index))
            entries.append(encode_batch(_metadata(sequence_id, publish_ms), slots, rng.choice([pb.NONE, pb.ZLIB]),
                                        with_checksum=False))
            continue
        if roll < 0.5:
            metadata, value = _metadata(sequence_id, publish_ms, rng.choice(keys)), b""
        elif roll < 0.55:
            metadata = _metadata(sequence_id, publish_ms)
        else:
            metadata = _metadata(sequence_id, publish_ms, rng.choice(keys))
        entries.append(encode_entry(metadata, value, with_checksum=False))
    return entries


# -- one "process" over the data dir -------------------------------------------------------


@dataclass
class Broker:
    data_dir: DataDir
    faulty: FaultyLedgerStore
    ledger: ManagedLedger
    topic: CompactedTopic
    orphans: list[int]


_OPENED: list[DataDir] = []


@pytest.fixture(autouse=True)
def _close_data_dirs() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def start(path: Path, *, parsed: bool = False) -> Broker:
    """Start as compactd does: collect orphans, open the topic, restore its view."""
    data_dir = DataDir.open(str(path))
    _OPENED.append(data_dir)
    orphans = collect_orphans(data_dir)
    faulty = FaultyLedgerStore(data_dir.ledgers)
    store: LedgerStore = faulty if parsed else data_dir.ledgers
    ledger = ManagedLedger.open(TOPIC, store, data_dir.metadata, ManagedLedgerConfig(max_entries_per_ledger=8))
    return Broker(data_dir, faulty, ledger, CompactedTopic.restore(ledger, CursorStore(data_dir.database)), orphans)


def kill(broker: Broker) -> None:
    """``kill -9``: nothing sealed or closed; the stores stop and the lock goes."""
    broker.faulty.disarm()
    _OPENED.remove(broker.data_dir)
    broker.data_dir.close()


def append(broker: Broker, entries: Sequence[bytes]) -> Position:
    for future in [broker.ledger.append(data) for data in entries]:
        future.result(timeout=10)
    return broker.ledger.last_confirmed_position()


class Clock:
    def __init__(self) -> None:
        self.ms = NOW_MS

    def __call__(self) -> float:
        return self.ms / 1000


# -- what readers must see -----------------------------------------------------------------


Logical = tuple[Position, int, tuple[int, ...], bytes]


def logical(entries: Sequence[CompactedEntry]) -> list[Logical]:
    return [(entry.position, entry.batch_size, entry.surviving, entry.emptied()) for entry in entries]


def reference(ledger: ManagedLedger, horizon: Position, cutoff: int | None = None, *,
              retain_null_key: bool = False) -> list[CompactedEntry]:
    raw = ledger.read_entries(ledger.first_position(), 100_000)
    return compact([entry for entry in raw if entry.position <= horizon], keep_tombstones_since_ms=cutoff,
                   retain_null_key=retain_null_key)


def read_compacted(topic: CompactedTopic, batch: int = 3) -> list[CompactedEntry]:
    """What a read-compacted reader from the earliest message gets, the raw tail included."""
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(topic.ledger, "r", EARLIEST), from_earliest=True)
    seen: list[CompactedEntry] = []
    for _ in range(10_000):
        got = reader.read(batch)
        if not got:
            return seen
        seen.extend(got)
    raise AssertionError("the reader never reached the end")


def assert_serves(topic: CompactedTopic, cutoff: int | None = None, *, retain_null_key: bool = False) -> None:
    """The view equals a full rewrite up to its horizon, through the view and a reader."""
    view = topic.view
    assert view is not None
    expected = reference(topic.ledger, view.horizon, cutoff, retain_null_key=retain_null_key)
    assert logical(list(view.iter_all())) == logical(expected)
    assert [entry.data for entry in view.read(0, view.entries - 1, emptied=True)] == [e.data for e in expected] \
        if view.entries else not expected
    raw = topic.ledger.read_entries(topic.ledger.first_position(), 100_000)
    tail = [CompactedEntry(e.position, e.data) for e in raw if e.position > view.horizon]
    assert logical(read_compacted(topic)) == logical(expected + tail)
    live = sum(1 for entry in expected for _ in (entry.surviving or (None,)))
    assert view.entries == len(expected) and live >= view.entries


# -- dead marks: encoding ------------------------------------------------------------------


def test_marks_round_trip_and_say_which_rows_are_dead() -> None:
    stored = np.array([0, 1, 1, 1, 2, 3, 3], dtype=np.uint32)
    batch_index = np.array([-1, 0, 1, 2, -1, 0, 1], dtype=np.int32)
    message = np.array([True, True, False, True, True, True, True])  # slot 1:1 was emptied before
    keyed = np.array([True, True, False, True, False, True, True])
    dead = np.array([False, True, False, False, True, True, True])
    marks = LedgerMarks.from_rows(LedgerMarks.none(4, 6, 5), stored, batch_index, message, keyed, dead)
    assert marks.dead_entries.tolist() == [False, False, True, True]  # 2 whole, 3: both slots
    assert marks.dead_slots.tolist() == [(1 << 32) | 0]  # entry 1 keeps slot 2
    assert (marks.dead_messages, marks.dead_keys, marks.dead_ratio) == (4, 3, 4 / 6)
    assert marks.dead_rows(stored, batch_index).tolist() == [False, True, False, False, True, True, True]
    assert marks.live_stored().tolist() == [0, 1] and marks.dead_slots_of(1) == frozenset({0})
    decoded = LedgerMarks.decode(*marks.encode())
    assert decoded == marks and decoded.dead_slots_of(1) == frozenset({0})
    with pytest.raises(ValueError, match="dead marks of 9 entries"):
        LedgerMarks.decode(9, 0, 0, 0, 0, marks.encode()[5], b"")


# -- incremental runs agree with a full rewrite --------------------------------------------


STORES = ["files", "parsed", "rounds"]


def _config(store: str, **settings: object) -> CompactionConfig:
    budget = 4 * KEY_MAP_BYTES_PER_KEY if store == "rounds" else MEMORY_BUDGET_BYTES_DEFAULT
    return CompactionConfig(engine="local", read_batch_entries=4, memory_budget_bytes=budget, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("retain_null_key", [False, True])
def test_incremental_runs_publish_the_full_rewrites_view_and_write_only_the_backlog(
    tmp_path: Path, store: str, retain_null_key: bool,
) -> None:
    broker = start(tmp_path, parsed=store == "parsed")
    compactor = Compactor(_config(store, retain_null_key=retain_null_key, merge_fan_in=64, merge_dead_ratio=1.0))
    previous_ids: tuple[int, ...] = ()
    for run in range(4):
        append(broker, workload(run, 30, publish_ms=NOW_MS))
        figures = compactor.compact(broker.topic)
        assert_serves(broker.topic, retain_null_key=retain_null_key)
        view = broker.topic.view
        assert view is not None
        assert figures.horizon == str(view.horizon) and figures.merged_ledgers == 0
        if run:  # the older ledgers stay; what the backlog superseded is marked, not rewritten
            assert figures.dead_marked > 0 and view.dead_messages >= figures.dead_marked
            assert figures.entries_read <= 30 and figures.rounds >= 1
            assert len(view.ledger_ids) == len(previous_ids) + figures.rounds
            assert view.ledger_ids[:len(previous_ids)] == previous_ids
        previous_ids = view.ledger_ids
    # a restart restores the ledgers and their marks from the manifest
    ledger_ids, dead = view.ledger_ids, view.dead_messages
    kill(broker)
    broker = start(tmp_path, parsed=store == "parsed")
    view = broker.topic.view
    assert view is not None and (view.ledger_ids, view.dead_messages) == (ledger_ids, dead)
    assert_serves(broker.topic, retain_null_key=retain_null_key)
    # a full rewrite over the marked view: one ledger, nothing dead, the same view
    append(broker, workload(9, 5, publish_ms=NOW_MS))
    figures = Compactor(_config(store, retain_null_key=retain_null_key)).compact(broker.topic, rewrite=True)
    view = broker.topic.view
    assert view is not None and view.ledger_ids == (figures.ledger_id,) and view.dead_messages == 0
    assert_serves(broker.topic, retain_null_key=retain_null_key)


@pytest.mark.parametrize("store", ["files", "parsed"])
def test_tombstones_that_age_past_the_retention_are_marked_dead_as_a_rewrite_drops_them(
    tmp_path: Path, store: str,
) -> None:
    broker = start(tmp_path, parsed=store == "parsed")
    clock = Clock()
    compactor = Compactor(_config(store, merge_fan_in=64, merge_dead_ratio=1.0), clock=clock)
    append(broker, workload(1, 40, publish_ms=clock.ms))
    compactor.compact(broker.topic, delete_retention_ms=RETENTION_MS)
    assert_serves(broker.topic, clock.ms - RETENTION_MS)
    young = broker.topic.view
    assert young is not None
    clock.ms += 2 * RETENTION_MS  # every tombstone of the first run is old now
    append(broker, workload(2, 5, publish_ms=clock.ms, keys=("other",)))
    figures = compactor.compact(broker.topic, delete_retention_ms=RETENTION_MS)
    assert_serves(broker.topic, clock.ms - RETENTION_MS)
    view = broker.topic.view
    assert view is not None and view.ledger_ids[0] == young.ledger_ids[0] and figures.dead_marked > 0


def test_a_run_in_a_worker_process_is_incremental_too(tmp_path: Path) -> None:
    broker = start(tmp_path)
    compactor = Compactor(_config("files", worker_processes=1, merge_fan_in=64))
    try:
        for run in range(3):
            append(broker, workload(10 + run, 25, publish_ms=NOW_MS))
            figures = compactor.compact(broker.topic)
            assert_serves(broker.topic)
        view = broker.topic.view
        assert view is not None and len(view.ledger_ids) == 3 and figures.dead_marked > 0
        assert compactor.worker_pids()  # the rounds ran in the child
        compactor.compact(broker.topic, rewrite=True)  # the child rewrites a marked view
        assert_serves(broker.topic)
        assert broker.topic.view is not None and broker.topic.view.dead_messages == 0
    finally:
        compactor.close()


def test_the_switch_off_rewrites_every_run(tmp_path: Path) -> None:
    broker = start(tmp_path)
    for run in range(2):
        append(broker, workload(run, 20, publish_ms=NOW_MS))
        figures = Compactor(_config("files", incremental=False)).compact(broker.topic)
        view = broker.topic.view
        assert view is not None and view.ledger_ids == (figures.ledger_id,) and figures.dead_marked == 0
        assert_serves(broker.topic)


def test_a_chunked_message_makes_the_run_rewrite_the_view(tmp_path: Path) -> None:
    broker = start(tmp_path)
    append(broker, workload(1, 20, publish_ms=NOW_MS))
    Compactor(_config("files")).compact(broker.topic)
    chunks = []
    for chunk_id in range(2):
        metadata = _metadata(100 + chunk_id, NOW_MS, KEYS[0])
        metadata.uuid, metadata.chunk_id, metadata.num_chunks_from_msg = "u-1", chunk_id, 2
        metadata.total_chunk_msg_size, metadata.uncompressed_size = 4, 4
        chunks.append(encode_entry(metadata, b"ab" if chunk_id == 0 else b"cd", with_checksum=False))
    append(broker, chunks)
    figures = Compactor(_config("files")).compact(broker.topic)
    view = broker.topic.view
    assert view is not None and view.ledger_ids == (figures.ledger_id,) and figures.dead_marked == 0
    assert_serves(broker.topic)


# -- readers --------------------------------------------------------------------------------


def _marked_topic(tmp_path: Path) -> Broker:
    """A view of two ledgers whose first has dead entries and dead batch slots."""
    broker = start(tmp_path)
    batch = encode_batch(_metadata(0, NOW_MS), [(_single("a"), b"a1"), (_single("b"), b"b1"), (_single("c"), b"c1")],
                         pb.NONE, with_checksum=False)
    append(broker, [batch, _value("d", b"d1", 1), _value("e", b"e1", 2)])
    compactor = Compactor(_config("files", merge_fan_in=64, merge_dead_ratio=1.0))
    compactor.compact(broker.topic)
    append(broker, [_value("b", b"b2", 3), _value("e", b"", 4), _value("f", b"f1", 5)])
    compactor.compact(broker.topic)
    return broker


def _single(key: str) -> pb.SingleMessageMetadata:
    return pb.SingleMessageMetadata(partition_key=key)


def _value(key: str, value: bytes, sequence_id: int) -> bytes:
    return encode_entry(_metadata(sequence_id, NOW_MS, key), value, with_checksum=False)


def test_readers_skip_dead_entries_and_slots_and_seek_past_them(tmp_path: Path) -> None:
    broker = _marked_topic(tmp_path)
    view = broker.topic.view
    assert view is not None and len(view.ledger_ids) == 2
    first = broker.ledger.first_position()
    batch_at, d_at, e_at = (Position(first.ledger_id, entry_id) for entry_id in range(3))
    # the batch lost slot 1 (b), e's entry is dead (deleted); the stats count live entries
    assert [(e.position, e.surviving) for e in view.iter_all()][:2] == [(batch_at, (0, 2)), (d_at, ())]
    assert e_at not in [entry.position for entry in view.iter_all()]
    assert view.entries == 4 and view.live_segments[0] == (view.ledger_ids[0], 2)
    assert view.segments[0] == (view.ledger_ids[0], 3) and view.dead_messages == 2
    assert_serves(broker.topic)
    # the reader's ack_set mask hides the dead slot
    reader = CompactedReader(broker.topic, ManagedCursor.open_non_durable(broker.ledger, "r", EARLIEST),
                             from_earliest=True)
    got = reader.read(10)
    assert got[0].position == batch_at and reader.ack_set(batch_at) == (0b101,)
    # a seek to the dead entry lands on the next live one
    reader.seek(e_at)
    assert reader.read(1)[0].position > e_at
    assert view.find_start(e_at) == 2 and view.position_at(2) > e_at


def test_the_last_message_id_skips_a_dead_last_entry(tmp_path: Path) -> None:
    broker = start(tmp_path)
    compactor = Compactor(_config("files", merge_fan_in=64, merge_dead_ratio=1.0))
    append(broker, [_value("a", b"a1", 0), _value("b", b"b1", 1)])
    compactor.compact(broker.topic)
    append(broker, [_value("b", b"", 2)])  # deletes b: the first ledger's last entry dies
    compactor.compact(broker.topic)
    view = broker.topic.view
    assert view is not None and len(view.ledger_ids) == 2 and view.entries == 1
    first = broker.ledger.first_position()
    assert view.last_message_id() == Position(first.ledger_id, 0)
    assert last_message_id(broker.topic) == Position(first.ledger_id, 0)


# -- the publish transaction ---------------------------------------------------------------


@pytest.mark.parametrize("point", ["compaction.manifest.write", "compaction.marks.write", "cursor.save.before",
                                   "cursor.save.after"])
def test_the_marks_change_with_the_manifest_and_the_mark_delete_or_not_at_all(tmp_path: Path, point: str) -> None:
    broker = start(tmp_path)
    compactor = Compactor(_config("files", merge_fan_in=64, merge_dead_ratio=1.0))
    append(broker, workload(1, 20, publish_ms=NOW_MS))
    compactor.compact(broker.topic)
    old = broker.topic.view
    assert old is not None
    old_marks = CompactedManifests(broker.data_dir.database).marks(TOPIC)
    append(broker, workload(2, 20, publish_ms=NOW_MS))

    def crash(**_: object) -> None:
        raise SimulatedCrash(point)

    broker.data_dir.database.fault_points[point] = crash
    with pytest.raises(SimulatedCrash):
        compactor.compact(broker.topic)
    kill(broker)
    broker = start(tmp_path)
    view = broker.topic.view
    assert view is not None
    marks = CompactedManifests(broker.data_dir.database).marks(TOPIC)
    if point == "cursor.save.after":  # committed: the new view and its marks, whole
        assert view.ledger_ids[:1] == old.ledger_ids and len(view.ledger_ids) == 2
        assert marks[old.ledger_id].dead_messages > 0 and view.dead_messages > 0
    else:  # rolled back: the old view and the old marks; the new ledger was an orphan
        assert view.ledger_ids == old.ledger_ids and marks == old_marks and view.dead_messages == 0
        assert len(broker.orphans) == 1
    assert_serves(broker.topic)
    append(broker, workload(3, 10, publish_ms=NOW_MS))
    compactor.compact(broker.topic)  # the next run converges
    assert_serves(broker.topic)
    assert broker.topic.view is not None and broker.topic.view.horizon == broker.ledger.last_confirmed_position()


# -- merges ---------------------------------------------------------------------------------


def test_the_plan_rewrites_a_ledger_past_the_dead_ratio_and_merges_full_tiers() -> None:
    mib = TIER_BASE_BYTES
    assert plan_merges([LedgerShape(64 * mib, 0.6), LedgerShape(mib // 2)], dead_ratio=0.5, fan_in=4) == [(0, 0)]
    assert plan_merges([LedgerShape(64 * mib, 0.4), LedgerShape(mib // 2)], dead_ratio=0.5, fan_in=4) == []
    # four of tier 0 make one; a larger newer ledger takes the smaller ones before it
    assert plan_merges([LedgerShape(64 * mib)] + [LedgerShape(100)] * 4, dead_ratio=0.5, fan_in=4) == [(1, 4)]
    assert plan_merges([LedgerShape(64 * mib), LedgerShape(100), LedgerShape(16 * mib)], dead_ratio=0.5,
                       fan_in=4) == [(1, 2)]
    assert tier(TIER_BASE_BYTES * 16, 4) == 2 and ledgers_max(TIER_BASE_BYTES * 16, 4) == 9
    with pytest.raises(ValueError, match="fan_in"):
        plan_merges([], dead_ratio=0.5, fan_in=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=64 * TIER_BASE_BYTES), min_size=1, max_size=60),
       st.integers(min_value=2, max_value=6))
def test_after_every_merge_step_the_view_holds_at_most_the_bound(appended: list[int], fan_in: int) -> None:
    """Ledgers appended run after run, each run's merge step applied: the count never passes
    ``(F - 1) * (T + 1)``, ``T`` the tier of the whole, and the bytes merges rewrite stay
    within ``(T + 2)`` times the bytes appended, plus ``F`` base units per run (tier 0)."""
    view: list[int] = []
    rewritten = 0
    for size in appended:
        view.append(size)
        for first, last in reversed(plan_merges([LedgerShape(s) for s in view], dead_ratio=0.5, fan_in=fan_in)):
            view[first:last + 1] = [sum(view[first:last + 1])]
            rewritten += view[first]
        total = sum(view)
        assert len(view) <= ledgers_max(total, fan_in)
    total = sum(appended)
    assert rewritten <= (tier(total, fan_in) + 2) * total + len(appended) * fan_in * TIER_BASE_BYTES


def test_a_run_merges_a_mostly_dead_ledger_and_keeps_the_view_bounded(tmp_path: Path) -> None:
    broker = start(tmp_path)
    compactor = Compactor(_config("files", merge_fan_in=3))
    append(broker, workload(1, 40, publish_ms=NOW_MS))
    first = compactor.compact(broker.topic)
    merged = 0
    for run in range(2, 9):
        append(broker, workload(run, 12, publish_ms=NOW_MS))
        figures = compactor.compact(broker.topic)
        merged += figures.merged_ledgers
        view = broker.topic.view
        assert view is not None and len(view.ledger_ids) <= ledgers_max(view.size, 3)
        assert_serves(broker.topic)
    assert merged > 0 and first.ledger_id not in view.ledger_ids  # the first ledger was rewritten
    for ledger_id in view.ledger_ids:
        marks = view.marks_of(ledger_id)
        assert marks is not None
    assert set(broker.data_dir.ledgers.list()) == {r.ledger_id for r in broker.ledger.ledger_list()} | set(
        view.ledger_ids)  # merged ledgers deleted (no grace period)


@pytest.mark.parametrize("point", ["compaction.manifest.write", "compaction.marks.write", "cursor.save.after",
                                   "append", "close"])
def test_a_crash_in_the_merge_step_leaves_the_incremental_view_or_the_merged_one(tmp_path: Path, point: str) -> None:
    broker = start(tmp_path, parsed=True)
    compactor = Compactor(_config("parsed", merge_fan_in=2, merge_dead_ratio=1.0))
    append(broker, workload(1, 20, publish_ms=NOW_MS))
    compactor.compact(broker.topic)
    before = broker.topic.view
    assert before is not None
    append(broker, workload(2, 20, publish_ms=NOW_MS))  # two ledgers of tier 0: the merge step merges them
    publishes = 0

    def crash_at_the_merge(**_: object) -> None:
        nonlocal publishes
        publishes += 1
        if publishes == 2:  # the incremental publish went through; the merge's crashes
            raise SimulatedCrash(point)

    if point == "append":  # the merge's second append: after the incremental run's ledger
        backlog = [e for e in broker.ledger.read_entries(broker.ledger.first_position(), 1000) if e.position > before.horizon]
        broker.faulty.crash_on("append", after=len(compact(backlog)) + 1)
    elif point == "close":  # the merge's seal: after the incremental run's
        broker.faulty.crash_on("close", after=1)
    else:
        broker.data_dir.database.fault_points[point] = crash_at_the_merge
    with pytest.raises(SimulatedCrash):
        compactor.compact(broker.topic)
    kill(broker)
    broker = start(tmp_path, parsed=True)
    view = broker.topic.view
    assert view is not None and view.horizon == broker.ledger.last_confirmed_position()
    if point == "cursor.save.after":
        assert len(view.ledger_ids) == 1 and view.dead_messages == 0  # merged
    else:
        assert view.ledger_ids[0] == before.ledger_id and len(view.ledger_ids) == 2  # the incremental view
    assert_serves(broker.topic)
    assert set(broker.data_dir.ledgers.list()) == {r.ledger_id for r in broker.ledger.ledger_list()} | set(
        view.ledger_ids)  # the start collected the merge's orphan or the replaced ledgers
    append(broker, workload(3, 10, publish_ms=NOW_MS))
    compactor.compact(broker.topic)
    assert_serves(broker.topic)
    assert CursorStore(broker.data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION) is not None


def test_the_spark_sources_rows_skip_dead_entries_and_slots(tmp_path: Path) -> None:
    """The ``compactd`` data source (batch; the stream plans its snapshot the same way)
    reads the view's ledgers on executors: each piece carries its ledger's marks."""
    from compactor.spark import rows
    from compactor.spark.source import plan_ranges

    broker = _marked_topic(tmp_path)
    view = broker.topic.view
    assert view is not None
    pieces = plan_ranges(broker.data_dir.path, TOPIC, read_compacted=True, include_open_ledger=True)
    assert [marks is not None and marks.any_dead for piece, marks in pieces if piece.compacted] == [True, False]
    got = [(row["key"], row["value"], row["ledger_id"], row["entry_id"], row["batch_index"])
           for piece, marks in pieces
           for batch in rows.message_batches(rows.ledgers_root_of(broker.data_dir.path), piece, marks=marks)
           for row in batch.to_pylist()]
    expected = [(key, value, entry.position.ledger_id, entry.position.entry_id, index)
                for entry in reference(broker.ledger, view.horizon)
                for key, value, index in _messages(entry)]
    assert got == expected and ("b", b"b1", broker.ledger.first_position().ledger_id, 0, 1) not in got


def _messages(entry: CompactedEntry) -> list[tuple[str | None, bytes | None, int]]:
    from message.entry import iter_messages, parse_entry

    return [(m.key, None if m.null_value else m.payload, m.batch_index) for m in iter_messages(parse_entry(entry.data))
            if not m.compacted_out]


class _RecordingSpark:
    """A ``RewriteEngine`` that records what it was asked and fails (nothing to publish)."""

    driver_bytes_per_key = 1

    def __init__(self) -> None:
        self.requests: list[object] = []

    def compact(self, request: object, ledgers: object) -> object:
        from compactor.errors import SparkEngineError

        self.requests.append(request)
        raise SparkEngineError("recorded")


def test_a_spark_run_reads_the_backlog_alone_and_a_spark_rewrite_first_merges_the_marked_ledgers(
    tmp_path: Path,
) -> None:
    """An incremental spark job is handed the backlog only; a rewriting one reads the view's
    ledgers whole on the executors, so it is handed none with dead marks."""
    from compactor.errors import SparkEngineError

    broker = _marked_topic(tmp_path)
    marked = broker.topic.view
    assert marked is not None and marked.dead_messages
    append(broker, [_value("a", b"a2", 9)])
    engine = _RecordingSpark()
    with pytest.raises(SparkEngineError, match="recorded"):
        Compactor(CompactionConfig(engine="spark"), spark_engine=engine).compact(broker.topic)  # type: ignore[arg-type]
    assert broker.topic.view is marked  # nothing published
    [request] = engine.requests
    assert [piece.compacted for piece in request.ranges] == [False]  # type: ignore[attr-defined]
    with pytest.raises(SparkEngineError, match="recorded"):
        Compactor(CompactionConfig(engine="spark"), spark_engine=engine).compact(  # type: ignore[arg-type]
            broker.topic, rewrite=True)
    view = broker.topic.view
    assert view is not None and view.dead_messages == 0 and view.ledger_ids[0] not in marked.ledger_ids
    assert_serves(broker.topic)
    request = engine.requests[-1]
    compacted = [piece.ledger_id for piece in request.ranges if piece.compacted]  # type: ignore[attr-defined]
    assert compacted == [ledger_id for ledger_id, entries in view.segments if entries]


def test_a_round_over_indexes_writes_its_ledgers_key_index_as_parsing_would_build_it(tmp_path: Path) -> None:
    """The next incremental run reads the new ledger's keys from its ``.kidx``, which the
    round made from its input's rows: it must be the index a parse of the ledger builds."""
    from compactor.engine import LedgerRange
    from compactor.local.key_index import IndexedLedger, index_path, ledger_path, read_index
    from compactor.local.supersede import Indexes

    broker = start(tmp_path)
    compactor = Compactor(_config("files", merge_fan_in=64, merge_dead_ratio=1.0))
    for run in range(3):
        append(broker, workload(20 + run, 30, publish_ms=NOW_MS))
        compactor.compact(broker.topic)
    view = broker.topic.view
    assert view is not None and len(view.ledger_ids) == 3
    parsed = Indexes(FaultyLedgerStore(broker.data_dir.ledgers))  # shows no files: builds by parsing
    for ledger_id, entries in view.segments:
        info = broker.data_dir.ledgers.info(ledger_id)
        written = read_index(index_path(ledger_path(broker.data_dir.ledgers.root, ledger_id)),
                             IndexedLedger(ledger_id, entries, info.size_bytes))
        assert written is not None  # written by the round (the newest ledger was never read since)
        built = parsed.load(LedgerRange(ledger_id, 0, entries - 1, compacted=True), ())
        for name, column in built.items():
            if name not in ("entry_offset", "stored_bytes"):
                assert written[name].tolist() == column.tolist(), name


def test_a_backup_restores_the_view_with_its_dead_marks(tmp_path: Path) -> None:
    from ledger.backup import restore_backup, take_backup

    broker = _marked_topic(tmp_path / "data")
    view = broker.topic.view
    assert view is not None and view.dead_messages
    expected = logical(read_compacted(broker.topic))
    take_backup(broker.data_dir, str(tmp_path / "backup"))
    kill(broker)
    restore_backup(str(tmp_path / "backup"), str(tmp_path / "restored"))
    restored = start(tmp_path / "restored")
    again = restored.topic.view
    assert again is not None and (again.ledger_ids, again.dead_messages) == (view.ledger_ids, view.dead_messages)
    assert logical(read_compacted(restored.topic)) == expected
    assert_serves(restored.topic)


def test_the_minimum_lag_holds_back_the_young_backlog_of_an_incremental_run(tmp_path: Path) -> None:
    broker = start(tmp_path)
    clock = Clock()
    compactor = Compactor(_config("files", merge_fan_in=64, merge_dead_ratio=1.0), clock=clock)
    append(broker, workload(1, 20, publish_ms=clock.ms - 60_000))
    compactor.compact(broker.topic)
    old = append(broker, workload(2, 20, publish_ms=clock.ms - 60_000))
    young = append(broker, workload(3, 10, publish_ms=clock.ms))
    figures = compactor.compact(broker.topic, min_compaction_lag_ms=30_000)
    view = broker.topic.view
    assert view is not None and view.horizon == old and figures.dead_marked > 0 and len(view.ledger_ids) == 2
    assert_serves(broker.topic)
    clock.ms += 60_000
    compactor.compact(broker.topic, min_compaction_lag_ms=30_000)
    view = broker.topic.view
    assert view is not None and view.horizon == young and len(view.ledger_ids) == 3
    assert_serves(broker.topic)
