"""The broker indexes its sealed ledgers in the background, unless told not to (issue 12).

With ``compaction_key_index`` (the default) a topic's ledger sealed by a roll-over gets its
key index (``compactor.local.index_builds``), and at start the sealed ledgers that lack one are
indexed; ``stop`` ends the builds first, so that the seals of the stop queue nothing. With
``--no-compaction-key-index`` nothing is indexed (a run parses the ledgers).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from api.broker.admin_topics import TopicOperations
from api.broker.service import BrokerService
from api.config import Settings
from compactor.local.index_builds import INDEX_MIN_ENTRIES
from compactor.local.key_index import INDEX_SUFFIX, index_path, read_index
from ledger import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_writer import ledger_file_name
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from tests.unit.compactor.test_key_index import ledger_facts, reference_index, same_index

TOPIC = "persistent://public/default/key-index-builds"
DEADLINE_S = 60.0  # a worker process starts and indexes a ledger


def _settings(**overrides: object) -> Settings:
    chosen: dict[str, object] = {"compaction_monitor_interval_seconds": 0,
                                 "managed_ledger_max_entries_per_ledger": INDEX_MIN_ENTRIES, **overrides}
    return Settings(**chosen)  # type: ignore[arg-type]


def _entry(index: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=index, publish_time=1,
                                  partition_key=f"k{index % 17}")
    return encode_entry(metadata, b"v%d" % index, with_checksum=False)


def _fill(ledger: ManagedLedger, count: int) -> None:
    futures = [ledger.append(_entry(index)) for index in range(count)]
    for future in futures:
        future.result(timeout=10)


def _index_file(store: FileLedgerStore, ledger_id: int) -> str:
    return index_path(os.path.join(store.root, ledger_file_name(ledger_id)))


async def _indexed(store: FileLedgerStore, ledger_id: int) -> None:
    """Until ledger ``ledger_id``'s index is on disk (bounded), then check it is exact."""
    started = time.monotonic()
    while not os.path.exists(_index_file(store, ledger_id)):
        assert time.monotonic() - started < DEADLINE_S, f"ledger {ledger_id} was never indexed"
        await asyncio.sleep(0.02)
    read = read_index(_index_file(store, ledger_id), ledger_facts(store, ledger_id))
    assert read is not None and same_index(read, reference_index(store, ledger_id))


def test_a_rolled_over_ledger_is_indexed_by_the_broker(tmp_path: Path) -> None:
    async def main() -> None:
        data_dir = DataDir.open(str(tmp_path / "data"))
        broker = BrokerService(data_dir, _settings())
        broker.start_tasks()
        try:
            topic = broker.get_topic(TOPIC)
            _fill(topic.ledger, INDEX_MIN_ENTRIES + 3)  # the first ledger rolls over
            first = topic.ledger.ledger_list()[0]
            assert first.entries == INDEX_MIN_ENTRIES and not first.is_open
            store = data_dir.ledgers
            assert isinstance(store, FileLedgerStore)
            await _indexed(store, first.ledger_id)
            assert broker.key_indexes is not None and broker.key_indexes.pids()
        finally:
            await broker.stop()
        assert broker.key_indexes.pids() == []  # the worker process is gone with the stop
        data_dir.close()

    asyncio.run(main())


def test_a_ledger_sealed_by_an_unload_is_indexed(tmp_path: Path) -> None:
    async def main() -> None:
        data_dir = DataDir.open(str(tmp_path / "data"))
        broker = BrokerService(data_dir, _settings(managed_ledger_max_entries_per_ledger=10 * INDEX_MIN_ENTRIES))
        broker.start_tasks()
        try:
            topic = broker.get_topic(TOPIC)
            _fill(topic.ledger, INDEX_MIN_ENTRIES)
            current = topic.ledger.current_ledger_id
            await TopicOperations(broker.admin).unload(TOPIC)
            store = data_dir.ledgers
            assert isinstance(store, FileLedgerStore)
            await _indexed(store, current)
        finally:
            await broker.stop()
            data_dir.close()

    asyncio.run(main())


def test_a_start_indexes_the_sealed_ledgers_that_lack_an_index(tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path / "data"))
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata,
                                ManagedLedgerConfig(max_entries_per_ledger=INDEX_MIN_ENTRIES))
    _fill(ledger, 2 * INDEX_MIN_ENTRIES)
    ledger.close()  # two sealed ledgers, indexed by nobody: no broker ran
    sealed = [record.ledger_id for record in data_dir.metadata.topic_ledgers(TOPIC)]
    data_dir.close()

    async def main() -> None:
        reopened = DataDir.open(str(tmp_path / "data"))
        broker = BrokerService(reopened, _settings())
        broker.start_tasks()
        try:
            store = reopened.ledgers
            assert isinstance(store, FileLedgerStore)
            for ledger_id in sealed:
                await _indexed(store, ledger_id)
        finally:
            await broker.stop()
            reopened.close()

    asyncio.run(main())


def test_with_the_setting_off_no_ledger_is_indexed(tmp_path: Path) -> None:
    async def main() -> None:
        data_dir = DataDir.open(str(tmp_path / "data"))
        broker = BrokerService(data_dir, _settings(compaction_key_index=False))
        broker.start_tasks()
        try:
            assert broker.key_indexes is None
            topic = broker.get_topic(TOPIC)
            _fill(topic.ledger, 2 * INDEX_MIN_ENTRIES)
        finally:
            await broker.stop()
        store = data_dir.ledgers
        assert isinstance(store, FileLedgerStore)
        assert not [name for name in os.listdir(store.root) if name.endswith(INDEX_SUFFIX)]
        data_dir.close()

    asyncio.run(main())
