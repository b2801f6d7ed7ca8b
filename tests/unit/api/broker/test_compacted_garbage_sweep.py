"""The broker keeps a replaced compacted view's ledgers for
``compacted_ledger_grace_period_s`` and its periodic sweep (off the event loop) deletes
them once it is over (issue 13, point 1)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from api.broker import service as service_module
from api.broker.service import BrokerService
from api.config import Settings
from ledger import DataDir
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/garbage-sweep"
GRACE_S = 0.5
DEADLINE_S = 10.0


def entry(key: str, value: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return encode_entry(metadata, value, with_checksum=False)


def test_the_broker_sweeps_a_replaced_view_after_the_grace_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "GARBAGE_SWEEP_INTERVAL_S", 0.05)

    async def main() -> None:
        data_dir = DataDir.open(str(tmp_path / "data"))
        broker = BrokerService(data_dir, Settings(compaction_monitor_interval_seconds=0,
                                                  compacted_ledger_grace_period_s=GRACE_S))
        broker.start_tasks()
        try:
            topic = broker.get_topic(TOPIC)
            topic.ledger.append(entry("a", b"1")).result(timeout=10)
            await broker.compact(TOPIC)
            old = topic.compacted.view
            assert old is not None
            topic.ledger.append(entry("a", b"2")).result(timeout=10)
            replaced_at = time.monotonic()
            await broker.compact(TOPIC)
            assert topic.compacted.view is not None and topic.compacted.view is not old
            assert old.ledger_id in data_dir.ledgers.list()  # kept: the grace period runs
            assert [e.data for e in old.iter_all()] == [entry("a", b"1")]
            while old.ledger_id in data_dir.ledgers.list():
                assert time.monotonic() - replaced_at < DEADLINE_S, "the sweep never deleted the old view"
                await asyncio.sleep(0.02)
            assert time.monotonic() - replaced_at >= GRACE_S * 0.9  # not before the grace period
            assert topic.compacted.view.ledger_id in data_dir.ledgers.list()
        finally:
            await broker.stop()
            data_dir.close()

    asyncio.run(main())
