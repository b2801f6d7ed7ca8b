"""Model-based test (P12) of a durable ``ManagedCursor`` over a ``ManagedLedger``.

A ``RuleBasedStateMachine`` appends, acknowledges (cumulatively and individually), reads,
resets, trims and reopens, on the real managed ledger and cursor and on a trivial model,
and after every step asserts that they agree. The managed ledger rolls over every
``MAX_ENTRIES_PER_LEDGER`` entries, so there are several ledgers, trimmed ones and an
empty current ledger most of the time.

The model (reference ``managed-ledger.md`` §2-§3) is stated over positions, not runs:

* the ledger list: ``{ledger_id: entries, sealed}``; a ledger seals when it holds
  ``MAX_ENTRIES_PER_LEDGER`` entries or on reopen, where an empty current ledger vanishes
  and a new one is always created. Ledger ids are the system's; the model only learns the
  id of each new current ledger and checks that it is larger than every id before.
* "live" positions: appended positions whose ledger is still in the list.
* last confirmed: the greatest live position, else ``(first ledger, -1)``.
* MD and the acked set (positions after MD acked individually): after every ack MD
  advances while the next live position after it is acked. Trimmed ledgers are never
  after MD, and empty ledgers hold no position, so both are crossed for free.
* reset to ``target``: the read position is the first live position at or after
  ``target`` (EARLIEST: the first; LATEST or past the last confirmed entry: the end), MD
  is the live position before it, else ``(first ledger, -1)``; acks are forgotten.
* reopen: MD in a ledger that left the list moves to ``(next ledger, -1)`` unless no
  ledger left is before it (a trimmed prefix: it stays), then MD past the last confirmed
  position is clamped to it (Pulsar's ``recoveredCursor``).
* trim: every sealed ledger, except the current one, whose last entry is at or before MD
  (retention 0/0: delete as soon as consumed).
* a read returns the first live, unacknowledged positions after both MD and the last
  position read before (the read position is not persisted: a reopen or a reset rewinds).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cursor import (
    InitialPosition,
    InvalidMarkDeletePositionError,
    ManagedCursor,
    MarkDeleteBackwardsError,
)
from cursor.store import CursorStore
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import EARLIEST, LATEST, Position
from ledger.storage import FileLedgerStore, LedgerStore, MemoryLedgerStore, SyncPolicy

TOPIC = "persistent://public/default/model"
CURSOR = "subscription"
MAX_ENTRIES_PER_LEDGER = 3
FUTURE_TIMEOUT_S = 10
CLOCK_S = 1_700_000_000.0  # a fixed clock: rollover and retention depend on counts only

choices = st.integers(min_value=0, max_value=2**16)
# An ack may name a message inside a batch entry; it acknowledges the whole entry.
batch_indexes = st.sampled_from([-1, -1, 0, 2])
property_maps = st.dictionaries(
    st.sampled_from(["CompactedTopicLedger", "a", "b"]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    max_size=2,
)


def clock() -> float:
    return CLOCK_S


@dataclass
class LedgerModel:
    entries: int = 0
    sealed: bool = False


class CursorModel:
    """The trivial model: plain sets and lists of positions; see the module docstring."""

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerModel] = {}
        self.trimmed: set[int] = set()
        self.data: dict[Position, bytes] = {}  # every position ever appended
        self.highest_ledger_id = 0
        self.mark_delete_position = Position(-1, -1)
        self.acked: set[Position] = set()
        self.properties: dict[str, int] = {}
        self.read_after = Position(-1, -1)

    # -- the ledger list ----------------------------------------------------------------

    def new_current(self, ledger_id: int) -> None:
        assert ledger_id > self.highest_ledger_id, "ledger ids must grow"
        assert all(ledger.sealed for ledger in self.ledgers.values())
        self.highest_ledger_id = ledger_id
        self.ledgers[ledger_id] = LedgerModel()

    @property
    def current(self) -> int:
        return max(self.ledgers)

    def live(self) -> list[Position]:
        return sorted(position for position in self.data if position.ledger_id in self.ledgers)

    def last_confirmed(self) -> Position:
        live = self.live()
        return live[-1] if live else Position(min(self.ledgers), -1)

    def end(self) -> Position:
        return Position(self.current, self.ledgers[self.current].entries)

    def append(self, data: bytes) -> tuple[Position, bool]:
        """The position the next append gets, and whether it fills (seals) its ledger."""
        ledger = self.ledgers[self.current]
        position = Position(self.current, ledger.entries)
        ledger.entries += 1
        self.data[position] = data
        ledger.sealed = ledger.entries == MAX_ENTRIES_PER_LEDGER
        return position, ledger.sealed

    # -- acknowledgements ---------------------------------------------------------------

    def is_acknowledged(self, position: Position) -> bool:
        return position <= self.mark_delete_position or position in self.acked

    def advance(self) -> None:
        for position in self.live():
            if position <= self.mark_delete_position:
                continue
            if position not in self.acked:
                break
            self.mark_delete_position = position
        self.acked = {position for position in self.acked if position > self.mark_delete_position}
        self.read_after = max(self.read_after, self.mark_delete_position)

    def backlog(self) -> int:
        return sum(1 for position in self.live() if not self.is_acknowledged(position))

    def to_read(self) -> list[Position]:
        start = max(self.read_after, self.mark_delete_position)
        return [p for p in self.live() if p > start and not self.is_acknowledged(p)]

    # -- reset, reopen, trim ------------------------------------------------------------

    def reset(self, target: Position, keep_properties: bool) -> None:
        live = self.live()
        if target == LATEST or target > self.last_confirmed():
            read_position = self.end()
        else:  # EARLIEST sorts before every position
            read_position = next((p for p in live if p >= target), self.end())
        before = [p for p in live if p < read_position]
        self.mark_delete_position = before[-1] if before else Position(min(self.ledgers), -1)
        self.acked = set()
        if not keep_properties:
            self.properties = {}
        self.read_after = self.mark_delete_position

    def reopen(self, new_ledger_id: int) -> None:
        current = self.ledgers[self.current]
        if current.entries == 0:
            del self.ledgers[self.current]
        for ledger in self.ledgers.values():
            ledger.sealed = True
        self.new_current(new_ledger_id)
        md = self.mark_delete_position
        if md.ledger_id not in self.ledgers and md.ledger_id > min(self.ledgers):
            later = [ledger_id for ledger_id in self.ledgers if ledger_id > md.ledger_id]
            if later:
                md = Position(min(later), -1)
        self.mark_delete_position = min(md, self.last_confirmed())
        self.acked = {position for position in self.acked if position > self.mark_delete_position}
        self.read_after = self.mark_delete_position

    def trim(self) -> list[int]:
        doomed = []
        for ledger_id in sorted(self.ledgers):
            ledger = self.ledgers[ledger_id]
            if ledger_id == self.current or not ledger.sealed:
                break
            if Position(ledger_id, ledger.entries - 1) > self.mark_delete_position:
                break
            doomed.append(ledger_id)
        for ledger_id in doomed:
            del self.ledgers[ledger_id]
            self.trimmed.add(ledger_id)
        return doomed


class CursorMachine(RuleBasedStateMachine):
    """A durable cursor on a managed ledger, against ``CursorModel``."""

    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="cursor-model-")
        self.store, self.metadata = self.open_stores()
        self.config = ManagedLedgerConfig(max_entries_per_ledger=MAX_ENTRIES_PER_LEDGER)
        self.model = CursorModel()
        self.appended = 0
        self.ledger: ManagedLedger
        self.cursor: ManagedCursor
        self.floor: Position  # MD may not go below this, except through reset

    def open_stores(self) -> tuple[LedgerStore, MetadataStore]:
        if self.backend == "memory":
            return MemoryLedgerStore(), MetadataStore(":memory:")
        store = FileLedgerStore(str(Path(self.root) / "ledgers"), sync=SyncPolicy.GROUP)
        return store, MetadataStore(str(Path(self.root) / "metadata.db"))

    def teardown(self) -> None:
        self.store.shutdown()
        self.metadata.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers ------------------------------------------------------------------------

    def append_one(self) -> None:
        data = f"entry-{self.appended}".encode()
        self.appended += 1
        expected, filled = self.model.append(data)
        position = self.ledger.append(data).result(timeout=FUTURE_TIMEOUT_S)
        assert position == expected
        if filled:  # the append that fills a ledger is its last; a new one opens at once
            self.model.new_current(self.ledger.current_ledger_id)
        assert self.ledger.current_ledger_id == self.model.current

    def candidates(self) -> list[Position]:
        """Every position ever appended (trimmed ones too) and the mark-delete position."""
        return sorted(set(self.model.data) | {self.model.mark_delete_position})

    def past_the_end(self) -> list[Position]:
        end = self.model.end()
        return [end, Position(end.ledger_id, end.entry_id + 5), Position(end.ledger_id + 1, 0)]

    # -- rules --------------------------------------------------------------------------

    @initialize(entries=st.integers(min_value=0, max_value=5),
                initial_position=st.sampled_from(InitialPosition))
    def open_cursor(self, entries: int, initial_position: InitialPosition) -> None:
        """Create the topic, append a few entries, then create the durable cursor."""
        self.ledger = ManagedLedger.open(TOPIC, self.store, self.metadata, self.config, clock=clock)
        self.model.new_current(self.ledger.current_ledger_id)
        for _ in range(entries):
            self.append_one()
        self.cursor = ManagedCursor.open_durable(self.ledger, CURSOR, initial_position, clock=clock, store=CursorStore(self.metadata.database))
        if initial_position is InitialPosition.EARLIEST:
            self.model.mark_delete_position = Position(min(self.model.ledgers), -1)
        else:
            self.model.mark_delete_position = self.model.last_confirmed()
        self.model.read_after = self.model.mark_delete_position
        self.floor = self.model.mark_delete_position

    @rule(count=st.integers(min_value=1, max_value=4))
    def append(self, count: int) -> None:
        for _ in range(count):
            self.append_one()

    @rule(choice=choices, batch_index=batch_indexes, properties=st.none() | property_maps)
    def mark_delete(self, choice: int, batch_index: int, properties: dict[str, int] | None) -> None:
        """Cumulative ack at an appended position (or MD itself); None keeps properties."""
        candidates = self.candidates()
        position = candidates[choice % len(candidates)]
        model = self.model
        if position < model.mark_delete_position:
            with pytest.raises(MarkDeleteBackwardsError):
                self.cursor.mark_delete(position.with_batch_index(batch_index), properties)
            return
        assert position <= model.last_confirmed()
        self.cursor.mark_delete(position.with_batch_index(batch_index), properties)
        model.mark_delete_position = position
        if properties is not None:
            model.properties = dict(properties)
        model.advance()

    @precondition(lambda self: bool(self.model.live()))
    @rule(properties=st.none() | property_maps)
    def mark_delete_everything(self, properties: dict[str, int] | None) -> None:
        self.cursor.mark_delete(self.model.last_confirmed(), properties)
        self.model.mark_delete_position = self.model.last_confirmed()
        if properties is not None:
            self.model.properties = dict(properties)
        self.model.advance()

    @rule(choice=choices, properties=st.none() | property_maps)
    def mark_delete_past_the_end_is_refused(self, choice: int, properties: dict[str, int] | None) -> None:
        targets = self.past_the_end()
        with pytest.raises(InvalidMarkDeletePositionError):
            self.cursor.mark_delete(targets[choice % len(targets)], properties)

    @rule(picks=st.lists(choices, min_size=1, max_size=4), batch_index=batch_indexes,
          past_the_end=st.booleans())
    def delete(self, picks: list[int], batch_index: int, past_the_end: bool) -> None:
        """Individual acks; acked, trimmed and duplicate positions are skipped. One position
        past the last confirmed entry fails the whole call and changes nothing."""
        candidates = sorted(self.model.data)
        positions = [candidates[pick % len(candidates)] for pick in picks] if candidates else []
        if past_the_end or not positions:
            positions.append(self.past_the_end()[picks[0] % 3])
            with pytest.raises(InvalidMarkDeletePositionError):
                self.cursor.delete(positions)
            return
        self.cursor.delete([position.with_batch_index(batch_index) for position in positions])
        for position in positions:
            if not self.model.is_acknowledged(position):
                self.model.acked.add(position)
        before = self.model.mark_delete_position
        self.model.advance()
        if self.model.mark_delete_position.ledger_id != before.ledger_id:
            event("individual ack moved MD into another ledger")

    @precondition(lambda self: self.model.backlog() > 0)
    @rule(data=st.data())
    def delete_the_next_unacked_out_of_order(self, data: st.DataObject) -> None:
        """Ack the first few unacknowledged entries one by one, in a random order: the
        gaps close and MD runs across ledger boundaries (Pulsar PR #21105)."""
        unacked = [p for p in self.model.live() if not self.model.is_acknowledged(p)]
        for position in data.draw(st.permutations(unacked[:4])):
            before = self.model.mark_delete_position
            self.cursor.delete([position])
            self.model.acked.add(position)
            self.model.advance()
            assert self.cursor.mark_delete_position == self.model.mark_delete_position
            if self.model.mark_delete_position.ledger_id != before.ledger_id:
                event("individual ack moved MD into another ledger")

    @rule(count=st.integers(min_value=1, max_value=6))
    def read_entries(self, count: int) -> None:
        entries = self.cursor.read_entries(count)
        expected = self.model.to_read()[:count]
        assert [entry.position for entry in entries] == expected
        for entry in entries:
            assert entry.data == self.model.data[entry.position]
            assert not self.cursor.is_acknowledged(entry.position)
        if expected:
            self.model.read_after = expected[-1]

    @rule(choice=choices, offset=st.integers(min_value=-1, max_value=4),
          kind=st.sampled_from(["earliest", "latest", "appended", "ledger"]),
          keep_properties=st.booleans())
    def reset(self, choice: int, offset: int, kind: str, keep_properties: bool) -> None:
        """Reset to EARLIEST, LATEST, an appended (maybe trimmed) position, or any entry id
        in -1..4 of a known ledger (missing, past the ledger's end, or past the log's)."""
        if kind == "earliest":
            target = EARLIEST
        elif kind == "latest":
            target = LATEST
        elif kind == "appended" and self.model.data:
            positions = sorted(self.model.data)
            target = positions[choice % len(positions)]
        else:
            ledger_ids = sorted(set(self.model.ledgers) | self.model.trimmed)
            target = Position(ledger_ids[choice % len(ledger_ids)], offset)
        self.cursor.reset(target, keep_properties=keep_properties)
        self.model.reset(target, keep_properties)
        self.floor = self.model.mark_delete_position

    @rule()
    def trim(self) -> None:
        trimmed = self.model.trim()
        assert self.ledger.trim() == trimmed
        event("trim deleted ledgers" if trimmed else "trim deleted nothing")

    @rule(crash=st.booleans())
    def reopen(self, crash: bool) -> None:
        """Open the topic and the cursor again on the same stores (file: new objects over
        the same files). ``crash``: the old managed ledger is never closed."""
        if not crash:
            self.ledger.close()
        if self.backend == "file":
            self.store.shutdown()
            self.metadata.close()
            self.store, self.metadata = self.open_stores()
        self.ledger = ManagedLedger.open(TOPIC, self.store, self.metadata, self.config, clock=clock)
        before = self.model.mark_delete_position
        self.model.reopen(self.ledger.current_ledger_id)
        event("reopen moved MD" if before != self.model.mark_delete_position else "reopen kept MD")
        # the initial position only matters when the cursor is created
        self.cursor = ManagedCursor.open_durable(self.ledger, CURSOR, InitialPosition.EARLIEST,
                                                 clock=clock, store=CursorStore(self.metadata.database))

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def mark_delete_position_agrees_and_never_moves_backwards(self) -> None:
        assert self.cursor.mark_delete_position == self.model.mark_delete_position
        assert self.cursor.mark_delete_position >= self.floor
        self.floor = self.cursor.mark_delete_position

    @invariant()
    def acknowledgements_agree(self) -> None:
        acked = {Position(ledger_id, entry_id)
                 for ledger_id, first, last in self.cursor.acked_ranges.runs()
                 for entry_id in range(first, last + 1)}
        assert acked == self.model.acked
        for position in self.model.data:
            assert self.cursor.is_acknowledged(position) == self.model.is_acknowledged(position)

    @invariant()
    def properties_agree_in_memory_and_persisted(self) -> None:
        assert self.cursor.properties == self.model.properties
        record = CursorStore(self.metadata.database).load(TOPIC, CURSOR)
        assert record is not None
        assert dict(record.properties) == self.model.properties

    @invariant()
    def backlog_agrees(self) -> None:
        assert self.cursor.backlog_entries() == self.model.backlog()
        assert self.cursor.entries_to_read() == len(self.model.to_read())

    @invariant()
    def ledger_list_agrees(self) -> None:
        assert [record.ledger_id for record in self.ledger.ledger_list()] == sorted(self.model.ledgers)
        assert [record.entries for record in self.ledger.ledger_list()] == [
            self.model.ledgers[ledger_id].entries for ledger_id in sorted(self.model.ledgers)
        ]
        assert self.ledger.last_confirmed_position() == self.model.last_confirmed()
        assert self.ledger.number_of_entries == len(self.model.live())
        assert self.ledger.total_size == sum(len(self.model.data[p]) for p in self.model.live())


class FileCursorMachine(CursorMachine):
    backend = "file"


@pytest.mark.parametrize(
    ("machine", "max_examples"),
    [(CursorMachine, 60), (FileCursorMachine, 20)],
    ids=["memory", "file"],
)
def test_cursor_agrees_with_the_model(machine: type[CursorMachine], max_examples: int) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=max_examples, stateful_step_count=30, deadline=None),
    )


