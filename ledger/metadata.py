"""The metadata store: one SQLite database (WAL) under the data dir.

It holds what must change atomically and survive a crash, the equivalent of Pulsar's
ZooKeeper records:

* ``topics``: every topic that exists;
* ``ledgers``: every ledger a topic references, with its role (``data`` ledgers form the
  topic's ledger list; the compactor's ledgers are found through cursor properties), state
  and, once closed, its entry count and size;
* ``cursors`` and ``cursor_properties``: each durable cursor's mark-delete position,
  individually acknowledged ranges and mark-delete properties (``dict[str, int]``),
  written **in one transaction** by ``save_cursor``;
* ``policies``: named policy values per scope (a topic or a namespace), as JSON;
* ``compaction_status``: each topic's last compaction status, which survives a restart.

The schema is versioned with ``PRAGMA user_version`` and brought up to date by the
ordered ``MIGRATIONS`` at open; a database from a newer compactd is refused. Writes use
``BEGIN IMMEDIATE`` transactions and ``synchronous=FULL``: a committed change survives a
power cut.

Ordering rule carried over from Pulsar: a ledger leaves the topic's list here **before**
it is deleted from the ledger store, so a crash in between leaks an orphan ledger (which
start-up collects) but never leaves a reference to a deleted ledger.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ledger.errors import MetadataError, SchemaVersionError
from ledger.position import Position

__all__ = ["MIGRATIONS", "CursorRecord", "LedgerRecord", "MetadataStore"]

log = logging.getLogger(__name__)

# SQLite errors a later attempt of the same write may get past: the disk filled up (or
# ``max_page_count`` was reached), an I/O error, another connection held the lock.
_RETRIABLE_SQLITE_ERRORS = frozenset({"SQLITE_FULL", "SQLITE_IOERR", "SQLITE_BUSY", "SQLITE_LOCKED"})

MIGRATIONS: tuple[str, ...] = (
    # 1: topics, their ledgers, durable cursors with properties, policies.
    """
    CREATE TABLE topics (
        name TEXT PRIMARY KEY,
        created_at_ms INTEGER NOT NULL
    );
    CREATE TABLE ledgers (
        ledger_id INTEGER PRIMARY KEY,
        topic TEXT NOT NULL,
        role TEXT NOT NULL,
        entries INTEGER NOT NULL DEFAULT 0,
        size_bytes INTEGER NOT NULL DEFAULT 0,
        created_at_ms INTEGER NOT NULL,
        closed_at_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX ledgers_by_topic ON ledgers (topic, role, ledger_id);
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
    );
    CREATE TABLE policies (
        scope TEXT NOT NULL,
        name TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (scope, name)
    );
    """,
    # 2: the last compaction status of each topic, so that it survives a restart.
    """
    CREATE TABLE compaction_status (
        topic TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        last_error TEXT NOT NULL DEFAULT '',
        updated_at_ms INTEGER NOT NULL
    );
    """,
    # 3: named counters that must never repeat across restarts (the broker instance id).
    """
    CREATE TABLE counters (
        name TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    );
    """,
)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One ledger of a topic as the metadata store knows it.

    Attributes:
        ledger_id: the ledger.
        topic: the topic that references it.
        role: ``"data"`` for the topic's log; other roles belong to the layers above.
        entries, size_bytes: filled in when the ledger is closed; 0 while it is open.
        created_at_ms, closed_at_ms: times in ms since the epoch; ``closed_at_ms`` 0 = open.
    """

    ledger_id: int
    topic: str
    role: str
    entries: int
    size_bytes: int
    created_at_ms: int
    closed_at_ms: int

    @property
    def is_open(self) -> bool:
        """True while the ledger has not been closed."""
        return self.closed_at_ms == 0


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


