"""The ledger layer's metadata: topics, their ledgers, counters (on the shared database).

``MetadataStore`` owns the ``ledger`` component's tables of ``ledger.database.Database``
(the data dir's one SQLite file, shared with the layers above, which own their own tables
through their own stores):

* ``topics``: every topic that exists;
* ``ledgers``: every ledger a topic references, with its role (``data`` ledgers form the
  topic's ledger list; the compactor's ledgers are found through cursor properties), state
  and, once closed, its entry count and size; once offloaded (``ledger.offload``), when its
  bucket copy was verified (``offloaded_at_ms``, Pulsar's ``complete`` + ``timestamp``)
  and when its local copy was let go (``local_deleted_at_ms``, Pulsar's
  ``bookkeeperDeleted``);
* ``counters``: named counters that never repeat across restarts.

Deleting a topic removes, in the same transaction, every row the layers above declared as
the topic's (``Database.forget_topic``); trimming asks the database for the positions the
layers above hold (``Database.held_positions``: durable cursors' mark-delete positions), so
this layer needs to know nothing of cursors.

Ordering rule carried over from Pulsar: a ledger leaves the topic's list here **before**
it is deleted from the ledger store, so a crash in between leaks an orphan ledger (which
start-up collects) but never leaves a reference to a deleted ledger. Likewise a ledger is
recorded offloaded only after its bucket copy was verified, and recorded local-deleted
before its local file is removed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ledger.database import Database, FaultPoint, load_migrations
from ledger.position import Position

__all__ = ["COMPONENT", "MIGRATIONS", "LedgerRecord", "MetadataStore"]

COMPONENT = "ledger"
MIGRATIONS = load_migrations("ledger", COMPONENT)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One ledger of a topic as the metadata store knows it.

    Attributes:
        ledger_id: the ledger.
        topic: the topic that references it.
        role: ``"data"`` for the topic's log; other roles belong to the layers above.
        entries, size_bytes: filled in when the ledger is closed; 0 while it is open.
        created_at_ms, closed_at_ms: times in ms since the epoch; ``closed_at_ms`` 0 = open.
        offloaded_at_ms: when its bucket copy was verified and recorded; 0 = not offloaded.
        local_deleted_at_ms: when its local copy was let go (recorded before the file is
            removed); 0 = the local copy is kept.
    """

    ledger_id: int
    topic: str
    role: str
    entries: int
    size_bytes: int
    created_at_ms: int
    closed_at_ms: int
    offloaded_at_ms: int = 0
    local_deleted_at_ms: int = 0

    @property
    def is_open(self) -> bool:
        """True while the ledger has not been closed."""
        return self.closed_at_ms == 0

    @property
    def offloaded(self) -> bool:
        """Its verified copy is in the bucket (internal stats' ``offloaded``)."""
        return self.offloaded_at_ms != 0

    @property
    def local_deleted(self) -> bool:
        """Its local copy was let go (or is being removed): reads come from the bucket."""
        return self.local_deleted_at_ms != 0


