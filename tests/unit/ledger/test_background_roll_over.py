"""A roll-over in the background never blocks the appender, and changes nothing else.

With ``roll_over_in_background`` (how the broker opens its topics) the seal of a full
ledger and the creation of the next one run on a thread of their own; appends that arrive
meanwhile wait in memory and go to the new ledger in order. A slow roll-over is the fault
here: the real disk cannot be slow on cue, so ``GatedStore`` holds a ledger's seal until
the test opens the gate. Trimming on another thread while a read is under way is shown too:
the read skips what was trimmed, as reads skip trimmed ledgers anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import LedgerFencedError, LedgerIOError
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import (
    FaultyLedgerStore,
    FileLedgerStore,
    LedgerStore,
    MemoryLedgerStore,
    SyncPolicy,
)

TOPIC = "persistent://public/default/rolling"
BOUND_S = 10


class GatedStore:
    """A store whose ``close`` (the seal) waits for ``gate``; ``on_read`` runs before each
    read; ``deleted_on`` names the thread of each delete."""

    def __init__(self, inner: LedgerStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.sealing = threading.Event()
        self.on_read: Any = None
        self.deleted_on: list[str] = []  # the thread of each delete

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def delete(self, ledger_id: int) -> None:
        self.deleted_on.append(threading.current_thread().name)
        self.inner.delete(ledger_id)

    def close(self, ledger_id: int) -> None:
        self.sealing.set()
        assert self.gate.wait(BOUND_S), "the test never opened the gate"
        self.inner.close(ledger_id)

    def read(self, ledger_id: int, first: int, last: int) -> Sequence[bytes]:
        if self.on_read is not None:
            hook, self.on_read = self.on_read, None
            hook()
        return self.inner.read(ledger_id, first, last)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[GatedStore, MetadataStore]]:
    store = GatedStore(FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP))
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    yield store, metadata
    store.inner.shutdown()
    metadata.close()


def _open(store: Any, metadata: MetadataStore, entries: int) -> ManagedLedger:
    config = ManagedLedgerConfig(max_entries_per_ledger=entries, roll_over_retry_ms=0)  # each append retries
    return ManagedLedger.open(TOPIC, store, metadata, config, roll_over_in_background=True)


def _append_on_a_thread(managed: ManagedLedger, data: bytes) -> tuple[threading.Event, list[Future[Position]]]:
    returned = threading.Event()
    futures: list[Future[Position]] = []

    def append() -> None:
        futures.append(managed.append(data))
        returned.set()

    threading.Thread(target=append, daemon=True).start()
    return returned, futures


def test_appends_during_a_slow_roll_over_return_at_once_and_land_in_the_next_ledger_in_order(
    parts: tuple[GatedStore, MetadataStore],
) -> None:
    store, metadata = parts
    managed = _open(store, metadata, entries=3)
    first = managed.ledger_list()[0].ledger_id
    store.gate.clear()
    filled = [managed.append(b"m%d" % i) for i in range(3)]  # the third fills the ledger
    assert store.sealing.wait(BOUND_S), "filling the ledger started no roll-over"
    returned, futures = _append_on_a_thread(managed, b"m3")
    assert returned.wait(BOUND_S), "an append blocked on the roll-over's seal"
    more = [managed.append(b"m%d" % i) for i in range(4, 6)]
    assert not futures[0].done(), "an append reported durable before its ledger existed"
    store.gate.set()
    positions = [f.result(BOUND_S) for f in [*filled, futures[0], *more]]
    assert positions[:3] == [Position(first, 0), Position(first, 1), Position(first, 2)]
    second = positions[3].ledger_id
    assert second > first
    assert positions[3:] == [Position(second, 0), Position(second, 1), Position(second, 2)]
    managed.close()
    records = metadata.topic_ledgers(TOPIC)
    assert records[0].entries == 3 and not records[0].is_open, "the full ledger holds exactly what filled it"
    read = managed_read_all(store, metadata)
    assert read == [b"m%d" % i for i in range(6)]


def managed_read_all(store: Any, metadata: MetadataStore) -> list[bytes]:
    reopened = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig())
    entries = reopened.read_entries(reopened.first_position(), 1000)
    reopened.close()
    return [entry.data for entry in entries]


def test_close_during_a_roll_over_waits_for_it_and_keeps_every_waiting_append(
    parts: tuple[GatedStore, MetadataStore],
) -> None:
    store, metadata = parts
    managed = _open(store, metadata, entries=2)
    store.gate.clear()
    futures = [managed.append(b"a"), managed.append(b"b")]
    assert store.sealing.wait(BOUND_S)
    futures.append(managed.append(b"c"))
    closer = threading.Thread(target=managed.close, daemon=True)
    closer.start()
    store.gate.set()
    closer.join(BOUND_S)
    assert not closer.is_alive(), "close never returned"
    assert all(f.result(BOUND_S) for f in futures)
    assert all(not record.is_open for record in metadata.topic_ledgers(TOPIC)), "close left a ledger open"
    assert managed_read_all(store, metadata) == [b"a", b"b", b"c"]


def test_a_roll_over_that_fails_in_the_background_never_leaves_an_append_waiting(tmp_path: Path) -> None:
    faulty = FaultyLedgerStore(MemoryLedgerStore())
    metadata = MetadataStore(":memory:")
    managed = _open(faulty, metadata, entries=2)
    faulty.fail_on("create", times=2)  # the background creation, then the first retry
    futures = [managed.append(b"x%d" % i) for i in range(5)]
    outcomes = []
    for future in futures:
        try:
            outcomes.append(future.result(BOUND_S))
        except LedgerIOError:
            outcomes.append(None)
    assert outcomes[0] is not None and outcomes[1] is not None, "entries durable before the roll-over are kept"
    assert any(outcome is not None for outcome in outcomes[2:]), "the topic never recovered"
    stored = [p for p in outcomes if p is not None]
    assert stored == sorted(stored), "positions went backwards"
    assert managed.append(b"after").result(BOUND_S) > stored[-1]
    managed.close()


@settings(max_examples=25, deadline=None)
@given(entries=st.integers(1, 4), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=40))
def test_every_append_is_stored_once_in_order_and_every_full_ledger_holds_exactly_its_limit(
    entries: int, sizes: list[int]
) -> None:
    store = MemoryLedgerStore()
    metadata = MetadataStore(":memory:")
    managed = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=entries),
                                 roll_over_in_background=True)
    payloads = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    positions = [f.result(BOUND_S) for f in [managed.append(p) for p in payloads]]
    managed.close()
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    closed = metadata.topic_ledgers(TOPIC)
    assert all(record.entries == entries for record in closed[:-1])
    assert managed_read_all(store, metadata) == payloads


def test_a_read_skips_a_ledger_trimmed_on_another_thread_after_its_plan_was_made(
    parts: tuple[GatedStore, MetadataStore],
) -> None:
    store, metadata = parts
    managed = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=2))
    for i in range(5):
        managed.append(b"t%d" % i).result(BOUND_S)
    ledgers = [record.ledger_id for record in managed.ledger_list()]

    def trim_elsewhere() -> None:
        trimmer = threading.Thread(target=managed.trim)
        trimmer.start()
        trimmer.join(BOUND_S)

    store.on_read = trim_elsewhere
    entries = managed.read_entries(Position(ledgers[0], 0), 10)
    assert [ledger for ledger in ledgers if ledger not in [r.ledger_id for r in managed.ledger_list()]], \
        "the trim deleted nothing: the race was not set up"
    assert [entry.data for entry in entries] == [b"t4"], "only what was not trimmed is served"
    managed.close()


def test_the_roll_past_a_failed_ledger_runs_in_the_background_and_never_blocks_the_appender(
    parts: tuple[GatedStore, MetadataStore],
) -> None:
    """A write fails: the next append finds the ledger failed and returns at once while a
    roll-over thread seals it at its last durable entry (the gate holds that seal) and
    creates the next one; the appends meanwhile wait, then land there in order."""
    store, metadata = parts
    faulty = FaultyLedgerStore(store)  # type: ignore[arg-type]
    managed = _open(faulty, metadata, entries=100)
    first = managed.ledger_list()[0].ledger_id
    assert managed.append(b"kept").result(BOUND_S) == Position(first, 0)
    faulty.fail_on("append", error=LedgerIOError("No space left on device"))
    with pytest.raises(LedgerIOError):
        managed.append(b"refused").result(BOUND_S)
    store.gate.clear()
    returned, futures = _append_on_a_thread(managed, b"next")
    assert returned.wait(BOUND_S), "an append blocked on the seal of the failed ledger"
    assert store.sealing.wait(BOUND_S), "the failed ledger was never sealed"
    more = [managed.append(b"then%d" % i) for i in range(2)]
    assert not futures[0].done(), "an append reported durable before its ledger existed"
    store.gate.set()
    positions = [f.result(BOUND_S) for f in [futures[0], *more]]
    second = positions[0].ledger_id
    assert second > first
    assert positions == [Position(second, 0), Position(second, 1), Position(second, 2)]
    managed.close()
    records = metadata.topic_ledgers(TOPIC)
    assert records[0].entries == 1 and not records[0].is_open, "the failed ledger is sealed at its durable entry"
    assert managed_read_all(store, metadata) == [b"kept", b"next", b"then0", b"then1"]


def test_a_failed_ledger_that_holds_nothing_leaves_the_list_in_the_background(
    parts: tuple[GatedStore, MetadataStore],
) -> None:
    """The roll past a failed, empty ledger drops it from the list and its file, off the
    appender's thread; a roll past it that fails fails that append only, and the next
    append tries again."""
    store, metadata = parts
    faulty = FaultyLedgerStore(store)  # type: ignore[arg-type]
    managed = _open(faulty, metadata, entries=100)
    first = managed.ledger_list()[0].ledger_id
    faulty.fail_on("append", error=LedgerIOError("No space left on device"))
    with pytest.raises(LedgerIOError):
        managed.append(b"refused").result(BOUND_S)
    faulty.fail_on("create", error=LedgerIOError("No space left on device"))
    with pytest.raises(LedgerIOError):
        managed.append(b"refused again").result(BOUND_S)  # the roll past it could not create the next
    position = managed.append(b"stored").result(BOUND_S)
    assert position.ledger_id > first
    assert [record.ledger_id for record in managed.ledger_list()] == [position.ledger_id]
    assert first not in store.inner.list(), "the empty failed ledger's file stayed"
    assert store.deleted_on and all(name.startswith("roll-over") for name in store.deleted_on), store.deleted_on
    managed.close()
    assert managed_read_all(store, metadata) == [b"stored"]


def test_an_append_fenced_at_call_time_rolls_past_the_ledger_in_the_background_and_is_stored(
    parts: tuple[GatedStore, MetadataStore],
) -> None:
    """The store refuses an append because its ledger was fenced by a failure not reported
    yet: as on the appender's own thread before, the ledger is rolled past (here on a
    roll-over thread, the gate holding its seal) and the append goes to the next one."""
    store, metadata = parts
    faulty = FaultyLedgerStore(store)  # type: ignore[arg-type]
    managed = _open(faulty, metadata, entries=100)
    first = managed.ledger_list()[0].ledger_id
    assert managed.append(b"kept").result(BOUND_S) == Position(first, 0)
    faulty.fail_on("append", error=LedgerFencedError("fenced", ledger_id=first))
    store.gate.clear()
    returned, futures = _append_on_a_thread(managed, b"fenced")
    assert returned.wait(BOUND_S), "an append blocked on the seal of the fenced ledger"
    assert store.sealing.wait(BOUND_S)
    store.gate.set()
    assert futures[0].result(BOUND_S).ledger_id > first
    managed.close()
    assert managed_read_all(store, metadata) == [b"kept", b"fenced"]


def test_an_append_never_waits_for_a_trims_commit(parts: tuple[GatedStore, MetadataStore]) -> None:
    """The trim's transaction (an fsync) is held at its start; an append made meanwhile on
    another thread returns and becomes durable, then the trim finishes and deletes the
    consumed ledgers."""
    store, metadata = parts
    managed = _open(store, metadata, entries=2)
    for i in range(5):
        managed.append(b"t%d" % i).result(BOUND_S)
    held, release = threading.Event(), threading.Event()

    def hold(**_: object) -> None:
        held.set()
        assert release.wait(BOUND_S), "the test never released the trim"

    metadata.database.fault_points["ledgers.remove.before"] = hold
    trimmed: list[list[int]] = []
    trimmer = threading.Thread(target=lambda: trimmed.append(managed.trim()))
    trimmer.start()
    try:
        assert held.wait(BOUND_S), "the trim never reached its commit"
        returned, futures = _append_on_a_thread(managed, b"during")
        assert returned.wait(BOUND_S), "an append waited for the trim's commit"
        assert futures[0].result(BOUND_S).ledger_id == managed.ledger_list()[-1].ledger_id
    finally:
        release.set()
        trimmer.join(BOUND_S)
    del metadata.database.fault_points["ledgers.remove.before"]
    assert trimmed and trimmed[0], "the trim deleted nothing: the race was not set up"
    listed = {record.ledger_id for record in managed.ledger_list()}
    assert not listed & set(trimmed[0]) and not set(store.inner.list()) & set(trimmed[0])
    managed.close()
    assert managed_read_all(store, metadata)[-1] == b"during"
