"""Topics load and unload off the event loop (``BrokerService.load_topic``, ``unload_topic``):
one load per name, shared by concurrent callers; a load racing an unload waits for the seal
and opens the topic again; refusals are the same as the synchronous ``get_topic``'s."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from api.broker import dedup as dedup_module
from api.broker.errors import NotAllowedError, TopicNotFoundError
from api.broker.off_loop import submit_off_loop
from api.broker.service import BrokerService
from api.broker.topic import Topic
from api.broker.topic_name import TopicName
from api.broker.topic_state import Phase
from api.config import Settings
from compactor.runs.runner import Compactor
from compactor.view.topic import COMPACTION_SUBSCRIPTION
from ledger.managed_ledger import ManagedLedger
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.broker.test_admin import _with_broker

TOPIC = "persistent://public/default/loaded"


def _run(path: Path, body: Callable[[BrokerService], Awaitable[None]]) -> None:
    asyncio.run(_with_broker(path, body, Settings(compaction_monitor_interval_seconds=0)))


def _entry(value: bytes) -> bytes:
    return encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), value,
                        with_checksum=False)


def test_concurrent_loaders_share_one_load_made_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened_on: list[str] = []
    real_open = ManagedLedger.open

    def counted_open(*args: object, **kwargs: object) -> ManagedLedger:
        opened_on.append(threading.current_thread().name)
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ManagedLedger, "open", counted_open)

    async def body(broker: BrokerService) -> None:
        topics = await asyncio.gather(*(broker.load_topic(TOPIC) for _ in range(5)))
        assert all(topic is topics[0] for topic in topics) and broker.registry.loaded[TOPIC] is topics[0]
        assert len(opened_on) == 1 and opened_on[0].startswith("topic-load"), opened_on
        assert await broker.load_topic(TOPIC) is topics[0] and broker.registry.loading_topics() == []

    _run(tmp_path, body)


def test_a_load_racing_an_unload_waits_for_the_seal_then_opens_the_topic_again(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        first = await broker.load_topic(TOPIC)
        stored = await asyncio.wrap_future(first.ledger.append(_entry(b"kept")))
        unloading = asyncio.ensure_future(broker.unload_topic(first))
        await asyncio.sleep(0)  # the unload has started: the topic is out of the registry
        assert TOPIC not in broker.registry.loaded and broker.registry.phase(TOPIC) is Phase.CLOSING
        with pytest.raises(NotAllowedError):
            broker.get_topic(TOPIC)  # the loop never waits for a seal: a sync load is refused
        again = await broker.load_topic(TOPIC)
        assert unloading.done() and first.closed  # the load started once the seal had ended
        assert again is not first and broker.registry.loaded[TOPIC] is again
        assert again.ledger.read_entries(stored, 1)[0].data == _entry(b"kept")
        await asyncio.wrap_future(again.ledger.append(_entry(b"after")))  # the new ledger takes appends
        assert again.ledger.current_ledger_id > stored.ledger_id

    _run(tmp_path, body)


def test_a_load_is_refused_as_get_topic_refuses(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        with pytest.raises(TopicNotFoundError):
            await broker.load_topic(TOPIC, create=False)
        with pytest.raises(TopicNotFoundError):
            await broker.load_topic("persistent://public/missing/t")  # its namespace does not exist
        async with broker.registry.holding([TOPIC]):  # as a partitioned parent's delete holds it
            with pytest.raises(NotAllowedError):
                await broker.load_topic(TOPIC)
        assert isinstance(await broker.load_topic(TOPIC), Topic) and broker.registry.loading_topics() == []

    _run(tmp_path, body)


def test_a_sync_load_during_an_unload_and_its_waiting_reload_is_refused_not_deadlocked(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        first = await broker.load_topic(TOPIC)
        unloading = asyncio.ensure_future(broker.unload_topic(first))
        await asyncio.sleep(0)
        reloading = asyncio.ensure_future(broker.load_topic(TOPIC))
        await asyncio.sleep(0)  # the reload waits, on its thread, for the close the loop ends
        assert broker.registry.is_loading(TOPIC)
        with pytest.raises(NotAllowedError):
            broker.get_topic(TOPIC)  # waiting here would hold the loop the close needs
        again = await asyncio.wait_for(reloading, 10)
        assert unloading.done() and again is broker.registry.loaded[TOPIC] and again is not first

    _run(tmp_path, body)


def test_a_partitioned_delete_waits_for_a_partition_load_in_flight_and_deletes_it_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's first PRODUCER on a partition is loading (creating its first ledger) when
    the parent is deleted: the delete waits for the load, then deletes the loaded partition
    (rows and ledger); before, it forgot the rows under the load's feet and left a loaded
    partition whose acknowledged appends a restart lost."""
    parent = "persistent://public/default/parted"
    first = parent + "-partition-0"
    go = threading.Event()
    real_open = ManagedLedger.open

    def held_open(*args: object, **kwargs: object) -> ManagedLedger:
        assert go.wait(10)
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    async def body(broker: BrokerService) -> None:
        broker.partitioned.create(broker.admin, parent, 2)
        monkeypatch.setattr(ManagedLedger, "open", held_open)
        load = asyncio.ensure_future(broker.load_topic(first))
        await asyncio.sleep(0)
        deleting = asyncio.ensure_future(broker.partitioned.delete(broker.admin, parent))
        await asyncio.sleep(0.05)
        assert not deleting.done()  # waits for the load
        go.set()
        await asyncio.wait_for(load, 10)
        await asyncio.wait_for(deleting, 10)
        assert first not in broker.registry.loaded and not broker.data_dir.metadata.topic_exists(first)
        assert broker.data_dir.metadata.topic_ledgers(first) == []
        assert not broker.partitioned.is_parent(TopicName.parse(parent)) and not broker.registry.deleting(first)
    _run(tmp_path, body)


