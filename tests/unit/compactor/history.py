"""Histories of produce and compact steps over a real data dir, and the logical view they
leave: what the agreement tests of incremental runs (issue 30, point 4) drive and compare.

A *history* is a list of steps (``Produce``, ``Compact``) under one topic ``Policy``
(``deleteRetentionMs``, ``minCompactionLagMs``, ``retain_null_key``). Produce steps append
the entries ``tests.strategies`` draws (keys from a small alphabet, tombstones, key-less
messages, batches of several slots, markers, undecodable entries, interleaved chunked
messages), each stamped with a publish time from the history's clock (``Clock``), so that
tombstone retention and the minimum lag cut *inside* the history; compact steps move the
clock on and run the compactor (incremental by default), now and then with merge-happy
settings (``MERGE_HAPPY``: a low dead ratio and a small fan-in).

``Logical`` is what a read-compacted reader receives from the earliest message, through
``compactor.view.reader.CompactedReader`` (the object dispatch drives): every delivered
message's id (ledger, entry, batch index) with its content (a non-batched entry's bytes;
a batch slot's bytes with its batch's metadata), plus the view's horizon and
``get_last_message_id``'s answer. Two views that differ only in how they store the same
messages (an old ledger with dead marks against a rewritten batch) are equal.

``reference`` is "compacting the whole history at once": a copy of the data dir made
now (the same raw ledgers, so the same message ids), its ``__compaction`` subscription
deleted (``CompactedTopic.drop_view``: no view, no horizon), then one ``rewrite=True`` run
at the same clock with the same policy.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from compactor.record import RunFigures
from compactor.runs.runner import CompactionConfig, Compactor, collect_orphans
from compactor.view.reader import CompactedReader, last_message_id
from compactor.view.topic import CompactedTopic
from compactor.view.view import CompactedEntry
from cursor import ManagedCursor
from cursor.store import CursorStore
from ledger import (
    EARLIEST,
    DataDir,
    FaultyLedgerStore,
    ManagedLedger,
    ManagedLedgerConfig,
    Position,
)
from ledger.storage.base import LedgerStore
from message.encoder import encode_entry
from message.entry import BROKER_ENTRY_MAGIC, batch_slots, parse_entry, parse_header
from message.errors import MalformedEntryError
from tests.strategies import any_entry, chunked_messages, interleaved

TOPIC = "persistent://public/default/history"
ENTRIES_PER_LEDGER = 6  # small ledgers: a history spans several raw ledgers
START_MS = 1_700_000_000_000
READER_BATCH_ENTRIES = 5
READER_ROUNDS_MAX = 10_000
RETENTION_MS = 40  # deleteRetentionMs of the histories that keep tombstones for a while
LAG_MS = 25  # minCompactionLagMs of the histories that hold young entries back
MERGE_HAPPY = {"merge_dead_ratio": 0.05, "merge_fan_in": 2}
"""Settings under which almost every run merges: a ledger with 5% of its messages dead is
rewritten, and two adjacent ledgers of a size are merged."""

Draft = tuple[Any, bytes, Any, int]


# -- steps -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    delete_retention_ms: int = 0
    min_compaction_lag_ms: int = 0
    retain_null_key: bool = False


class Produce:
    """Append ``drafts``; their publish times step by ``spacing_ms`` from the clock. (Not a
    dataclass: Hypothesis would print every entry's bytes of a failing history.)"""

    __slots__ = ("drafts", "spacing_ms")

    def __init__(self, drafts: tuple[Draft, ...], spacing_ms: int) -> None:
        self.drafts, self.spacing_ms = drafts, spacing_ms

    def __repr__(self) -> str:
        kinds = [draft[0] + ("(chunk)" if draft[0] == "single" and draft[2][0][1].chunk else "") for draft in self.drafts]
        return f"Produce({kinds}, spacing_ms={self.spacing_ms})"


@dataclass(frozen=True)
class Compact:
    """Move the clock on by ``advance_ms``, then run the compactor (merge-happy or not)."""

    advance_ms: int
    merge: bool


Step = Produce | Compact


@st.composite
def produce_steps(draw: st.DrawFn, *, max_entries: int = 8, chunks: bool = True) -> Produce:
    """1-``max_entries`` entries of any kind, and (``chunks``) now and then the chunks of a
    chunked message interleaved with them."""
    drafts = draw(st.lists(any_entry, min_size=1, max_size=max_entries))
    chunked = draw(st.lists(chunked_messages(), max_size=1)) if chunks else []
    return Produce(tuple(interleaved(draw, [drafts, *chunked])), draw(st.integers(0, 12)))


compact_steps = st.builds(Compact, st.integers(0, 60), st.booleans())
policies = st.builds(Policy, st.sampled_from((0, RETENTION_MS)), st.sampled_from((0, LAG_MS)), st.booleans())


@st.composite
def histories(draw: st.DrawFn, *, rounds_min: int = 2, rounds_max: int = 4) -> tuple[Policy, list[Step]]:
    """A policy and a history of rounds, each one or two produce steps then a compaction
    (now and then followed by one with nothing new); the last step is a compaction. One
    history in three has chunked messages (a run over a chunk rewrites the whole view:
    the others keep runs incremental)."""
    steps: list[Step] = []
    chunks = draw(st.integers(0, 2)) == 0
    for _ in range(draw(st.integers(rounds_min, rounds_max))):
        steps += draw(st.lists(produce_steps(chunks=chunks), min_size=1, max_size=2))
        steps += draw(st.lists(compact_steps, min_size=1, max_size=2))
    return draw(policies), steps


# -- the clock and publish times -------------------------------------------------------------


@dataclass
class Clock:
    """The history's time: entries are stamped from it, runs read it (seconds, as
    ``time.time``)."""

    ms: int = START_MS

    def __call__(self) -> float:
        return self.ms / 1000


def stamped(data: bytes, publish_time_ms: int) -> bytes:
    """``data`` with its ``publish_time`` set (a broker-entry block and the checksum form
    kept); undecodable bytes unchanged."""
    prefix, rest = b"", data
    if data[:2] == BROKER_ENTRY_MAGIC and len(data) >= 6:
        (size,) = struct.unpack_from(">I", data, 2)
        prefix, rest = data[: 6 + size], data[6 + size:]
    try:
        metadata, header_size, has_checksum = parse_header(rest)
    except MalformedEntryError:
        return data
    metadata.publish_time = publish_time_ms
    return prefix + encode_entry(metadata, rest[header_size:], with_checksum=has_checksum)


# -- one process over a data dir ---------------------------------------------------------------


def config(policy: Policy, *, merge: bool = False, **overrides: Any) -> CompactionConfig:
    """The compactor's configuration for ``policy``; ``merge``: the merge-happy settings."""
    settings: dict[str, Any] = {"retain_null_key": policy.retain_null_key, "read_batch_entries": 4, "engine": "local",
                                **overrides}
    if merge:
        settings.update(MERGE_HAPPY)
    return CompactionConfig(**settings)


@dataclass
class Opened:
    """What one process opened on a data dir."""

    path: Path
    data_dir: DataDir
    store: FaultyLedgerStore | None
    ledger: ManagedLedger
    topic: CompactedTopic
    orphans: list[int] = field(default_factory=list)

    stopped: bool = False

    def close(self) -> None:
        """A clean stop: the ledger sealed, the stores closed, the lock released (nothing
        if the process already stopped)."""
        if not self.stopped:
            self.stopped = True
            try:
                self.ledger.close()
            finally:
                self.data_dir.close()

    def kill(self) -> None:
        """``kill -9``: nothing closed or sealed; the stores stop and the lock goes."""
        self.stopped = True
        if self.store is not None:
            self.store.disarm()
        self.data_dir.database.fault_points.clear()
        self.data_dir.close()


def open_dir(path: Path, clock: Clock, *, faulty: bool = False) -> Opened:
    """Start as compactd does: lock, collect orphans, open the topic, restore its view.
    ``faulty``: the ledger store wrapped in ``FaultyLedgerStore`` (which has no file powers:
    runs go through the store, not the ledger files and their key indexes)."""
    data_dir = DataDir.open(str(path))
    try:
        orphans = collect_orphans(data_dir, now_ms=clock.ms)
        store = FaultyLedgerStore(data_dir.ledgers) if faulty else None
        outer: LedgerStore = store if store is not None else data_dir.ledgers
        ledger = ManagedLedger.open(TOPIC, outer, data_dir.metadata, ManagedLedgerConfig(
            max_entries_per_ledger=ENTRIES_PER_LEDGER, retention_time_ms=-1, retention_size_bytes=-1))
        topic = CompactedTopic.restore(ledger, CursorStore(data_dir.database), clock=clock)
    except BaseException:
        data_dir.close()
        raise
    return Opened(path, data_dir, store, ledger, topic, orphans)


def produce(opened: Opened, clock: Clock, step: Produce) -> None:
    futures = []
    for draft in step.drafts:
        futures.append(opened.ledger.append(stamped(draft[1], clock.ms)))
        clock.ms += step.spacing_ms
    for future in futures:
        future.result(timeout=10)
    clock.ms += 1  # the clock is always past every publish time


def compact(opened: Opened, clock: Clock, policy: Policy, *, merge: bool = False, rewrite: bool = False,
            compactor: Compactor | None = None) -> RunFigures:
    """One run at the clock's time under ``policy`` (incremental unless ``rewrite``)."""
    compactor = compactor or Compactor(config(policy, merge=merge), clock=clock)
    return compactor.compact(opened.topic, rewrite=rewrite, delete_retention_ms=policy.delete_retention_ms,
                             min_compaction_lag_ms=policy.min_compaction_lag_ms)


# -- the logical view ------------------------------------------------------------------------

Message = tuple[Position, bytes, bytes]


@dataclass(frozen=True)
class Logical:
    """What a read-compacted reader gets (see the module docstring)."""

    horizon: Position | None
    last_message_id: Position
    messages: tuple[Message, ...]

    def __repr__(self) -> str:
        ids = [f"{p.ledger_id}:{p.entry_id}:{p.batch_index}" for p, _, _ in self.messages]
        return f"Logical(horizon={self.horizon}, last={self.last_message_id}, ids={ids})"


def difference(served: Logical, expected: Logical) -> str:
    """What an assertion says when two logical views differ."""

    def ids(view: Logical) -> list[tuple[int, int, int]]:
        return [(p.ledger_id, p.entry_id, p.batch_index) for p, _, _ in view.messages]

    extra = [m for m in served.messages if m not in expected.messages]
    missing = [m for m in expected.messages if m not in served.messages]
    return (f"served horizon {served.horizon} last {served.last_message_id}, expected {expected.horizon} "
            f"last {expected.last_message_id}; served {ids(served)}; expected {ids(expected)}; "
            f"extra {extra}; missing {missing}")


def delivered(entry: CompactedEntry) -> list[Message]:
    """The messages a client gets of one entry a read-compacted reader hands dispatch: a
    batch's slots in its surviving mask (each with its batch's metadata, less the size
    a rewrite changes), or the entry as stored."""
    if not entry.batch_size:
        return [(entry.position, b"", bytes(entry.data))]
    parsed = parse_entry(entry.data)
    metadata = type(parsed.metadata)()
    metadata.CopyFrom(parsed.metadata)
    metadata.ClearField("uncompressed_size")
    head = metadata.SerializeToString(deterministic=True)
    slots = batch_slots(parsed)
    return [(entry.position.with_batch_index(index), head, slots[index].slot_bytes) for index in entry.surviving]


def read_compacted(topic: CompactedTopic, start: Position | None = None) -> list[CompactedEntry]:
    """Everything a read-compacted reader gets from the earliest message (or after a seek
    to ``start``), in batches of ``READER_BATCH_ENTRIES``."""
    cursor = ManagedCursor.open_non_durable(topic.ledger, "reader", EARLIEST)
    reader = CompactedReader(topic, cursor, from_earliest=start is None)
    if start is not None:
        reader.seek(start)
    seen: list[CompactedEntry] = []
    for _ in range(READER_ROUNDS_MAX):
        batch = reader.read(READER_BATCH_ENTRIES)
        if not batch:
            return seen
        seen.extend(batch)
    raise AssertionError("the reader never reached the end of the topic")


def logical(topic: CompactedTopic) -> Logical:
    messages = tuple(message for entry in read_compacted(topic) for message in delivered(entry))
    return Logical(topic.horizon, last_message_id(topic), messages)


def logical_from(topic: CompactedTopic, start: Position) -> tuple[Message, ...]:
    """What a read-compacted reader sought to ``start`` gets."""
    return tuple(message for entry in read_compacted(topic, start) for message in delivered(entry))


# -- copies and the reference ----------------------------------------------------------------


def copied(opened: Opened, clock: Clock, to: Path) -> Opened:
    """Stop ``opened`` cleanly, copy its data dir to ``to`` and start it again (the
    restarted process is returned; the copy is not opened)."""
    opened.close()
    shutil.copytree(opened.path, to, ignore=shutil.ignore_patterns("LOCK"))
    return open_dir(opened.path, clock, faulty=opened.store is not None)


def reference(path: Path, clock: Clock, policy: Policy, *, then: Callable[[Opened, Logical], None] | None = None,
              **overrides: Any) -> Logical:
    """The whole history of the (stopped) copy at ``path`` compacted at once: its
    ``__compaction`` subscription deleted, then one ``rewrite=True`` run (``overrides``:
    of its configuration); ``then(opened, view)`` is called before the copy is stopped."""
    opened = open_dir(path, clock)
    try:
        opened.topic.drop_view()
        assert opened.topic.view is None
        compact(opened, clock, policy, rewrite=True,
                compactor=Compactor(config(policy, **overrides), clock=clock))
        view = logical(opened.topic)
        if then is not None:
            then(opened, view)
        return view
    finally:
        opened.close()


def stray_ledgers(opened: Opened) -> set[int]:
    """Ledgers that are neither the topic's raw ledgers nor its view's (no grace period)."""
    view = opened.topic.view
    live = {record.ledger_id for record in opened.ledger.ledger_list()}
    live |= set(view.ledger_ids) if view is not None else set()
    return set(opened.data_dir.ledgers.list()) - live


def entry_starts(view: Logical) -> Iterator[Position]:
    """The entry positions of ``view``'s messages, each once, in order."""
    seen: set[Position] = set()
    for position, _, _ in view.messages:
        entry = position.entry_position()
        if entry not in seen:
            seen.add(entry)
            yield entry
