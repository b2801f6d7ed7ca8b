"""The compaction I/O throttle (``compactor.throttle``): a run over N bytes with a limit of
L bytes a second takes at least N / L.

The token bucket alone on a fake clock and sleeper (properties over charge sequences), then
a run through the runner on the fake pair (its figures report the time waited and the bytes
charged: every read batch and every append), then once on the real clock. Last, a broker
stop interrupts a throttled run instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactor.errors import CompactionInterruptedError
from compactor.runs.runner import CompactionConfig, Compactor
from compactor.runs.runs import CompactionRuns, RunJob
from compactor.runs.status import CompactionStatusStore
from compactor.throttle import Throttle
from compactor.view.topic import CompactedTopic
from cursor import CursorStore
from ledger import DataDir, ManagedLedger, ManagedLedgerConfig, MemoryLedgerStore, MetadataStore
from ledger.position import Position
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/throttled"


class FakeTime:
    """A clock that only moves when something sleeps (or a test advances it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


@given(st.lists(st.integers(0, 10_000), max_size=40), st.integers(1, 5_000))
def test_charging_n_bytes_takes_at_least_n_over_the_rate(sizes: list[int], rate: int) -> None:
    fake = FakeTime()
    start = fake.now
    throttle = Throttle(rate, clock=fake.clock, sleep=fake.sleep)
    for size in sizes:
        throttle.charge(size)
    assert fake.now - start >= sum(sizes) / rate - 1e-9
    assert fake.now - start == pytest.approx(sum(sizes) / rate)  # and waits no longer than that
    assert throttle.throttled_s == pytest.approx(fake.now - start)
    assert throttle.charged_bytes == sum(sizes)


def test_time_spent_elsewhere_counts_but_never_beyond_the_burst() -> None:
    fake = FakeTime()
    throttle = Throttle(100, burst_bytes=50, clock=fake.clock, sleep=fake.sleep)
    throttle.charge(100)  # starts empty: one second
    assert throttle.throttled_s == pytest.approx(1.0)
    fake.now += 10.0  # idle: the bucket refills, up to its burst of 50 bytes
    assert throttle.charge(50) == 0.0
    assert throttle.charge(100) == pytest.approx(1.0)


def test_a_limit_of_zero_never_waits_but_counts_the_bytes() -> None:
    fake = FakeTime()
    throttle = Throttle(0, clock=fake.clock, sleep=fake.sleep)
    assert throttle.charge(10**9) == 0.0
    assert fake.now == 1000.0 and throttle.throttled_s == 0.0 and throttle.charged_bytes == 10**9


def test_a_negative_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="rate"):
        Throttle(-1)


def message(key: str, value: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def topic_with(count: int) -> CompactedTopic:
    ml = ManagedLedger.open(TOPIC, MemoryLedgerStore(), MetadataStore(":memory:"),
                            ManagedLedgerConfig(max_entries_per_ledger=7))
    for index in range(count):
        ml.append(message(f"k{index % 5}", b"x" * 100)).result(timeout=10)
    return CompactedTopic.restore(ml, CursorStore(ml.metadata.database))


def test_a_throttled_run_takes_at_least_its_bytes_over_the_limit() -> None:
    fake = FakeTime()
    rate = 2_000
    compactor = Compactor(CompactionConfig(read_batch_entries=4),
                          throttle=lambda limit, **_: Throttle(limit, clock=fake.clock, sleep=fake.sleep))
    topic = topic_with(40)
    raw_bytes = sum(len(e.data) for e in topic.ledger.read_entries(Position(0, 0), 100, end=None))
    start = fake.now
    figures = compactor.compact(topic, max_bytes_per_second=rate)
    # Each raw entry is read twice (phase one, phase two); each survivor appended once.
    assert figures.io_bytes == 2 * raw_bytes + figures.bytes_written
    assert figures.throttled_s == pytest.approx(figures.io_bytes / rate)
    assert fake.now - start >= figures.io_bytes / rate - 1e-9
    assert topic.record.last_throttled_ms == int(figures.throttled_s * 1000)


def test_an_unlimited_run_reports_no_throttling() -> None:
    figures = Compactor().compact(topic_with(10))
    assert figures.throttled_s == 0.0 and figures.io_bytes > 0


def test_a_throttled_run_on_the_real_clock_takes_at_least_n_over_the_limit() -> None:
    topic = topic_with(30)
    rate = 40_000  # the run moves about 8 KB: at least 0.2 s
    started = time.monotonic()
    figures = Compactor().compact(topic, max_bytes_per_second=rate)
    elapsed = time.monotonic() - started
    assert figures.io_bytes / rate >= 0.15
    assert elapsed >= figures.io_bytes / rate
    assert figures.duration_s >= figures.io_bytes / rate
    assert figures.throttled_s > 0


def test_an_interrupt_ends_a_wait_at_once_and_fails_the_charge() -> None:
    interrupt = threading.Event()
    throttle = Throttle(1, interrupt=interrupt)  # one byte a second: 1000 bytes wait 1000 s
    threading.Timer(0.05, interrupt.set).start()
    started = time.monotonic()
    with pytest.raises(CompactionInterruptedError, match="stopping"):
        throttle.charge(1000)
    assert time.monotonic() - started < 30
    with pytest.raises(CompactionInterruptedError):
        throttle.charge(1)  # and every later wait


def test_a_broker_stop_fails_a_throttled_run_instead_of_waiting_for_it(tmp_path: Path) -> None:
    """``CompactionRuns.stop`` interrupts the throttle: the run ends as ERROR, its new
    ledger deleted, no view published; an unthrottled stop would wait about 2,000 s."""
    data_dir = DataDir.open(str(tmp_path / "data"))
    try:
        ml = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata, ManagedLedgerConfig())
        for index in range(20):
            ml.append(message(f"k{index % 5}", b"x" * 100)).result(timeout=10)
        topic = CompactedTopic.restore(ml, CursorStore(data_dir.database), create_cursor=True)
        statuses = CompactionStatusStore(data_dir.database)
        ledgers_before = set(data_dir.ledgers.list())

        async def body() -> None:
            runs = CompactionRuns(Compactor(), statuses, max_concurrent_runs=1)
            outcome = runs.request(RunJob(topic, max_bytes_per_second=1))
            async with asyncio.timeout(30):
                while not runs.running(TOPIC):
                    await asyncio.sleep(0.001)
                await runs.stop()
            with pytest.raises(CompactionInterruptedError):
                await outcome

        asyncio.run(body())
        status, error = statuses.compaction_status(TOPIC) or ("", "")
        assert status == "ERROR" and error.startswith("CompactionInterruptedError: ")
        assert topic.view is None
        assert set(data_dir.ledgers.list()) == ledgers_before  # no compacted ledger left behind
        ml.close()
    finally:
        data_dir.close()
