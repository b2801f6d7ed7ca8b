"""A cursor save's ``also`` hook: a layer above writes its rows in the cursor's own
transaction (the compactor's manifest with the ``__compaction`` mark-delete)."""

from __future__ import annotations

import sqlite3

import pytest

from cursor import CursorError, InitialPosition, ManagedCursor
from cursor.store import CursorStore
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.metadata import MetadataStore
from ledger.position import Position
from ledger.storage import LedgerStore

TOPIC = "persistent://public/default/also"


def _setup(store: LedgerStore, metadata: MetadataStore) -> tuple[ManagedLedger, CursorStore]:
    ml = ManagedLedger.open(TOPIC, store, metadata, ManagedLedgerConfig(max_entries_per_ledger=3))
    for index in range(5):
        ml.append(b"m%d" % index).result(timeout=10)
    with metadata.database.transaction() as db:
        db.execute("CREATE TABLE IF NOT EXISTS extra (value INTEGER)")
    return ml, CursorStore(metadata.database)


def _extra(metadata: MetadataStore) -> list[int]:
    return [row[0] for row in metadata.database.query("SELECT value FROM extra ORDER BY value")]


def test_statements_of_also_commit_with_the_mark_delete_or_not_at_all(store: LedgerStore, metadata: MetadataStore) -> None:
    ml, cursors = _setup(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "c", InitialPosition.EARLIEST, store=cursors)
    first = ml.first_position()
    target = ml.next_valid_position(ml.next_valid_position(first))

    def insert(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO extra VALUES (1)")

    def insert_then_fail(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO extra VALUES (2)")
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        cursor.mark_delete(target, {"p": 7}, also=insert_then_fail)
    record = cursors.load_persisted(TOPIC, "c")
    assert record is not None and record.mark_delete_position == first and record.properties == {}
    assert cursor.mark_delete_position == first and _extra(metadata) == []  # memory unchanged too

    cursor.mark_delete(target, {"p": 7}, also=insert)
    record = cursors.load_persisted(TOPIC, "c")
    assert record is not None and record.mark_delete_position == target and record.properties == {"p": 7}
    assert _extra(metadata) == [1]

    with pytest.raises(OSError, match="refused"):  # a failed delete keeps the cursor
        cursor.delete_durable(also=insert_then_fail)
    assert cursors.load_persisted(TOPIC, "c") is not None and _extra(metadata) == [1]
    cursor.delete_durable(also=insert)
    assert cursors.load_persisted(TOPIC, "c") is None and _extra(metadata) == [1, 1]


def test_a_deferred_cursor_refuses_also(store: LedgerStore, metadata: MetadataStore) -> None:
    ml, cursors = _setup(store, metadata)
    cursor = ManagedCursor.open_durable(ml, "d", InitialPosition.EARLIEST, store=cursors, deferred=True)
    with pytest.raises(CursorError, match="persisted at once"):
        cursor.mark_delete(Position(ml.first_position().ledger_id, 0), also=lambda db: None)
    assert cursor.mark_delete_position == ml.first_position()
