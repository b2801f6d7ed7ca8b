"""10,000 topics in one broker core under a 1,024-descriptor limit (no sockets).

Each loaded topic holds a managed ledger, the ``__compaction`` cursor, the
de-duplication state and its compacted view; none of them may hold a file descriptor of
its own while idle: ledger files are bounded by ``max_open_ledger_files``, everything
else lives in the one SQLite database. The child process lowers its real descriptor
limit with ``setrlimit`` and publishes to every topic through ``BrokerService``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.ledger.test_many_ledgers import run_under_the_limit

CHILD = r"""
import asyncio, os, resource, sys
from api.broker.dedup import ProducerSession
from api.broker.service import BrokerService
from api.config import Settings
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb
from ledger import DataDir

root, topics, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
settings = Settings(data_dir=root, compaction_monitor_interval_seconds=0)
peak = 0

def descriptors():
    global peak
    count = len(os.listdir("/proc/self/fd"))
    peak = max(peak, count)
    assert count <= baseline + settings.max_open_ledger_files + 16, count
    return count

def entry(i, round_):
    metadata = pb.MessageMetadata(producer_name=f"producer-{i}", sequence_id=round_, publish_time=1)
    return encode_entry(metadata, b"topic %d round %d" % (i, round_), with_checksum=False)

def name(i):
    return f"persistent://public/default/many-{i}"

async def publish_all(broker, indexes, round_):
    futures = []
    for i in indexes:
        futures.append((i, broker.get_topic(name(i)).publish(ProducerSession(), f"producer-{i}", round_, round_, entry(i, round_))))
        if i % 500 == 0:
            descriptors()
    for i, future in futures:
        position = await asyncio.wrap_future(future)
        assert position.entry_id >= 0, (i, position)
    descriptors()

def read_all(broker, indexes, rounds):
    for i in indexes:
        ledger = broker.get_topic(name(i)).ledger
        data = [e.data for e in ledger.read_entries(ledger.first_position(), 100)]
        assert data == [entry(i, r) for r in range(rounds)], i
    descriptors()

async def run(indexes, first_round, rounds):
    data_dir = DataDir.open(root, max_open_files=settings.max_open_ledger_files)
    broker = BrokerService(data_dir, settings)
    broker.loop = asyncio.get_running_loop()
    try:
        read_all(broker, indexes, first_round)
        for round_ in range(first_round, rounds):
            await publish_all(broker, indexes, round_)
        read_all(broker, indexes, rounds)
    finally:
        await broker.stop()
        data_dir.close()

baseline = len(os.listdir("/proc/self/fd"))
asyncio.run(run(range(topics), 0, 2))
asyncio.run(run(range(0, topics, 9), 2, 3))  # a restart: the topics load again, from disk
print("peak descriptors", peak, "baseline", baseline)
"""


@pytest.mark.slow
def test_ten_thousand_topics_publish_and_read_back_under_a_limit_of_1024_descriptors(tmp_path: Path) -> None:
    run_under_the_limit(CHILD, tmp_path)