def test_a_sync_load_on_the_loop_never_waits_and_a_load_after_an_unload_holds_no_load_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loads waiting for unloads to end (which only the loop ends) hold none of the
    ``topic-load`` threads, so a fifth topic's load goes on; a synchronous ``get_topic`` on
    the loop during a load is refused, never waited for (it would block the loop that the
    loads wait for). Four unloads in flight are held in their seals."""
    names = [f"persistent://public/default/t{i}" for i in range(5)]
    real_close = Topic.close_off_loop
    held = asyncio.Event()

    async def held_close(self: Topic) -> None:
        if str(self.name) in names[:4]:
            await held.wait()
        await real_close(self)

    async def body(broker: BrokerService) -> None:
        for name in names:
            await broker.unload_topic(await broker.load_topic(name))  # they exist, unloaded
        monkeypatch.setattr(Topic, "close_off_loop", held_close)
        unloads = [asyncio.ensure_future(broker.unload_topic(await broker.load_topic(name))) for name in names[:4]]
        await asyncio.sleep(0)  # four seals still running
        reloads = [asyncio.ensure_future(broker.load_topic(name)) for name in names[:4]]
        fifth = asyncio.ensure_future(broker.load_topic(names[4]))
        await asyncio.sleep(0)
        with pytest.raises(NotAllowedError):
            broker.get_topic(names[4], create=False)
        await asyncio.wait_for(fifth, 10)  # loaded while the four closes still run
        assert not any(reload.done() for reload in reloads)
        held.set()
        await asyncio.wait_for(asyncio.gather(*reloads, *unloads), 10)
        assert all(name in broker.registry.loaded for name in names)
    _run(tmp_path, body)


def test_a_deduplication_policy_set_while_a_topic_loads_applies_to_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go = threading.Event()
    real_init = Topic.__init__

    def held_init(self: Topic, *args: object, **kwargs: object) -> None:
        assert go.wait(10)  # the load read the policy already
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    async def body(broker: BrokerService) -> None:
        monkeypatch.setattr(Topic, "__init__", held_init)
        load = asyncio.ensure_future(broker.load_topic(TOPIC))
        await asyncio.sleep(0.05)
        policy = asyncio.ensure_future(broker.admin.set_policy("public/default", "deduplicationEnabled", True))
        await asyncio.sleep(0.05)
        assert not policy.done()  # the answer waits for the load, then switches it
        go.set()
        topic = await asyncio.wait_for(load, 10)
        await asyncio.wait_for(policy, 10)
        assert topic.dedup is not None
    _run(tmp_path, body)


def test_a_topic_deleted_while_deduplication_starts_leaves_no_cursor_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go = threading.Event()
    real_init = dedup_module.Deduplication.__init__

    def held_init(self: dedup_module.Deduplication, *args: object, **kwargs: object) -> None:
        assert go.wait(10)
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    async def body(broker: BrokerService) -> None:
        topic = await broker.load_topic(TOPIC)
        monkeypatch.setattr(dedup_module.Deduplication, "__init__", held_init)
        switched = topic.switch_deduplication(True)
        deleting = asyncio.ensure_future(broker.admin.delete_topic(TOPIC))
        await asyncio.sleep(0.05)
        assert not deleting.done()  # waits for the start
        go.set()
        await asyncio.wait_for(asyncio.gather(switched, deleting), 10)
        assert broker.cursors.list(TOPIC) == [] and not broker.data_dir.metadata.topic_exists(TOPIC)
    _run(tmp_path, body)


def test_an_unload_waits_for_a_compaction_subscription_delete_in_flight_and_the_reload_has_no_view(
        tmp_path: Path) -> None:
    """The view leaves memory at once; its transaction waits on the metadata writer thread
    (held here by an earlier write). Unloading meanwhile must wait for it, or the reload
    would restore the view whose rows and files are about to be deleted."""
    gate = threading.Event()

    async def body(broker: BrokerService) -> None:
        topic = await broker.load_topic(TOPIC)
        for index in range(6):
            metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=1,
                                          partition_key=f"k{index % 2}")
            await asyncio.wrap_future(topic.ledger.append(encode_entry(metadata, b"v", with_checksum=False)))
        await asyncio.to_thread(Compactor().compact, topic.compacted)
        view = topic.compacted.view
        assert view is not None
        held = submit_off_loop(lambda: gate.wait(10))  # the writer thread is busy
        deleting = topic.delete_subscription(COMPACTION_SUBSCRIPTION)
        assert topic.compacted.view is None and not deleting.done()
        unloading = asyncio.ensure_future(broker.unload_topic(topic))
        done, _ = await asyncio.wait({unloading}, timeout=0.3)
        assert not done  # bounded: the seal waits for the deletion
        gate.set()
        await asyncio.wait_for(asyncio.gather(unloading, asyncio.wrap_future(deleting), asyncio.wrap_future(held)), 10)
        again = await broker.load_topic(TOPIC)
        assert again.compacted.view is None
        assert again.compacted.backlog_from == again.ledger.first_position()  # the cursor made anew at load
        assert not set(view.ledger_ids) & set(broker.data_dir.ledgers.list())

    try:
        _run(tmp_path, body)
    finally:
        gate.set()


def test_a_stop_while_a_load_waits_for_an_unload_refuses_the_load_and_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The load waiting for a close is refused once the stop began (the lifecycle row
    ``reopening --Closed, stopping--> Forget``): neither it nor the stop waits forever."""
    real_close = Topic.close_off_loop
    held = asyncio.Event()

    async def held_close(self: Topic) -> None:
        await held.wait()
        await real_close(self)

    async def body(broker: BrokerService) -> None:
        first = await broker.load_topic(TOPIC)
        monkeypatch.setattr(Topic, "close_off_loop", held_close)
        unloading = asyncio.ensure_future(broker.unload_topic(first))
        await asyncio.sleep(0)
        reloading = asyncio.ensure_future(broker.load_topic(TOPIC))
        await asyncio.sleep(0)
        assert broker.registry.phase(TOPIC) is Phase.REOPENING
        stopping = asyncio.ensure_future(broker.registry.stop())
        await asyncio.sleep(0)
        held.set()
        await asyncio.wait_for(asyncio.gather(stopping, unloading), 10)
        with pytest.raises(NotAllowedError, match="stopping"):
            await asyncio.wait_for(reloading, 10)
        assert broker.registry.phase(TOPIC) is None and broker.registry.get(TOPIC) is None
    _run(tmp_path, body)
