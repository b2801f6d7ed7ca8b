"""Managed cursors: acks, MD advance, properties, reset, recovery, and the fault point."""

from __future__ import annotations

from pathlib import Path

import pytest

from cursor import (
    CursorError,
    InitialPosition,
    InvalidMarkDeletePositionError,
    ManagedCursor,
    MarkDeleteBackwardsError,
)
from cursor.store import CursorStore
from ledger.errors import MetadataError
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import EARLIEST, LATEST, Position
from ledger.storage import FileLedgerStore, LedgerStore, SyncPolicy

TOPIC = "persistent://public/default/c"


def _ml(store: LedgerStore, metadata: MetadataStore, per_ledger: int = 3) -> ManagedLedger:
    return ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=per_ledger))


def _append(ml: ManagedLedger, count: int) -> list[Position]:
    return [f.result(timeout=10) for f in [ml.append(b"m%d" % i) for i in range(count)]]


def test_initial_positions(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _ml(store, metadata)
    positions = _append(ml, 4)
    latest = ManagedCursor.open_durable(ml, "latest", store=CursorStore(metadata.database))
    earliest = ManagedCursor.open_durable(ml, "earliest", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    assert latest.mark_delete_position == positions[-1]
    assert latest.backlog_entries() == 0
    assert earliest.backlog_entries() == 4
    assert [e.position for e in earliest.read_entries(10)] == positions
    # initial position is ignored once the subscription exists
    again = ManagedCursor.open_durable(ml, "latest", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    assert again.mark_delete_position == positions[-1]


def test_individual_acks_fill_gaps_and_move_md_across_ledgers(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _ml(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "s", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 8)
    cursor.delete([positions[1], positions[2], positions[3], positions[5]])
    assert cursor.mark_delete_position == ml.first_position()
    assert cursor.backlog_entries() == 4
    assert cursor.acked_ranges.to_pulsar_string() == f"[({positions[0].ledger_id}:0..{positions[0].ledger_id}:2], ({positions[3].ledger_id}:-1..{positions[3].ledger_id}:0], ({positions[3].ledger_id}:1..{positions[3].ledger_id}:2]]"
    cursor.delete([positions[0]])  # fills the gap: MD jumps over the run into the next ledger
    assert cursor.mark_delete_position == positions[3]
    cursor.delete([positions[4]])
    assert cursor.mark_delete_position == positions[5]
    assert len(cursor.acked_ranges) == 0
    assert cursor.backlog_entries() == 2


def test_cumulative_ack_rules(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _ml(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "s", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 5)
    cursor.delete([positions[3]])
    cursor.mark_delete(positions[2])
    assert cursor.mark_delete_position == positions[3]  # keeps going over the acked run
    with pytest.raises(MarkDeleteBackwardsError):
        cursor.mark_delete(positions[1])
    with pytest.raises(InvalidMarkDeletePositionError):
        cursor.mark_delete(Position(positions[-1].ledger_id, positions[-1].entry_id + 5))
    with pytest.raises(InvalidMarkDeletePositionError):
        cursor.delete([positions[4], Position(999, 0)])
    assert cursor.mark_delete_position == positions[3]


def test_properties_are_kept_by_acks_without_properties(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _ml(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "__compaction", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 6)
    cursor.mark_delete(positions[1], {"CompactedTopicLedger": 42})
    cursor.mark_delete(positions[2])
    cursor.delete([positions[3]])
    assert cursor.properties == {"CompactedTopicLedger": 42}
    ml.trim()
    recovered = ManagedCursor.open_durable(_ml(store, metadata), "__compaction", store=CursorStore(metadata.database))
    assert recovered.properties == {"CompactedTopicLedger": 42}
    assert recovered.mark_delete_position == positions[3]


def test_reset_moves_md_back_and_clears_properties_unless_kept(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _ml(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "s", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 6)
    cursor.mark_delete(positions[4], {"k": 1})
    cursor.reset(positions[2], keep_properties=True)
    assert cursor.mark_delete_position == positions[1]
    assert cursor.properties == {"k": 1}
    assert [e.position for e in cursor.read_entries(10)] == positions[2:]
    cursor.reset(EARLIEST)
    assert cursor.properties == {}
    assert cursor.backlog_entries() == 6
    cursor.reset(LATEST)
    assert cursor.backlog_entries() == 0
    assert cursor.read_entries(10) == []


def test_read_skips_individually_acked_entries(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _ml(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "s", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 6)
    cursor.delete([positions[1], positions[4]])
    assert [e.position for e in cursor.read_entries(10)] == [positions[i] for i in (0, 2, 3, 5)]
    assert cursor.entries_to_read() == 0
    cursor.rewind()
    assert cursor.entries_to_read() == 4


def test_non_durable_reader_inclusive_and_exclusive(store: LedgerStore, metadata: MetadataStore) -> None:
    ml = _ml(store, metadata)
    positions = _append(ml, 5)
    inclusive = ManagedCursor.open_non_durable(ml, "r1", positions[3])
    exclusive = ManagedCursor.open_non_durable(ml, "r2", positions[3], inclusive=False)
    assert [e.position for e in inclusive.read_entries(10)] == positions[3:]
    assert [e.position for e in exclusive.read_entries(10)] == positions[4:]
    assert ManagedCursor.open_non_durable(ml, "r3", LATEST).read_entries(10) == []
    assert CursorStore(metadata.database).list(TOPIC) == []


def test_reopen_redelivers_everything_after_md(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "m.db"))
    ml = _ml(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "s", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 7)
    cursor.read_entries(7)
    cursor.mark_delete(positions[1], {"p": 7})
    cursor.delete([positions[4]])
    store.shutdown()
    metadata.close()
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "m.db"))
    cursor = ManagedCursor.open_durable(_ml(store, metadata), "s", store=CursorStore(metadata.database))
    assert cursor.mark_delete_position == positions[1]
    assert cursor.properties == {"p": 7}
    assert [e.position for e in cursor.read_entries(10)] == [positions[i] for i in (2, 3, 5, 6)]
    store.shutdown()
    metadata.close()


@pytest.mark.parametrize("operation", ["mark_delete", "delete", "reset"])
def test_fault_between_mark_delete_and_properties_changes_neither(
    tmp_path: Path, operation: str
) -> None:
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.GROUP)
    metadata = MetadataStore(str(tmp_path / "m.db"))
    ml = _ml(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "__compaction", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 6)
    cursor.mark_delete(positions[2], {"CompactedTopicLedger": 5})

    def crash(**_: object) -> None:
        raise MetadataError("injected fault between position and properties")

    metadata.database.fault_points["cursor.save.between_position_and_properties"] = crash
    with pytest.raises(MetadataError):
        if operation == "mark_delete":
            cursor.mark_delete(positions[4], {"CompactedTopicLedger": 9})
        elif operation == "delete":
            cursor.delete([positions[3]])
        else:
            cursor.reset(positions[0])
    assert cursor.mark_delete_position == positions[2]
    assert cursor.properties == {"CompactedTopicLedger": 5}
    assert len(cursor.acked_ranges) == 0
    del metadata.database.fault_points["cursor.save.between_position_and_properties"]
    store.shutdown()
    metadata.close()
    metadata = MetadataStore(str(tmp_path / "m.db"))
    store = FileLedgerStore(str(tmp_path / "l"), sync=SyncPolicy.GROUP)
    recovered = ManagedCursor.open_durable(_ml(store, metadata), "__compaction", store=CursorStore(metadata.database))
    assert recovered.mark_delete_position == positions[2]
    assert recovered.properties == {"CompactedTopicLedger": 5}
    store.shutdown()
    metadata.close()


def test_recovered_md_in_a_trimmed_ledger_stays_where_it_was(store: LedgerStore, metadata: MetadataStore) -> None:
    """Not ``(next ledger, -1)``: that reads as "nothing acknowledged yet", which makes a
    read-compacted subscription read the compacted view from the earliest again."""
    ml = _ml(store, metadata, per_ledger=2)
    slow = ManagedCursor.open_durable(ml, "slow", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 6)
    slow.mark_delete(positions[1])  # last entry of the first ledger
    ml.trim()
    assert positions[0].ledger_id not in [r.ledger_id for r in ml.ledger_list()]
    recovered = ManagedCursor.open_durable(_ml(store, metadata, per_ledger=2), "slow", store=CursorStore(metadata.database))
    assert recovered.mark_delete_position == positions[1]
    assert [e.position for e in recovered.read_entries(10)] == positions[2:]
    assert recovered.backlog_entries() == 4


def _trimmed_prefix(store: LedgerStore, metadata: MetadataStore) -> tuple[ManagedLedger, list[Position], list[Position]]:
    """Six entries in two ledgers of three, the first trimmed; returns the ledger, the
    trimmed positions and the live ones."""
    ml = _ml(store, metadata)
    holder = ManagedCursor.open_durable(ml, "holder", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = _append(ml, 6)
    holder.mark_delete(positions[2])
    assert ml.trim() == [positions[0].ledger_id]
    return ml, positions[:3], positions[3:]


def test_a_read_compacted_cursor_keeps_acks_of_trimmed_compacted_entries(
    store: LedgerStore, metadata: MetadataStore,
) -> None:
    """With ``compacted_successor`` naming trimmed entries 0 and 2 (compacted), MD moved back
    before them stops at the first unacknowledged one — acknowledging a live entry does not
    cross them — and the acks survive a reopen; the backlog counts live entries only."""
    ml, trimmed, live = _trimmed_prefix(store, metadata)
    compacted = [trimmed[0], trimmed[2]]

    def successor(position: Position) -> Position | None:
        return next((p for p in compacted if p > position), None)

    cursor = ManagedCursor.open_durable(ml, "rc", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    cursor.compacted_successor = successor
    cursor.retreat_into_trimmed(Position(trimmed[0].ledger_id, -1))
    cursor.delete([trimmed[2], live[0]])
    assert cursor.mark_delete_position == Position(trimmed[0].ledger_id, -1)  # trimmed[0] is not acked
    assert cursor.backlog_entries() == 2

    recovered = ManagedCursor.open_durable(_ml(store, metadata), "rc", store=CursorStore(metadata.database))
    recovered.compacted_successor = successor
    assert recovered.mark_delete_position == Position(trimmed[0].ledger_id, -1)
    assert recovered.is_individually_acknowledged(trimmed[2]) and recovered.is_acknowledged(live[0])
    recovered.delete([trimmed[0]])
    assert recovered.mark_delete_position == live[0]


def test_without_compacted_successor_trimmed_positions_are_not_acknowledgeable(
    store: LedgerStore, metadata: MetadataStore,
) -> None:
    ml, trimmed, live = _trimmed_prefix(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "plain", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    cursor.delete([trimmed[1]])
    assert len(cursor.acked_ranges) == 0
    with pytest.raises(CursorError):
        cursor.retreat_into_trimmed(live[0])  # not in the trimmed prefix
    cursor.delete([live[0]])
    with pytest.raises(CursorError):
        cursor.retreat_into_trimmed(Position(trimmed[0].ledger_id, -1))  # MD left the first ledger's start


def test_a_durable_cursor_persists_only_through_the_store_it_is_given(store: LedgerStore, metadata: MetadataStore,
                                                                     tmp_path: Path) -> None:
    ml = _ml(store, metadata)
    positions = _append(ml, 3)
    elsewhere = CursorStore(MetadataStore(str(tmp_path / "other.db")).database)
    cursor = ManagedCursor.open_durable(ml, "s", InitialPosition.EARLIEST, store=elsewhere)
    cursor.mark_delete(positions[1], {"k": 7})
    assert elsewhere.load(TOPIC, "s") is not None
    assert elsewhere.load(TOPIC, "s").mark_delete_position == positions[1]  # type: ignore[union-attr]
    assert CursorStore(metadata.database).list(TOPIC) == []  # not through the managed ledger's metadata
    with pytest.raises(ValueError, match="needs a CursorStore"):
        ManagedCursor(ml, "t", durable=True, mark_delete_position=positions[0])
    elsewhere.database.close()
