"""Key indexes of a real ``compactd serve``: built as ledgers are sealed, gone with them,
and whole across kill -9 (issue 12, points 1 and 6).

* ``test_sealed_ledgers_get_key_indexes_and_lose_them_with_their_topic`` — the real
  pulsar-client produces to a topic with small ledgers; every sealed ledger of at least
  ``INDEX_MIN_ENTRIES`` entries gets a ``.kidx`` file beside it (polled with a bound),
  exactly the index a parse of the ledger gives, written by a worker process of the
  broker, not by the broker; deleting the topic leaves no index file behind.
* ``test_a_broker_killed_while_it_indexes_restarts_and_compacts_as_the_reference`` — the
  broker is killed with SIGKILL at the first sign of an index being built; its index
  worker dies with it; the restarted broker serves, indexes the sealed ledgers that lack
  an index (temporary files of the killed build removed at start), and a compaction's
  read-compacted view is exactly the latest value of every key acknowledged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactor.local.index_builds import INDEX_MIN_ENTRIES
from compactor.local.key_index import INDEX_SUFFIX, TEMP_SUFFIX, index_path, read_index
from ledger.storage.base import LedgerState
from ledger.storage.file import FileLedgerStore
from ledger.storage.sealed_writer import ledger_file_name
from tests.integration.wire.helpers import wait_until
from tests.serve_process import ServeProcess
from tests.unit.compactor.test_key_index import ledger_facts, reference_index, same_index

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
WAIT_S = 60.0  # a worker process starts and indexes a few ledgers
FLAGS = ("--managed-ledger-max-entries-per-ledger", str(INDEX_MIN_ENTRIES),
         "--compaction-monitor-interval-seconds", "0")
KEYS = 150


def produce(url: str, topic: str, count: int) -> dict[str, bytes]:
    """``count`` keyed, non-batched messages (one entry each), every send acknowledged;
    the latest value of each key."""
    client = pulsar.Client(url, operation_timeout_seconds=30, logger=QUIET)
    latest: dict[str, bytes] = {}
    try:
        producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        results: list[Any] = []
        for index in range(count):
            key, value = f"key-{index % KEYS}", f"value-{index}".encode()
            producer.send_async(value, lambda result, _id: results.append(result), partition_key=key)
            latest[key] = value
        producer.flush()
        wait_until(lambda: len(results) == count, "every acknowledgement", WAIT_S)
        assert set(results) == {pulsar.Result.Ok}
        producer.close()
    finally:
        client.close()
    return latest


def sealed_ledgers(ledgers: Path) -> list[int]:
    """The sealed ledgers worth an index in the directory (read beside the broker)."""
    store = FileLedgerStore(str(ledgers), read_only=True)
    try:
        return [ledger_id for ledger_id in store.list()
                if (info := store.info(ledger_id)).state is LedgerState.CLOSED
                and info.last_add_confirmed + 1 >= INDEX_MIN_ENTRIES]
    finally:
        store.shutdown()


def indexed_exactly(ledgers: Path, ledger_ids: list[int]) -> bool:
    """Every one of ``ledger_ids`` has an index file, the very index a parse gives."""
    store = FileLedgerStore(str(ledgers), read_only=True)
    try:
        for ledger_id in ledger_ids:
            path = index_path(os.path.join(store.root, ledger_file_name(ledger_id)))
            index = read_index(path, ledger_facts(store, ledger_id))  # a torn one would raise
            if index is None:
                return False
            assert same_index(index, reference_index(store, ledger_id))
        return True
    finally:
        store.shutdown()


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            found |= {int(child) for child in listing.read().split()}
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[[], ServeProcess]]:
    processes: list[ServeProcess] = []

    def start() -> ServeProcess:
        process = ServeProcess(tmp_path / "data", tmp_path / f"serve-{len(processes)}.log", *FLAGS)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.running:
            assert process.terminate() == 0


def topic_path(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


@pytest.mark.slow
def test_sealed_ledgers_get_key_indexes_and_lose_them_with_their_topic(
    tmp_path: Path, started: Callable[[], ServeProcess],
) -> None:
    serve = started()
    ledgers = tmp_path / "data" / "ledgers"
    topic = "persistent://public/default/indexed"
    produce(serve.broker_url, topic, 3 * INDEX_MIN_ENTRIES + 40)
    sealed = sealed_ledgers(ledgers)
    assert len(sealed) == 3
    wait_until(lambda: indexed_exactly(ledgers, sealed), "an index of every sealed ledger", WAIT_S)
    workers = children(serve.process.pid)
    assert workers and serve.process.pid not in workers  # built in a worker process

    with httpx.Client(base_url=serve.http_url, timeout=WAIT_S) as http:
        assert http.delete(topic_path(topic)).status_code == 204
    wait_until(lambda: not [
        name for name in os.listdir(ledgers) if name.endswith((INDEX_SUFFIX, TEMP_SUFFIX))],
        "no index file left", WAIT_S)
    assert not [name for name in os.listdir(ledgers) if name.endswith(".ledger")]


@pytest.mark.slow
def test_a_broker_killed_while_it_indexes_restarts_and_compacts_as_the_reference(
    tmp_path: Path, started: Callable[[], ServeProcess],
) -> None:
    serve = started()
    ledgers = tmp_path / "data" / "ledgers"
    topic = "persistent://public/default/killed-indexing"
    latest = produce(serve.broker_url, topic, 6 * INDEX_MIN_ENTRIES)

    def building() -> bool:
        return any(name.endswith((INDEX_SUFFIX, TEMP_SUFFIX)) for name in os.listdir(ledgers))

    wait_until(building, "a first index build", WAIT_S)
    workers = children(serve.process.pid)
    serve.kill()
    wait_until(lambda: not any(alive(pid) for pid in workers),
               "the index worker to die with the broker", WAIT_S)
    sealed = sealed_ledgers(ledgers)
    assert len(sealed) == 6
    left = os.listdir(ledgers)
    for name in left:  # what the kill left: no index, a temporary file, or a whole index
        if name.endswith(INDEX_SUFFIX):
            assert indexed_exactly(ledgers, [int(name.split(".")[0])])

    serve = started()
    assert not set(os.listdir(ledgers)) & {name for name in left if name.endswith(TEMP_SUFFIX)}  # removed at start
    wait_until(lambda: indexed_exactly(ledgers, sealed),
               "an index of every sealed ledger after the restart", WAIT_S)
    with httpx.Client(base_url=serve.http_url, timeout=WAIT_S) as http:
        assert http.put(topic_path(topic) + "/compaction").status_code == 204

        def compacted() -> bool:
            status = http.get(topic_path(topic) + "/compaction").json()
            assert status["status"] != "ERROR", status
            return bool(status["status"] == "SUCCESS")

        wait_until(compacted, "the compaction", WAIT_S)
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=30, logger=QUIET)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        seen: dict[str, bytes] = {}
        count = 0
        while reader.has_message_available():
            message = reader.read_next(10_000)
            seen[message.partition_key()] = message.data()
            count += 1
        reader.close()
    finally:
        client.close()
    assert seen == latest
    assert count == KEYS  # one message a key: the compacted view, no raw tail
