"""The cursor layer's tables on the shared metadata database: durable cursors.

``CursorStore`` owns the ``cursor`` component of ``ledger.database.Database``:

* ``cursors``: each durable cursor's mark-delete position, individually acknowledged
  ranges and when it was last saved;
* ``cursor_properties``: its mark-delete properties (``dict[str, int]``), written with the
  position **in one transaction** by ``save``.

Both tables are declared as the topic's rows (deleted with the topic, in the ledger
layer's delete transaction), and ``cursors``' mark-delete position as a hold: the managed
ledger never trims past the slowest one, persisted.

``ManagedCursor`` gets its store injected (``store=``); nothing else reads or writes these
rows but through this class. Faults are injected through the database's fault points
(``ledger.database``): the transactions here are named ``cursor.save`` (with a
``cursor.save.between_position_and_properties`` checkpoint inside) and ``cursor.delete``.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ledger.database import Database, TopicTable
from ledger.position import Position

__all__ = ["COMPONENT", "MIGRATIONS", "TOPIC_TABLES", "CursorRecord", "CursorStore"]

COMPONENT = "cursor"
MIGRATIONS: tuple[str, ...] = (
    # 1: durable cursors with their properties.
    """
    CREATE TABLE cursors (
        topic TEXT NOT NULL,
        name TEXT NOT NULL,
        mark_delete_ledger_id INTEGER NOT NULL,
        mark_delete_entry_id INTEGER NOT NULL,
        individually_deleted TEXT NOT NULL,
        last_active_ms INTEGER NOT NULL,
        PRIMARY KEY (topic, name)
    );
    CREATE TABLE cursor_properties (
        topic TEXT NOT NULL,
        cursor TEXT NOT NULL,
        key TEXT NOT NULL,
        value INTEGER NOT NULL,
        PRIMARY KEY (topic, cursor, key)
    )
    """,
)
TOPIC_TABLES = (
    TopicTable("cursors", "topic", hold=("mark_delete_ledger_id", "mark_delete_entry_id")),
    TopicTable("cursor_properties", "topic"),
)


@dataclass(frozen=True, slots=True)
class CursorRecord:
    """A durable cursor's persisted state.

    Attributes:
        topic, name: which cursor.
        mark_delete_position: every entry at or before it is acknowledged.
        individually_deleted: acknowledged ranges after it, as inclusive
            ``(ledger_id, first_entry_id, last_entry_id)`` triples.
        properties: the mark-delete properties, versioned with the position.
        last_active_ms: when the cursor was last saved.
    """

    topic: str
    name: str
    mark_delete_position: Position
    individually_deleted: tuple[tuple[int, int, int], ...] = ()
    properties: Mapping[str, int] = field(default_factory=dict)
    last_active_ms: int = 0


class CursorStore:
    """The durable cursors kept in ``database`` (whose cursor tables it brings up to date)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        database.register(COMPONENT, MIGRATIONS, topic_tables=TOPIC_TABLES)

    def save(self, record: CursorRecord) -> None:
        """Persist position, ranges and properties of a cursor **in one transaction**."""
        md = record.mark_delete_position
        ranges = json.dumps([list(r) for r in record.individually_deleted])
        with self.database.transaction("cursor.save", record=record) as db:
            db.execute(
                "INSERT OR REPLACE INTO cursors (topic, name, mark_delete_ledger_id, "
                "mark_delete_entry_id, individually_deleted, last_active_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (record.topic, record.name, md.ledger_id, md.entry_id, ranges, record.last_active_ms),
            )
            self.database.checkpoint("cursor.save.between_position_and_properties", record=record)
            db.execute(
                "DELETE FROM cursor_properties WHERE topic = ? AND cursor = ?", (record.topic, record.name)
            )
            db.executemany(
                "INSERT INTO cursor_properties (topic, cursor, key, value) VALUES (?, ?, ?, ?)",
                [(record.topic, record.name, k, int(v)) for k, v in sorted(record.properties.items())],
            )

    def load(self, topic: str, name: str) -> CursorRecord | None:
        """The persisted state of cursor ``name`` on ``topic``, or None."""
        with self.database.reading():
            rows = self.database.query(
                "SELECT mark_delete_ledger_id, mark_delete_entry_id, individually_deleted, "
                "last_active_ms FROM cursors WHERE topic = ? AND name = ?",
                (topic, name),
            )
            if not rows:
                return None
            properties = self.database.query(
                "SELECT key, value FROM cursor_properties WHERE topic = ? AND cursor = ?", (topic, name)
            )
        ledger_id, entry_id, ranges, last_active_ms = rows[0]
        return CursorRecord(
            topic=topic,
            name=name,
            mark_delete_position=Position(ledger_id, entry_id),
            individually_deleted=tuple(tuple(r) for r in json.loads(ranges)),
            properties={key: value for key, value in properties},
            last_active_ms=last_active_ms,
        )

    def list(self, topic: str) -> builtins.list[str]:
        """Names of the durable cursors of ``topic``, sorted."""
        rows = self.database.query("SELECT name FROM cursors WHERE topic = ? ORDER BY name", (topic,))
        return [row[0] for row in rows]

    def mark_delete_positions(self, topic: str) -> dict[str, Position]:
        """Persisted mark-delete position of every durable cursor of ``topic``."""
        rows = self.database.query(
            "SELECT name, mark_delete_ledger_id, mark_delete_entry_id FROM cursors WHERE topic = ?",
            (topic,),
        )
        return {name: Position(ledger_id, entry_id) for name, ledger_id, entry_id in rows}

    def cursor_property_values(self, cursor: str, key: str) -> set[int]:
        """Values of property ``key`` over every topic's cursor named ``cursor``."""
        rows = self.database.query(
            "SELECT value FROM cursor_properties WHERE cursor = ? AND key = ?", (cursor, key)
        )
        return {row[0] for row in rows}

    def delete(self, topic: str, name: str) -> bool:
        """Forget cursor ``name``; False when it did not exist."""
        with self.database.transaction("cursor.delete", topic=topic, name=name) as db:
            db.execute("DELETE FROM cursor_properties WHERE topic = ? AND cursor = ?", (topic, name))
            return db.execute("DELETE FROM cursors WHERE topic = ? AND name = ?", (topic, name)).rowcount == 1
