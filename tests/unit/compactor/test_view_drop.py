"""Deleting the ``__compaction`` subscription in two steps (``CompactedTopic.detach_view``).

The broker takes the view out of memory on its event loop and commits the deletion, then
deletes the files, on a worker thread. These tests hold the second step back and check
what can happen in between: readers read the raw topic and never the view's ledgers, a
run waits for the deletion before it opens the cursor again, a topic delete waits too, a
failed transaction brings the view back whole, and a crash before the second step leaves
the view as it was persisted. Real data dirs (file ledgers, SQLite), as the manifest tests.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from compactor.runs.runner import Compactor
from compactor.view.manifest import CompactedManifests
from compactor.view.topic import COMPACTION_SUBSCRIPTION
from cursor import CursorStore
from tests.unit.compactor.test_view_manifest import (  # noqa: F401 - _close_data_dirs: the autouse fixture
    TOPIC,
    Clock,
    _close_data_dirs,
    append,
    expected,
    kill,
    persisted,
    publish_split,
    read_compacted,
    start,
)

WAIT_S = 10.0


def test_a_detached_view_is_out_of_memory_at_once_and_on_disk_until_the_second_step(tmp_path: Path) -> None:
    world = start(tmp_path, Clock())
    stop = append(world, 9)
    view = publish_split(world, stop)
    rest = world.topic.detach_view()
    assert world.topic.view is None  # readers from now on: the raw topic
    assert read_compacted(world.topic) == expected(world, world.ledger.first_position())
    assert set(view.ledger_ids) <= set(world.data_dir.ledgers.list())  # nothing deleted yet
    assert persisted(world)[1] == view.ledger_ids
    rest()
    assert not set(world.data_dir.ledgers.list()) & set(view.ledger_ids)
    assert CursorStore(world.data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION) is None
    assert CompactedManifests(world.data_dir.database).ledger_ids(TOPIC) == ()


def test_a_run_waits_for_the_deletion_before_it_opens_the_cursor_again(tmp_path: Path) -> None:
    world = start(tmp_path, Clock())
    stop = append(world, 9)
    old = publish_split(world, stop)
    rest = world.topic.detach_view()
    ran: list[object] = []
    run = threading.Thread(target=lambda: ran.append(Compactor().compact(world.topic)))
    run.start()
    run.join(0.3)  # bounded: the run must still be waiting for the second step
    assert run.is_alive() and not ran
    assert world.topic.view is None
    rest()
    run.join(WAIT_S)
    assert not run.is_alive() and ran
    view = world.topic.view
    assert view is not None and not set(view.ledger_ids) & set(old.ledger_ids)
    assert read_compacted(world.topic) == expected(world, stop)
    assert persisted(world) == (view.ledger_id, view.ledger_ids, stop)  # the new cursor's, not deleted after


def test_a_failed_deletion_brings_the_view_back_whole_and_deletes_nothing(tmp_path: Path) -> None:
    world = start(tmp_path, Clock())
    stop = append(world, 9)
    view = publish_split(world, stop)

    def refuse(**_: object) -> None:
        raise OSError("disk full")

    world.data_dir.database.fault_points["compaction.manifest.write"] = refuse
    rest = world.topic.detach_view()
    assert world.topic.view is None
    with pytest.raises(OSError, match="disk full"):
        rest()
    del world.data_dir.database.fault_points["compaction.manifest.write"]
    assert world.topic.view is view
    assert persisted(world) == (view.ledger_id, view.ledger_ids, stop)
    assert set(view.ledger_ids) <= set(world.data_dir.ledgers.list())
    assert read_compacted(world.topic) == expected(world, stop)
    world.topic.drop_view()  # and it can still be dropped
    assert world.topic.view is None and not set(world.data_dir.ledgers.list()) & set(view.ledger_ids)


def test_a_crash_before_the_second_step_leaves_the_view_as_persisted(tmp_path: Path) -> None:
    clock = Clock()
    world = start(tmp_path, clock)
    stop = append(world, 9)
    view = publish_split(world, stop)
    world.topic.detach_view()  # the broker dies before its worker thread ran the rest
    kill(world)
    again = start(tmp_path, clock)
    assert again.topic.view is not None and again.topic.view.ledger_ids == view.ledger_ids
    assert read_compacted(again.topic) == expected(again, stop)


def test_a_topic_delete_and_a_second_drop_wait_for_a_drop_in_flight(tmp_path: Path) -> None:
    world = start(tmp_path, Clock())
    stop = append(world, 9)
    view = publish_split(world, stop)
    rest = world.topic.detach_view()
    second = world.topic.detach_view()
    second_done = threading.Event()

    def wait_then_drop() -> None:
        second()
        second_done.set()

    waiter = threading.Thread(target=wait_then_drop)
    waiter.start()
    assert not second_done.wait(0.3)  # bounded: the second waits for the first's transaction
    rest()
    assert second_done.wait(WAIT_S)
    waiter.join(WAIT_S)
    world.topic.delete()
    assert not set(world.data_dir.ledgers.list()) & set(view.ledger_ids)
    assert CursorStore(world.data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION) is None


def test_the_backlog_of_a_topic_without_cursor_starts_before_its_first_entry_and_opens_nothing(
        tmp_path: Path) -> None:
    world = start(tmp_path, Clock())
    stop = append(world, 9)
    publish_split(world, stop)
    assert world.topic.backlog_from == stop
    world.topic.drop_view()
    assert world.topic.backlog_from == world.ledger.first_position()
    assert CursorStore(world.data_dir.database).load(TOPIC, COMPACTION_SUBSCRIPTION) is None  # not reopened
