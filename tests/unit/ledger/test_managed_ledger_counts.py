"""The managed ledger's confirmed counts are exact while appends race roll-overs.

Completions arrive on the flusher thread while appends (and the roll-overs they trigger)
run on others; entries and bytes of each ledger must always describe the same confirmed
entries — the ones a read returns — and add up to what was acknowledged.
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import FileLedgerStore, SyncPolicy

TOPIC = "persistent://public/default/counts"
APPENDERS = 4
APPENDS_EACH = 160
IN_FLIGHT = 16  # appends each appender keeps in flight: group commits resolve many at once


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads every few bytecodes, so that a race window is hit, not just possible."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _check_counts_against_reads(ml: ManagedLedger, store: FileLedgerStore) -> None:
    """Every ledger of the list holds exactly the bytes of the entries it says it has."""
    for record in ml.ledger_list():
        if record.entries:
            entries = store.read(record.ledger_id, 0, record.entries - 1)
            assert sum(map(len, entries)) == record.size_bytes, record
        else:
            assert record.size_bytes == 0, record


@pytest.mark.usefixtures("frequent_thread_switches")
@pytest.mark.parametrize("max_entries_per_ledger", [3, 40, 200])
def test_confirmed_counts_are_exact_under_concurrent_appends_and_roll_overs(
    tmp_path: Path, max_entries_per_ledger: int
) -> None:
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    ml = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=max_entries_per_ledger))
    acknowledged: dict[Position, int] = {}
    failures: list[BaseException] = []
    done = threading.Event()

    def appender(number: int) -> None:
        try:
            for first in range(0, APPENDS_EACH, IN_FLIGHT):
                sent = []
                for i in range(first, first + IN_FLIGHT):
                    data = b"%d:%d:" % (number, i) + b"x" * ((number * 31 + i * 7) % 61)
                    sent.append((ml.append(data), len(data)))
                for future, size in sent:
                    acknowledged[future.result(timeout=30)] = size
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    checks = 0

    def checker() -> None:
        nonlocal checks
        try:
            while not done.is_set():
                _check_counts_against_reads(ml, store)
                checks += 1
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=appender, args=(n,)) for n in range(APPENDERS)]
    watcher = threading.Thread(target=checker)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    done.set()
    watcher.join(timeout=60)
    assert not failures, failures[0]
    assert checks > 0

    assert len(acknowledged) == APPENDERS * APPENDS_EACH
    assert ml.number_of_entries == len(acknowledged)
    assert ml.total_size == sum(acknowledged.values())
    by_ledger: dict[int, int] = defaultdict(int)
    for position, size in acknowledged.items():
        by_ledger[position.ledger_id] += size
    listed = {record.ledger_id: record.size_bytes for record in ml.ledger_list() if record.entries}
    assert listed == dict(by_ledger)
    for record in metadata.topic_ledgers(TOPIC)[:-1]:  # sealed ones: the metadata rows agree
        assert (record.entries, record.size_bytes) == (
            sum(1 for p in acknowledged if p.ledger_id == record.ledger_id), by_ledger[record.ledger_id])
    _check_counts_against_reads(ml, store)
    ml.close()
    store.shutdown()
    metadata.close()


def test_a_listener_sees_entries_and_bytes_of_the_same_confirmed_entries(tmp_path: Path) -> None:
    """A group commit confirms many entries at once; while their completions are handed
    out one by one, the counts never run ahead in entries and behind in bytes."""
    store = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    ml = ManagedLedger.open(TOPIC, store, metadata)
    seen: list[tuple[int, int]] = []
    ml.add_listener(lambda position: seen.append((ml.number_of_entries, ml.total_size)))
    futures = [ml.append(b"x" * (i + 1)) for i in range(200)]
    for future in futures:
        future.result(timeout=10)
    assert len(seen) == 200
    for entries, size in seen:
        assert size == sum(range(1, entries + 1)), (entries, size)
    store.shutdown()
    metadata.close()