class MetadataStore:
    """The ledger layer's tables on ``database`` (or on a database it opens at a path,
    ``":memory:"`` for tests, which it then owns).

    ``read_only=True`` (with a path) opens an existing, up-to-date database without owning
    it: no migration, no pragma that writes, and every write raises ``MetadataError``.
    """

    def __init__(self, database: Database | str, *, read_only: bool = False) -> None:
        self.database = database if isinstance(database, Database) else Database(database, read_only=read_only)
        self.database.register(COMPONENT, MIGRATIONS)
        self.path = self.database.path
        self.read_only = self.database.read_only

    @property
    def fault_points(self) -> dict[str, FaultPoint]:
        """The shared database's fault points (``ledger.database``: the one fault seam)."""
        return self.database.fault_points

    @property
    def schema_version(self) -> int:
        """The ledger component's schema version (the number of its migrations applied)."""
        return self.database.version(COMPONENT)

    @contextmanager
    def transaction(self, name: str = "", /, **details: object) -> Iterator[sqlite3.Connection]:
        """One atomic write on the shared database (``Database.transaction``)."""
        with self.database.transaction(name, **details) as db:
            yield db

    def checkpoint(self, name: str, /, **details: object) -> None:
        """Run the fault registered under ``name``, if any (``Database.checkpoint``)."""
        self.database.checkpoint(name, **details)

    def _query(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.database.query(sql, parameters)

    def close(self) -> None:
        """Close the shared database; every store on it is unusable afterwards."""
        self.database.close()

    # -- topics ---------------------------------------------------------------------

    def create_topic(self, topic: str, created_at_ms: int) -> bool:
        """Record ``topic``; False when it already existed."""
        with self.transaction() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO topics (name, created_at_ms) VALUES (?, ?)", (topic, created_at_ms)
            )
            return cursor.rowcount == 1

    @staticmethod
    def record_topics(db: sqlite3.Connection, topics: Sequence[str], created_at_ms: int) -> None:
        """Record every topic of ``topics`` (those that exist stay) inside the caller's open
        transaction ``db``; each gets its first ledger when it is first opened."""
        db.executemany("INSERT OR IGNORE INTO topics (name, created_at_ms) VALUES (?, ?)",
                       [(topic, created_at_ms) for topic in topics])

    def topic_exists(self, topic: str) -> bool:
        return bool(self._query("SELECT 1 FROM topics WHERE name = ?", (topic,)))

    def list_topics(self) -> list[str]:
        return [row[0] for row in self._query("SELECT name FROM topics ORDER BY name")]

    def delete_topic(self, topic: str) -> list[int]:
        """Forget ``topic`` with its ledgers and every row the layers above declared as the
        topic's (cursors, topic policies, compaction status), atomically.

        Returns the ids of the ledgers it referenced; the caller deletes them from the
        ledger store afterwards (reference first, data second).
        """
        with self.transaction("ledger.delete_topic", topic=topic) as db:
            ledger_ids = [r[0] for r in db.execute("SELECT ledger_id FROM ledgers WHERE topic = ?", (topic,))]
            db.execute("DELETE FROM ledgers WHERE topic = ?", (topic,))
            self.database.forget_topic(db, topic)
            self.checkpoint("ledger.delete_topic.after_forgetting", topic=topic)
            db.execute("DELETE FROM topics WHERE name = ?", (topic,))
            return ledger_ids

    # -- ledgers --------------------------------------------------------------------

    def add_ledger(self, topic: str, ledger_id: int, *, role: str, created_at_ms: int) -> None:
        """Reference a newly created, open ledger from ``topic``."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO ledgers (ledger_id, topic, role, created_at_ms) VALUES (?, ?, ?, ?)",
                (ledger_id, topic, role, created_at_ms),
            )

    def close_ledger(self, ledger_id: int, *, entries: int, size_bytes: int, closed_at_ms: int) -> None:
        """Record that ``ledger_id`` was sealed with ``entries`` entries of ``size_bytes``."""
        with self.transaction() as db:
            db.execute(
                "UPDATE ledgers SET entries = ?, size_bytes = ?, closed_at_ms = ? WHERE ledger_id = ?",
                (entries, size_bytes, closed_at_ms, ledger_id),
            )

    def remove_ledgers(self, ledger_ids: list[int]) -> None:
        """Drop the references to ``ledger_ids`` (before their data is deleted)."""
        with self.transaction("ledgers.remove", ledger_ids=ledger_ids) as db:
            db.executemany("DELETE FROM ledgers WHERE ledger_id = ?", [(i,) for i in ledger_ids])

    def topic_ledgers(self, topic: str, *, role: str = "data") -> list[LedgerRecord]:
        """The ledgers of ``topic`` with ``role``, ascending by id."""
        rows = self._query(
            "SELECT ledger_id, topic, role, entries, size_bytes, created_at_ms, closed_at_ms, offloaded_at_ms, "
            "local_deleted_at_ms FROM ledgers WHERE topic = ? AND role = ? ORDER BY ledger_id",
            (topic, role),
        )
        return [LedgerRecord(*row) for row in rows]

    def record_offloaded(self, ledger_id: int, offloaded_at_ms: int) -> bool:
        """Record that ``ledger_id``'s bucket copy was verified, in one transaction (fault
        seam ``ledgers.offloaded``); False when no closed ledger of that id is referenced
        any more (trimmed meanwhile: its uploaded objects are nobody's)."""
        with self.transaction("ledgers.offloaded", ledger_id=ledger_id) as db:
            cursor = db.execute(
                "UPDATE ledgers SET offloaded_at_ms = ? WHERE ledger_id = ? AND closed_at_ms != 0",
                (offloaded_at_ms, ledger_id))
            return cursor.rowcount == 1

    def record_local_deleted(self, ledger_ids: Sequence[int], deleted_at_ms: int) -> list[int]:
        """Record, in one transaction (fault seam ``ledgers.local_deleted``), that the local
        copies of the offloaded ``ledger_ids`` go, BEFORE their files are removed; the ids
        so recorded (those still referenced and offloaded)."""
        with self.transaction("ledgers.local_deleted", ledger_ids=list(ledger_ids)) as db:
            recorded = []
            for ledger_id in ledger_ids:
                cursor = db.execute(
                    "UPDATE ledgers SET local_deleted_at_ms = ? WHERE ledger_id = ? AND offloaded_at_ms != 0",
                    (deleted_at_ms, ledger_id))
                if cursor.rowcount == 1:
                    recorded.append(ledger_id)
            return recorded

    def offloaded_ledger_ids(self) -> set[int]:
        """Every referenced ledger recorded offloaded (its bucket objects are live)."""
        return {row[0] for row in self._query("SELECT ledger_id FROM ledgers WHERE offloaded_at_ms != 0")}

    def is_offloaded(self, ledger_id: int) -> bool:
        """Whether ``ledger_id`` is referenced and recorded offloaded."""
        return bool(self._query("SELECT 1 FROM ledgers WHERE ledger_id = ? AND offloaded_at_ms != 0", (ledger_id,)))

    def local_deleted_ledger_ids(self) -> set[int]:
        """Every referenced ledger whose local copy was let go."""
        return {row[0] for row in self._query("SELECT ledger_id FROM ledgers WHERE local_deleted_at_ms != 0")}

    def referenced_ledger_ids(self) -> set[int]:
        """Every ledger id any topic references (for orphan collection)."""
        return {row[0] for row in self._query("SELECT ledger_id FROM ledgers")}

    def held_positions(self, topic: str) -> list[Position]:
        """Persisted positions before which ``topic``'s data must be kept (the layers
        above declared them: durable cursors' mark-delete positions)."""
        return self.database.held_positions(topic)

    # -- counters -----------------------------------------------------------------------

    def next_counter(self, name: str) -> int:
        """Increment counter ``name`` durably and return its new value (first: 0)."""
        with self.transaction() as db:
            db.execute("INSERT INTO counters (name, value) VALUES (?, 0) "
                       "ON CONFLICT (name) DO UPDATE SET value = value + 1", (name,))
            value: int = db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0]
            return value

