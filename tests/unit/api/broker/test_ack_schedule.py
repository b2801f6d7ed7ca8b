"""A subscription's acknowledgements never commit on the event loop; closing persists them.

A real broker core (``BrokerService``) over a real data dir; the consumer is in memory.
Which thread commits each cursor write is seen through the database's fault points
(``cursor.save.before``, ``cursor.save_batch.before``), which run on the writing thread.
With the default schedule, acks are committed by the cursor store's background thread,
within the interval; with ``managed_ledger_mark_delete_rate_limit = 0`` they are written
at once, by that thread too (before issue 12 each one committed on the loop). Closing the
topic makes what is queued due now and its future resolves once it is written.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from api.broker.dispatch import Consumer, Delivery, SubType
from api.broker.service import BrokerService
from api.config import Settings
from cursor.cursor import InitialPosition
from ledger.data_dir import DataDir
from ledger.position import Position
from ledger.storage.base import SyncPolicy

TOPIC = "persistent://public/default/ack-schedule"
ENTRIES = 300
BOUND_S = 10.0


class _Consumer(Consumer):
    def __init__(self) -> None:
        super().__init__(1, "c")
        self.received: list[Delivery] = []

    def send(self, delivery: Delivery) -> None:
        self.received.append(delivery)


def _watch_writes(data_dir: DataDir) -> list[str]:
    """The names of the threads that begin cursor writes, in order."""
    threads: list[str] = []
    for point in ("cursor.save.before", "cursor.save_batch.before"):
        data_dir.database.fault_points[point] = lambda **_: threads.append(threading.current_thread().name)
    return threads


def _run(tmp_path: Path, settings: Settings) -> tuple[list[str], list[str], bool, bool]:
    """Ack every entry individually on the loop; the writing threads during the acks and
    after, whether the persisted state caught up within the bound, and whether closing the
    topic left it equal to memory."""
    data_dir = DataDir.open(str(tmp_path / "data"), sync=SyncPolicy.NONE)

    async def main() -> tuple[list[str], list[str], bool, bool]:
        service = BrokerService(data_dir, settings)
        service.loop = asyncio.get_running_loop()
        topic = service.get_topic(TOPIC)
        consumer = _Consumer()
        subscription = topic.subscribe("sub", consumer, SubType.SHARED, initial_position=InitialPosition.EARLIEST)
        positions = [topic.ledger.append(b"e%d" % i).result(timeout=30) for i in range(ENTRIES)]
        threads = _watch_writes(data_dir)
        for position in positions[: ENTRIES // 2]:
            subscription.acknowledge([position], cumulative=False)
        during = list(threads)
        deadline = time.monotonic() + BOUND_S
        caught_up = True
        while _persisted(service) != subscription.cursor.mark_delete_position:
            if time.monotonic() > deadline:
                caught_up = False
                break
            await asyncio.sleep(0.01)
        for position in positions[ENTRIES // 2:]:
            subscription.acknowledge([position], cumulative=False)
        await asyncio.wrap_future(topic.close())
        closed_equal = _persisted(service) == positions[-1] == subscription.cursor.mark_delete_position
        service.cursors.close()
        service.compactor.close()
        return during, threads, caught_up, closed_equal

    try:
        return asyncio.run(main())
    finally:
        data_dir.close()


def _persisted(service: BrokerService) -> Position | None:
    record = service.cursors.load_persisted(TOPIC, "sub")
    return None if record is None else record.mark_delete_position


def test_acks_are_committed_off_the_event_loop_within_the_interval_and_closing_persists_them(tmp_path: Path) -> None:
    during, threads, caught_up, closed_equal = _run(tmp_path, Settings(managed_ledger_mark_delete_rate_limit=5.0))
    loop_thread = threading.current_thread().name
    assert during.count(loop_thread) == 0  # 150 acks, no commit on the loop
    assert caught_up, "the background writer did not persist the acks within the bound"
    assert closed_equal  # the topic's close wrote what was queued
    assert threads.count(loop_thread) == 0  # the close's flush too is the writer thread's
    background = [name for name in threads if name != loop_thread]
    assert set(background) == {"cursor-persist"}
    assert len(background) <= 2 + BOUND_S * 5  # one commit per interval at most: not one per ack (300)


def test_with_no_rate_limit_each_ack_is_written_at_once_off_the_event_loop(tmp_path: Path) -> None:
    """No rate limit: nothing waits for an interval, and still nothing commits on the loop."""
    during, threads, caught_up, closed_equal = _run(tmp_path, Settings(managed_ledger_mark_delete_rate_limit=0))
    loop_thread = threading.current_thread().name
    assert loop_thread not in during and loop_thread not in threads
    assert set(threads) == {"cursor-persist"}
    assert caught_up and closed_equal
