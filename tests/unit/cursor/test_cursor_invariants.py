"""P5 in the cursor layer: a mark-delete never moves back. Each assertion is broken on
purpose here, through the internals an acknowledgement goes through, and must fail with
``AssertionError`` (the suite never runs with ``-O``); the public path is shown to keep
raising its typed error instead (``MarkDeleteBackwardsError``)."""

from __future__ import annotations

import pytest

from cursor import InitialPosition, ManagedCursor, MarkDeleteBackwardsError
from cursor.ranges import AckedRanges
from cursor.store import CursorRecord, CursorStore
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import LedgerStore

TOPIC = "persistent://public/default/invariants"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_acknowledgement_moving_md_back_fails_the_cursors_assertion(
        store: LedgerStore, metadata: MetadataStore) -> None:
    ledger = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=3))
    cursor = ManagedCursor.open_durable(ledger, "s", InitialPosition.EARLIEST, store=CursorStore(metadata.database))
    positions = [ledger.append(b"m%d" % i).result(10) for i in range(5)]
    cursor.mark_delete(positions[3])
    with pytest.raises(MarkDeleteBackwardsError):  # the public path refuses it as an operating error
        cursor.mark_delete(positions[1])
    with pytest.raises(AssertionError, match="moved MD back"):  # past that check, the invariant holds
        cursor._apply(positions[1], AckedRanges(), {})
    assert cursor.mark_delete_position == positions[3]
    ledger.close()


def _record(entry_id: int) -> CursorRecord:
    return CursorRecord(TOPIC, "s", Position(7, entry_id))


def test_a_queued_acknowledgement_moving_the_persisted_md_back_fails_the_stores_assertion(
        metadata: MetadataStore) -> None:
    clock = Clock()
    cursors = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursors.save(_record(5))
    cursors.save_later(_record(6))  # forward: written on the schedule
    clock.now += 2
    assert cursors.write_due() == 1
    cursors.save_later(_record(3))
    clock.now += 2
    with pytest.raises(AssertionError, match="persisted MD would move back"):
        cursors.write_due()
    assert cursors.load_persisted(TOPIC, "s") == _record(6)  # nothing was written


def test_a_reset_or_a_recovery_may_move_the_persisted_md_back(metadata: MetadataStore) -> None:
    clock = Clock()
    cursors = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursors.save(_record(5))
    cursors.save_soon_from(TOPIC, "s", lambda: _record(2))  # a reset: due now
    assert cursors.load_persisted(TOPIC, "s") == _record(2)
    cursors.save(_record(8))
    assert cursors.load(TOPIC, "s") == _record(8)  # a recovery, which may clamp MD back
    cursors.save_later(_record(4))
    clock.now += 2
    assert cursors.write_due() == 1
    assert cursors.load_persisted(TOPIC, "s") == _record(4)


def test_a_reset_queued_while_an_acknowledgement_is_written_may_still_move_the_md_back(
        metadata: MetadataStore) -> None:
    """A read-compacted consumer's seek right after an acknowledgement (Pulsar's
    ``seekReadCompactedAfterTrim``): the reset is queued while the writer is writing the
    acknowledgement; the end of that write must not take the reset's leave to move MD back."""
    clock = Clock()
    cursors = CursorStore(metadata.database, mark_delete_rate_limit=1.0, clock=clock, background=False)
    cursors.save(_record(5))

    def acknowledged() -> CursorRecord:  # the writer builds the record: the consumer seeks meanwhile
        cursors.save_later_from(TOPIC, "s", lambda: _record(2))
        cursors._may_move_back.add((TOPIC, "s"))  # what save_soon_from marks (without writing at once)
        return _record(6)

    cursors.save_later_from(TOPIC, "s", acknowledged)
    clock.now += 2
    assert cursors.write_due() == 1
    assert cursors.load_persisted(TOPIC, "s") == _record(6)
    clock.now += 2
    assert cursors.write_due() == 1  # the reset's record, back to 7:2, is written
    assert cursors.load_persisted(TOPIC, "s") == _record(2)
