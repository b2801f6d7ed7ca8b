"""A corrupt entry on disk is never served to the real client, and never skipped.

A record of a sealed ledger is damaged after it was written (a stray write, bit rot): the
read of that entry fails its CRC32C check, dispatch of that subscription stops there, the
entries before it were delivered, the entries after it are not (skipping would lose a
message silently), other topics are served, and a seek past it moves the subscription on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.config import Settings
from ledger.storage.record import scan
from tests.integration.conftest import BrokerHarness
from tests.integration.wire.helpers import RECEIVE_MS, drain, unique_topic

pulsar = pytest.importorskip("pulsar")


@pytest.fixture
def small_ledgers(tmp_path: Path) -> Iterator[BrokerHarness]:
    harness = BrokerHarness(tmp_path / "data", dataclasses.replace(
        Settings(), managed_ledger_max_entries_per_ledger=2, compaction_monitor_interval_seconds=0))
    yield harness
    harness.close()


def _damage(data_dir: Path, ledger_id: int, entry_id: int) -> None:
    """Flip a payload byte of one record in place."""
    path = data_dir / "ledgers" / f"{ledger_id:020d}.ledger"
    offset = scan(path.read_bytes()).entry_offsets[entry_id] + 12
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 0x5A]), offset)
    finally:
        os.close(fd)


def test_a_corrupt_entry_stops_dispatch_there_and_a_seek_moves_past_it(
        small_ledgers: BrokerHarness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    topic, other = unique_topic("corrupt"), unique_topic("healthy")
    client = pulsar.Client(small_ledgers.url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(b"m%d" % i) for i in range(4)]  # ledgers: [m0 m1] [m2 m3] [open]
        assert ids[1].ledger_id() == ids[0].ledger_id() != ids[2].ledger_id()
        small_ledgers.restart()  # the ledgers are reopened from disk: nothing cached
        _damage(small_ledgers.path, ids[1].ledger_id(), ids[1].entry_id())

        consumer: Any = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        first = consumer.receive(RECEIVE_MS)
        assert first.data() == b"m0"
        consumer.acknowledge(first)
        assert drain(consumer) == []  # m1 is never served, and m2 is not served past it
        stalls = [r for r in caplog.records if "dispatch stopped" in r.getMessage()]
        assert [r.getMessage() for r in stalls if "CRC32C" in r.getMessage()] == [stalls[0].getMessage()], \
            "the stall is logged once, naming the failed check"
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"

        healthy = client.create_producer(other)
        reader = client.create_reader(other, pulsar.MessageId.earliest)
        healthy.send(b"fine")
        assert reader.read_next(RECEIVE_MS).data() == b"fine"  # the broker serves the rest

        consumer.seek(ids[2])  # moved past the damage (the client's seek excludes ids[2] itself)
        assert [m.data() for m in drain(consumer, 2_000)] == [b"m3"]
    finally:
        client.close()
