"""The compactor's table on the shared metadata database: each topic's compaction status.

``CompactionStatusStore`` owns the ``compaction`` component of ``ledger.database.Database``:
the status (and last error) of each topic's last or current compaction run, which survives
a restart. The rows are declared as the topic's, so deleting the topic removes them in the
ledger layer's delete transaction. Writes are the named transaction ``compaction.status``
(fault points: ``ledger.database``).
"""

from __future__ import annotations

from ledger.database import Database, TopicTable, load_migrations

__all__ = ["COMPONENT", "MIGRATIONS", "CompactionStatusStore"]

COMPONENT = "compaction"
MIGRATIONS = load_migrations("compactor.runs", COMPONENT)


class CompactionStatusStore:
    """The compaction status of each topic, kept in ``database``."""

    def __init__(self, database: Database) -> None:
        self.database = database
        database.register(COMPONENT, MIGRATIONS, topic_tables=(TopicTable("compaction_status", "topic"),))

    def set_compaction_status(self, topic: str, status: str, last_error: str, updated_at_ms: int) -> None:
        """Record the status of ``topic``'s last or current compaction run."""
        with self.database.transaction("compaction.status", topic=topic, status=status) as db:
            db.execute(
                "INSERT OR REPLACE INTO compaction_status (topic, status, last_error, updated_at_ms) "
                "VALUES (?, ?, ?, ?)",
                (topic, status, last_error, updated_at_ms),
            )

    def compaction_status(self, topic: str) -> tuple[str, str] | None:
        """``(status, last_error)`` of ``topic``'s last run, or None when it never ran."""
        rows = self.database.query("SELECT status, last_error FROM compaction_status WHERE topic = ?", (topic,))
        return (rows[0][0], rows[0][1]) if rows else None

    def topics_with_status(self, status: str) -> list[str]:
        """The topics whose last recorded status is ``status``, sorted."""
        rows = self.database.query("SELECT topic FROM compaction_status WHERE status = ? ORDER BY topic", (status,))
        return [row[0] for row in rows]