class MetadataStore:
    """The SQLite metadata database at ``path`` (``":memory:"`` for tests).

    ``read_only=True`` opens an existing, up-to-date database without owning it: no
    migration, no pragma that writes, and every write raises ``MetadataError``.
    """

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = threading.RLock()
        try:
            if read_only:
                self._db = self._connect_read_only(path)
            else:
                self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._migrate()
        except sqlite3.Error as error:
            raise MetadataError(f"cannot open metadata store {path}: {error}") from error
        # Fault points for tests: a callable registered under a name is called at that
        # point inside a transaction; raising there aborts (rolls back) the transaction.
        self.fault_points: dict[str, Callable[[], None]] = {}

    # -- lifecycle and transactions -----------------------------------------------------

    @staticmethod
    def _connect_read_only(path: str) -> sqlite3.Connection:
        """A connection that never writes: for readers of a live data dir (the Spark data
        source), which take no lock. WAL lets them read while the owner writes; they see
        each committed transaction whole. The file must exist (nothing is created)."""
        if not os.path.isfile(path):
            raise MetadataError(f"no metadata store at {path}")
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise SchemaVersionError(
                f"{self.path} has schema version {version}; this compactd knows up to "
                f"{len(MIGRATIONS)}: upgrade compactd"
            )
        if self.read_only:
            if version < len(MIGRATIONS):  # only the owner brings a schema up to date
                raise SchemaVersionError(
                    f"{self.path} has schema version {version}; open it read-write once to upgrade it"
                )
            return
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            self._db.executescript(f"BEGIN IMMEDIATE; {script}; PRAGMA user_version = {number}; COMMIT;")

    @property
    def schema_version(self) -> int:
        """The database's schema version (the number of migrations applied)."""
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: commits on normal exit, rolls back on any exception."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as error:
                raise MetadataError(f"metadata store {self.path}: {error}") from error
            try:
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.Error as error:
                self._rollback()
                raise _metadata_error(self.path, error) from error
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        """Roll back the open transaction, if SQLite has not done so itself: on
        SQLITE_FULL, SQLITE_IOERR or SQLITE_NOMEM it may already have rolled back, and a
        second ROLLBACK would fail and hide the real error. The caller holds ``_lock``."""
        if not self._db.in_transaction:
            return
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error as error:  # the caller's error is the one to report
            log.error("metadata store %s: rollback failed: %s", self.path, error)

    def checkpoint(self, name: str) -> None:
        """Run the fault registered under ``name``, if any (test seam)."""
        fault = self.fault_points.get(name)
        if fault is not None:
            fault()

    def _query(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, parameters).fetchall()
            except sqlite3.Error as error:
                raise _metadata_error(self.path, error) from error

    def close(self) -> None:
        """Close the connection; the store is unusable afterwards."""
        with self._lock:
            self._db.close()

    # -- topics ---------------------------------------------------------------------

    def create_topic(self, topic: str, created_at_ms: int) -> bool:
        """Record ``topic``; False when it already existed."""
        with self.transaction() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO topics (name, created_at_ms) VALUES (?, ?)", (topic, created_at_ms)
            )
            return cursor.rowcount == 1

    def topic_exists(self, topic: str) -> bool:
        return bool(self._query("SELECT 1 FROM topics WHERE name = ?", (topic,)))

    def list_topics(self) -> list[str]:
        return [row[0] for row in self._query("SELECT name FROM topics ORDER BY name")]

    def delete_topic(self, topic: str) -> list[int]:
        """Forget ``topic`` with its ledgers, cursors and topic policies, atomically.

        Returns the ids of the ledgers it referenced; the caller deletes them from the
        ledger store afterwards (reference first, data second).
        """
        with self.transaction() as db:
            ledger_ids = [r[0] for r in db.execute("SELECT ledger_id FROM ledgers WHERE topic = ?", (topic,))]
            db.execute("DELETE FROM ledgers WHERE topic = ?", (topic,))
            db.execute("DELETE FROM cursors WHERE topic = ?", (topic,))
            db.execute("DELETE FROM cursor_properties WHERE topic = ?", (topic,))
            db.execute("DELETE FROM policies WHERE scope = ?", (topic,))
            db.execute("DELETE FROM compaction_status WHERE topic = ?", (topic,))
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
        with self.transaction() as db:
            db.executemany("DELETE FROM ledgers WHERE ledger_id = ?", [(i,) for i in ledger_ids])

    def topic_ledgers(self, topic: str, *, role: str = "data") -> list[LedgerRecord]:
        """The ledgers of ``topic`` with ``role``, ascending by id."""
        rows = self._query(
            "SELECT ledger_id, topic, role, entries, size_bytes, created_at_ms, closed_at_ms "
            "FROM ledgers WHERE topic = ? AND role = ? ORDER BY ledger_id",
            (topic, role),
        )
        return [LedgerRecord(*row) for row in rows]

    def referenced_ledger_ids(self) -> set[int]:
        """Every ledger id any topic references (for orphan collection)."""
        return {row[0] for row in self._query("SELECT ledger_id FROM ledgers")}

    # -- cursors ----------------------------------------------------------------------

    def save_cursor(self, record: CursorRecord) -> None:
        """Persist position, ranges and properties of a cursor **in one transaction**."""
        md = record.mark_delete_position
        ranges = json.dumps([list(r) for r in record.individually_deleted])
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO cursors (topic, name, mark_delete_ledger_id, "
                "mark_delete_entry_id, individually_deleted, last_active_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (record.topic, record.name, md.ledger_id, md.entry_id, ranges, record.last_active_ms),
            )
            self.checkpoint("save_cursor.between_position_and_properties")
            db.execute(
                "DELETE FROM cursor_properties WHERE topic = ? AND cursor = ?", (record.topic, record.name)
            )
            db.executemany(
                "INSERT INTO cursor_properties (topic, cursor, key, value) VALUES (?, ?, ?, ?)",
                [(record.topic, record.name, k, int(v)) for k, v in sorted(record.properties.items())],
            )

    def load_cursor(self, topic: str, name: str) -> CursorRecord | None:
        """The persisted state of cursor ``name`` on ``topic``, or None."""
        with self._lock:
            rows = self._query(
                "SELECT mark_delete_ledger_id, mark_delete_entry_id, individually_deleted, "
                "last_active_ms FROM cursors WHERE topic = ? AND name = ?",
                (topic, name),
            )
            if not rows:
                return None
            properties = self._query(
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

    def list_cursors(self, topic: str) -> list[str]:
        """Names of the durable cursors of ``topic``, sorted."""
        return [r[0] for r in self._query("SELECT name FROM cursors WHERE topic = ? ORDER BY name", (topic,))]

    def mark_delete_positions(self, topic: str) -> dict[str, Position]:
        """Persisted mark-delete position of every durable cursor of ``topic``."""
        rows = self._query(
            "SELECT name, mark_delete_ledger_id, mark_delete_entry_id FROM cursors WHERE topic = ?",
            (topic,),
        )
        return {name: Position(ledger_id, entry_id) for name, ledger_id, entry_id in rows}

    def cursor_property_values(self, cursor: str, key: str) -> set[int]:
        """Values of property ``key`` over every topic's cursor named ``cursor``."""
        rows = self._query("SELECT value FROM cursor_properties WHERE cursor = ? AND key = ?", (cursor, key))
        return {row[0] for row in rows}

    def delete_cursor(self, topic: str, name: str) -> bool:
        """Forget cursor ``name``; False when it did not exist."""
        with self.transaction() as db:
            db.execute("DELETE FROM cursor_properties WHERE topic = ? AND cursor = ?", (topic, name))
            return db.execute("DELETE FROM cursors WHERE topic = ? AND name = ?", (topic, name)).rowcount == 1

    # -- policies ---------------------------------------------------------------------

    def set_policy(self, scope: str, name: str, value: Any) -> None:
        """Set policy ``name`` of ``scope`` (a topic or ``tenant/namespace``) to ``value``."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO policies (scope, name, value) VALUES (?, ?, ?)",
                (scope, name, json.dumps(value)),
            )

    def get_policy(self, scope: str, name: str) -> Any | None:
        """The value of policy ``name`` of ``scope``, or None when unset."""
        rows = self._query("SELECT value FROM policies WHERE scope = ? AND name = ?", (scope, name))
        return json.loads(rows[0][0]) if rows else None

    def remove_policy(self, scope: str, name: str) -> bool:
        """Unset policy ``name`` of ``scope``; False when it was not set."""
        with self.transaction() as db:
            return db.execute("DELETE FROM policies WHERE scope = ? AND name = ?", (scope, name)).rowcount == 1

    # -- counters -----------------------------------------------------------------------

    def next_counter(self, name: str) -> int:
        """Increment counter ``name`` durably and return its new value (first: 0)."""
        with self.transaction() as db:
            db.execute("INSERT INTO counters (name, value) VALUES (?, 0) "
                       "ON CONFLICT (name) DO UPDATE SET value = value + 1", (name,))
            value: int = db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0]
            return value

    # -- compaction status ------------------------------------------------------------

    def set_compaction_status(self, topic: str, status: str, last_error: str, updated_at_ms: int) -> None:
        """Record the status of ``topic``'s last or current compaction run."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO compaction_status (topic, status, last_error, updated_at_ms) "
                "VALUES (?, ?, ?, ?)",
                (topic, status, last_error, updated_at_ms),
            )

    def compaction_status(self, topic: str) -> tuple[str, str] | None:
        """``(status, last_error)`` of ``topic``'s last run, or None when it never ran."""
        rows = self._query("SELECT status, last_error FROM compaction_status WHERE topic = ?", (topic,))
        return (rows[0][0], rows[0][1]) if rows else None

    def topics_with_status(self, status: str) -> list[str]:
        """Every topic whose recorded compaction status is ``status``, sorted."""
        rows = self._query("SELECT topic FROM compaction_status WHERE status = ? ORDER BY topic", (status,))
        return [row[0] for row in rows]


def _metadata_error(path: str, error: sqlite3.Error) -> MetadataError:
    """``error`` as a ``MetadataError``; ``retriable`` when a later attempt may succeed."""
    failure = MetadataError(f"metadata store {path}: {error}")
    name = getattr(error, "sqlite_errorname", "")
    failure.retriable = any(name == code or name.startswith(code + "_") for code in _RETRIABLE_SQLITE_ERRORS)
    return failure
