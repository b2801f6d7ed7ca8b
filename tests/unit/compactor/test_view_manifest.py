"""The manifest of a compacted view of several ledgers: publish, restore, crash rules, the
grace period of replaced ledgers and orphan collection (issue 13, point 1).

Every test runs a real data dir (file ledgers, SQLite). A view of several ledgers is made
as a Spark run's phase two would: the reference compaction of the raw entries up to a stop
(``compactor.local.algorithm.compact``) is split into sealed compacted ledgers (some empty),
published with ``Compactor._publish``. A "kill" abandons the topic unsealed and closes the
stores; a start runs ``collect_orphans`` and restores the topic, as compactd does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compactor.errors import CompactedLedgerMissingError, CompactorError
from compactor.local.algorithm import CompactedEntry, compact
from compactor.runs.runner import Compactor, collect_orphans, sweep_compacted_garbage
from compactor.view.manifest import CompactedManifests
from compactor.view.reader import CompactedReader
from compactor.view.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION, CompactedTopic
from compactor.view.view import CompactedView, encode_compacted_entry
from cursor import CursorStore, ManagedCursor
from ledger import EARLIEST, DataDir, ManagedLedger, ManagedLedgerConfig, Position, SimulatedCrash
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/manifest"
NOW_S = 1_700_000_000.0
GRACE_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now_s = NOW_S

    def __call__(self) -> float:
        return self.now_s

    @property
    def ms(self) -> int:
        return int(self.now_s * 1000)


@dataclass
class World:
    """One "process" on the data dir."""

    data_dir: DataDir
    ledger: ManagedLedger
    topic: CompactedTopic
    orphans: list[int]


_OPENED: list[DataDir] = []


@pytest.fixture(autouse=True)
def _close_data_dirs() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def start(path: Path, clock: Clock, grace_period_s: float = 0.0) -> World:
    data_dir = DataDir.open(str(path))
    _OPENED.append(data_dir)
    orphans = collect_orphans(data_dir, now_ms=clock.ms)
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata,
                                ManagedLedgerConfig(max_entries_per_ledger=4))
    topic = CompactedTopic.restore(ledger, CursorStore(data_dir.database), grace_period_s=grace_period_s, clock=clock)
    return World(data_dir, ledger, topic, orphans)


def kill(world: World) -> None:
    """The process dies: nothing is sealed; the stores stop and the lock goes."""
    _OPENED.remove(world.data_dir)
    world.data_dir.close()


def message(key: str, value: bytes, sequence_id: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1_000 + sequence_id,
                                  partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def append(world: World, count: int, first: int = 0) -> Position:
    for index in range(first, first + count):
        world.ledger.append(message(f"k{index % 5}", b"v%d" % index, index)).result(timeout=10)
    return world.ledger.last_confirmed_position()


def reference(world: World, stop: Position) -> list[CompactedEntry]:
    raw = world.ledger.read_entries(world.ledger.first_position(), 10_000)
    return compact([entry for entry in raw if entry.position <= stop])


def write_pieces(world: World, entries: list[CompactedEntry], cuts: tuple[int, ...]) -> list[int]:
    """Sealed compacted ledgers holding ``entries`` cut at ``cuts`` (a Spark run's output)."""
    bounds = [0, *cuts, len(entries)]
    ledger_ids = []
    for first, end in itertools.pairwise(bounds):
        ledger_id = world.data_dir.ledgers.create({"component": "compacted-ledger", "topic": TOPIC})
        for entry in entries[first:end]:
            world.data_dir.ledgers.append(ledger_id, encode_compacted_entry(entry)).result(timeout=10)
        world.data_dir.ledgers.close(ledger_id)
        ledger_ids.append(ledger_id)
    return ledger_ids


def publish_split(world: World, stop: Position, cuts: tuple[int, ...] = (1, 1, 3)) -> CompactedView:
    """Publish the compaction up to ``stop`` as a view of several ledgers."""
    ledger_ids = write_pieces(world, reference(world, stop), cuts)
    return Compactor()._publish(world.topic, world.topic.cursor, stop, ledger_ids, world.topic.view)


def read_compacted(topic: CompactedTopic) -> list[CompactedEntry]:
    reader = CompactedReader(topic, ManagedCursor.open_non_durable(topic.ledger, "r", EARLIEST), from_earliest=True)
    seen: list[CompactedEntry] = []
    while batch := reader.read(3):
        seen.extend(batch)
    return seen


def expected(world: World, horizon: Position) -> list[CompactedEntry]:
    raw = world.ledger.read_entries(world.ledger.first_position(), 10_000)
    return reference(world, horizon) + [CompactedEntry(e.position, e.data) for e in raw if e.position > horizon]


def persisted(world: World) -> tuple[int | None, tuple[int, ...], Position]:
    record = CursorStore(world.data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION)
    assert record is not None
    return (record.properties.get(COMPACTED_TOPIC_LEDGER), CompactedManifests(world.data_dir.database).ledger_ids(TOPIC),
            record.mark_delete_position)


def test_a_restart_restores_the_view_of_several_ledgers_from_the_manifest(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock)
    stop = append(world, 14)
    view = publish_split(world, stop)
    assert len(view.ledger_ids) == 4 and 0 in dict(view.segments).values()  # an empty ledger among them
    assert persisted(world) == (view.ledger_ids[0], view.ledger_ids, stop)
    append(world, 3, first=14)
    kill(world)

    world = start(tmp_path, clock)
    assert world.orphans == []
    restored = world.topic.view
    assert restored is not None and restored.ledger_ids == view.ledger_ids and restored.horizon == stop
    assert list(restored.iter_all()) == reference(world, stop)
    assert read_compacted(world.topic) == expected(world, stop)


def test_a_view_published_before_the_manifest_restores_from_the_property_alone(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock)
    stop = append(world, 10)
    Compactor().compact(world.topic)
    one = world.topic.view
    assert one is not None
    with world.data_dir.database.transaction() as db:  # what an older compactd persisted
        db.execute("DELETE FROM compacted_manifest")
    kill(world)

    world = start(tmp_path, clock)
    assert world.orphans == []  # the property alone keeps its ledger
    restored = world.topic.view
    assert restored is not None and restored.ledger_ids == (one.ledger_id,)
    assert read_compacted(world.topic) == expected(world, stop)


def test_a_missing_ledger_of_the_manifest_breaks_the_topic_until_the_view_is_dropped(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock)
    stop = append(world, 12)
    view = publish_split(world, stop, cuts=(2, 4))
    kill(world)
    missing = view.ledger_ids[1]
    data_dir = DataDir.open(str(tmp_path))
    data_dir.ledgers.delete(missing)
    data_dir.close()

    world = start(tmp_path, clock)
    assert world.topic.broken == missing
    with pytest.raises(CompactedLedgerMissingError) as raised:
        _ = world.topic.view
    assert raised.value.ledger_id == missing
    with pytest.raises(CompactedLedgerMissingError):
        Compactor().compact(world.topic)
    world.topic.drop_view()
    left = set(world.data_dir.ledgers.list())
    assert not left & set(view.ledger_ids)  # every ledger of the broken view went with it
    assert Compactor().compact(world.topic).ledger_id in world.data_dir.ledgers.list()
    assert read_compacted(world.topic) == expected(world, stop)


def test_drop_view_deletes_every_ledger_of_the_view_and_its_manifest(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock, grace_period_s=GRACE_S)
    stop = append(world, 9)
    view = publish_split(world, stop)
    world.topic.drop_view()
    assert not set(world.data_dir.ledgers.list()) & set(view.ledger_ids)
    assert CompactedManifests(world.data_dir.database).ledger_ids(TOPIC) == ()
    assert CompactedManifests(world.data_dir.database).garbage() == {}
    assert world.topic.view is None


def test_a_failed_publish_deletes_every_new_ledger_and_the_old_view_serves(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock)
    append(world, 8)
    Compactor().compact(world.topic)
    old = world.topic.view
    assert old is not None
    stop = append(world, 6, first=8)
    ledger_ids = write_pieces(world, reference(world, stop), (1, 1))

    def refuse(**_: object) -> None:
        raise OSError("disk full")

    world.data_dir.database.fault_points["compaction.manifest.write"] = refuse
    with pytest.raises(OSError, match="disk full"):
        Compactor()._publish(world.topic, world.topic.cursor, stop, ledger_ids, old)
    assert not set(world.data_dir.ledgers.list()) & set(ledger_ids)
    assert world.topic.view is old and persisted(world) == (old.ledger_id, old.ledger_ids, old.horizon)
    with pytest.raises(CompactorError):  # a publish over a view that is not the topic's
        Compactor()._publish(world.topic, world.topic.cursor, stop, write_pieces(world, [], ()), None)


CRASH_POINTS = [
    pytest.param("cursor.save.before", False, id="before-the-transaction"),
    pytest.param("cursor.save.between_position_and_properties", False, id="inside-before-the-properties"),
    pytest.param("compaction.manifest.write", False, id="inside-before-the-manifest"),
    pytest.param("cursor.save.after", True, id="after-the-commit"),
]


@pytest.mark.parametrize(("point", "published"), CRASH_POINTS)
@pytest.mark.parametrize("grace_period_s", [0.0, GRACE_S])
def test_a_crash_around_the_publish_leaves_the_old_or_the_new_view_whole(
    tmp_path: Path, point: str, published: bool, grace_period_s: float,
) -> None:
    clock = Clock()
    world = start(tmp_path, clock, grace_period_s)
    append(world, 10)
    old = publish_split(world, world.ledger.last_confirmed_position(), cuts=(2,))
    stop = append(world, 7, first=10)
    new_ids = write_pieces(world, reference(world, stop), (1, 1, 4))

    def crash(**_: object) -> None:
        raise SimulatedCrash(point)

    world.data_dir.database.fault_points[point] = crash
    with pytest.raises(SimulatedCrash):
        Compactor()._publish(world.topic, world.topic.cursor, stop, new_ids, old)
    kill(world)

    world = start(tmp_path, clock, grace_period_s)
    view = world.topic.view
    assert view is not None
    served, dropped = (tuple(new_ids), old.ledger_ids) if published else (old.ledger_ids, tuple(new_ids))
    assert view.ledger_ids == served and persisted(world)[:2] == (served[0], served)
    assert read_compacted(world.topic) == expected(world, view.horizon)
    on_disk = set(world.data_dir.ledgers.list())
    assert set(served) <= on_disk
    if published and grace_period_s:  # the replaced view waits for its grace period
        assert set(dropped) <= on_disk and world.orphans == []
        clock.now_s += grace_period_s + 1
        assert sorted(sweep_compacted_garbage(world.data_dir, now_ms=clock.ms)) == sorted(dropped)
    else:  # unreferenced (the unpublished run's) or due at once (grace 0): collected at start
        assert sorted(world.orphans) == sorted(dropped)
    assert not set(world.data_dir.ledgers.list()) & set(dropped)


def test_replaced_ledgers_stay_readable_until_the_sweep_after_the_grace_period(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock, grace_period_s=GRACE_S)
    append(world, 10)
    old = publish_split(world, world.ledger.last_confirmed_position())
    old_entries = list(old.iter_all())
    stop = append(world, 5, first=10)
    new = publish_split(world, stop, cuts=(2, 2))
    assert world.topic.view is new
    garbage = CompactedManifests(world.data_dir.database).garbage()
    assert garbage == dict.fromkeys(old.ledger_ids, clock.ms + int(GRACE_S * 1000))

    clock.now_s += GRACE_S - 1
    assert sweep_compacted_garbage(world.data_dir, now_ms=clock.ms) == []
    assert list(old.iter_all()) == old_entries  # a scan of the old view still reads it whole
    kill(world)
    world = start(tmp_path, clock, grace_period_s=GRACE_S)  # the start keeps garbage not yet due
    assert world.orphans == [] and set(old.ledger_ids) <= set(world.data_dir.ledgers.list())

    clock.now_s += 2
    assert sorted(sweep_compacted_garbage(world.data_dir, now_ms=clock.ms)) == sorted(old.ledger_ids)
    assert not set(world.data_dir.ledgers.list()) & set(old.ledger_ids)
    assert CompactedManifests(world.data_dir.database).garbage() == {}
    assert read_compacted(world.topic) == expected(world, stop)


def test_the_start_deletes_due_garbage_and_orphans_and_keeps_the_rest(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock, grace_period_s=GRACE_S)
    append(world, 10)
    old = publish_split(world, world.ledger.last_confirmed_position())
    new = publish_split(world, append(world, 4, first=10), cuts=(3,))
    orphan = write_pieces(world, [], ())[0]  # a crashed run's ledger, never referenced
    kill(world)

    world = start(tmp_path, clock, grace_period_s=GRACE_S)
    assert world.orphans == [orphan]
    assert set(old.ledger_ids) | set(new.ledger_ids) <= set(world.data_dir.ledgers.list())
    kill(world)
    clock.now_s += GRACE_S
    world = start(tmp_path, clock, grace_period_s=GRACE_S)
    assert sorted(world.orphans) == sorted(old.ledger_ids)
    assert set(new.ledger_ids) <= set(world.data_dir.ledgers.list())
    assert world.topic.view is not None and world.topic.view.ledger_ids == new.ledger_ids


def test_deleting_the_topic_deletes_the_view_at_once(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock, grace_period_s=GRACE_S)
    view = publish_split(world, append(world, 9))
    world.topic.delete()
    assert not set(world.data_dir.ledgers.list()) & set(view.ledger_ids)
    assert CompactedManifests(world.data_dir.database).ledger_ids(TOPIC) == ()


def test_a_ledger_the_new_view_keeps_from_the_previous_one_is_neither_garbage_nor_deleted(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock)  # no grace period: replaced ledgers go at once
    stop = append(world, 10)
    old = publish_split(world, stop, cuts=(2,))
    kept, replaced = old.ledger_ids
    refused = write_pieces(world, [], ())

    def refuse(**_: object) -> None:
        raise OSError("refused")

    world.data_dir.database.fault_points["compaction.manifest.write"] = refuse
    with pytest.raises(OSError, match="refused"):  # a failed publish deletes only its own new ledgers
        Compactor()._publish(world.topic, world.topic.cursor, stop, [kept, *refused], old)
    assert kept in world.data_dir.ledgers.list() and refused[0] not in world.data_dir.ledgers.list()
    del world.data_dir.database.fault_points["compaction.manifest.write"]

    rest = write_pieces(world, reference(world, stop)[2:], ())
    new = Compactor()._publish(world.topic, world.topic.cursor, stop, [kept, *rest], old)
    assert new.ledger_ids == (kept, rest[0])
    on_disk = set(world.data_dir.ledgers.list())
    assert kept in on_disk and replaced not in on_disk
    assert CompactedManifests(world.data_dir.database).garbage() == {}
    assert read_compacted(world.topic) == expected(world, stop)


def test_the_manifest_records_whether_its_ledgers_live_in_the_bucket_and_old_files_read_as_local(
    tmp_path: Path,
) -> None:
    from compactor.view.manifest import MIGRATIONS
    from ledger.database import Database

    database = Database(str(tmp_path / "metadata.db"))
    try:
        manifests = CompactedManifests(database)
        assert not manifests.in_bucket(TOPIC)
        with database.transaction() as db:
            manifests.write(db, TOPIC, [7, 8], in_bucket=True)
        assert manifests.ledger_ids(TOPIC) == (7, 8) and manifests.in_bucket(TOPIC)
        with database.transaction() as db:  # the next view, written by the local engine
            manifests.write(db, TOPIC, [9], garbage=[7, 8])
        assert manifests.ledger_ids(TOPIC) == (9,) and not manifests.in_bucket(TOPIC)
    finally:
        database.close()

    # A file written before the column existed (version 1): its rows read as local files.
    legacy = tmp_path / "legacy.db"
    database = Database(str(legacy))
    database.register("compacted_manifest", MIGRATIONS[:1])
    with database.transaction() as db:
        db.execute("INSERT INTO compacted_manifest (topic, seq, ledger_id) VALUES (?, 0, 5)", (TOPIC,))
    database.close()
    database = Database(str(legacy))
    try:
        manifests = CompactedManifests(database)  # migrates to the last version
        assert database.version("compacted_manifest") == len(MIGRATIONS)
        assert manifests.ledger_ids(TOPIC) == (5,) and not manifests.in_bucket(TOPIC)
    finally:
        database.close()