# -- regressions found by the model, pinned as plain tests ------------------------------------


def _topic_with_two_ledgers() -> tuple[ManagedLedger, ManagedCursor]:
    """Ledger 1 sealed with 3 entries, ledger 2 current with 1; a cursor at the start."""
    ledger = ManagedLedger.open(TOPIC, MemoryLedgerStore(), MetadataStore(":memory:"),
                                ManagedLedgerConfig(max_entries_per_ledger=MAX_ENTRIES_PER_LEDGER),
                                clock=clock)
    for index in range(MAX_ENTRIES_PER_LEDGER + 1):
        ledger.append(b"entry-%d" % index).result(timeout=FUTURE_TIMEOUT_S)
    assert [(r.ledger_id, r.entries) for r in ledger.ledger_list()] == [(1, 3), (2, 1)]
    cursor = ManagedCursor.open_durable(ledger, CURSOR, InitialPosition.EARLIEST, clock=clock, store=CursorStore(ledger.metadata.database))
    return ledger, cursor


def test_individual_ack_of_a_position_without_an_entry_leaves_the_backlog_alone() -> None:
    """Ledger 1 ends at entry 2, yet 1:3..1:49 are before the last confirmed entry 2:0, so
    the ack passes the "past the last confirmed entry" check. Pulsar counts acked entries
    through the ledger (``getNumberOfEntries`` of each range), so such positions count
    zero; the backlog must stay 4, and can never go negative."""
    _, cursor = _topic_with_two_ledgers()
    cursor.delete([Position(1, entry_id) for entry_id in range(3, 50)])
    assert cursor.backlog_entries() == 4
    assert cursor.entries_to_read() == 4
    assert [entry.position for entry in cursor.read_entries(10)] == [
        Position(1, 0), Position(1, 1), Position(1, 2), Position(2, 0)
    ]


@pytest.mark.parametrize("batch_index", [0, 2])
def test_reset_to_a_message_inside_the_last_entry_reads_that_entry(batch_index: int) -> None:
    """A message id names the entry holding the message: a reset to a message inside a
    batch reads that entry again (the consumer drops the batch's earlier messages), for
    the last entry exactly as for any other."""
    _, cursor = _topic_with_two_ledgers()
    for target in (Position(1, 1, batch_index), Position(2, 0, batch_index)):
        cursor.reset(target)
        assert cursor.mark_delete_position == cursor.ledger.previous_position(target.entry_position())
        assert cursor.read_entries(1)[0].position == target.entry_position()


def test_reader_starting_inside_the_last_entry_reads_that_entry() -> None:
    ledger, _ = _topic_with_two_ledgers()
    for target in (Position(1, 1, 2), Position(2, 0, 2)):
        reader = ManagedCursor.open_non_durable(ledger, "reader", target, inclusive=True)
        assert reader.read_entries(1)[0].position == target.entry_position()
