"""Topics load and unload off the event loop (``BrokerService.load_topic``, ``unload_topic``):
one load per name, shared by concurrent callers; a load racing an unload waits for the seal
and opens the topic again; refusals are the same as the synchronous ``get_topic``'s."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from api.broker.errors import NotAllowedError, TopicNotFoundError
from api.broker.service import BrokerService
from api.broker.topic import Topic
from api.config import Settings
from compactor.encoder import encode_entry
from compactor.proto import pulsar_api_pb2 as pb
from ledger import DataDir
from ledger.managed_ledger import ManagedLedger

TOPIC = "persistent://public/default/loaded"


def _run(path: Path, body: Callable[[BrokerService], Awaitable[None]]) -> None:
    async def main() -> None:
        data_dir = DataDir.open(str(path))
        broker = BrokerService(data_dir, Settings(compaction_monitor_interval_seconds=0))
        broker.loop = asyncio.get_running_loop()
        try:
            await body(broker)
        finally:
            await broker.stop()
            data_dir.close()

    asyncio.run(main())


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
        assert all(topic is topics[0] for topic in topics) and broker.topics[TOPIC] is topics[0]
        assert len(opened_on) == 1 and opened_on[0].startswith("topic-load"), opened_on
        assert await broker.load_topic(TOPIC) is topics[0] and broker.loading == {}

    _run(tmp_path, body)


def test_a_load_racing_an_unload_waits_for_the_seal_then_opens_the_topic_again(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        first = await broker.load_topic(TOPIC)
        stored = await asyncio.wrap_future(first.ledger.append(_entry(b"kept")))
        unloading = asyncio.ensure_future(broker.unload_topic(first))
        await asyncio.sleep(0)  # the unload has started: the topic is out of the registry
        assert TOPIC not in broker.topics and TOPIC in broker.closing
        with pytest.raises(NotAllowedError):
            broker.get_topic(TOPIC)  # the loop never waits for a seal: a sync load is refused
        again = await broker.load_topic(TOPIC)
        assert unloading.done() and first.closed  # the load started once the seal had ended
        assert again is not first and broker.topics[TOPIC] is again
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
        broker.deleting.add(TOPIC)
        with pytest.raises(NotAllowedError):
            await broker.load_topic(TOPIC)
        broker.deleting.clear()
        assert isinstance(await broker.load_topic(TOPIC), Topic) and broker.loading == {}

    _run(tmp_path, body)


def test_a_sync_load_during_an_unload_and_its_waiting_reload_is_refused_not_deadlocked(tmp_path: Path) -> None:
    async def body(broker: BrokerService) -> None:
        first = await broker.load_topic(TOPIC)
        unloading = asyncio.ensure_future(broker.unload_topic(first))
        await asyncio.sleep(0)
        reloading = asyncio.ensure_future(broker.load_topic(TOPIC))
        await asyncio.sleep(0)  # the reload waits, on its thread, for the close the loop ends
        assert TOPIC in broker.loading
        with pytest.raises(NotAllowedError):
            broker.get_topic(TOPIC)  # waiting here would hold the loop the close needs
        again = await asyncio.wait_for(reloading, 10)
        assert unloading.done() and again is broker.topics[TOPIC] and again is not first

    _run(tmp_path, body)
