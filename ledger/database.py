"""The shared metadata database: one SQLite file (WAL) on which every layer keeps its tables.

The file is the data dir's ``metadata.db``. It holds what must change atomically and
survive a crash, the equivalent of Pulsar's ZooKeeper records. This module owns the
connection, not the tables: each layer owns its tables through its own store, built on the
one ``Database``, and brings them up to date with its own migrations:

* ``ledger``: topics, ledgers, counters (``ledger.metadata.MetadataStore``);
* ``cursor``: durable cursors and their properties (``cursor.store.CursorStore``);
* ``policies``: policy values per scope (``api.broker.policies.PolicyStore``);
* ``compaction``: the last compaction status of each topic
  (``compactor.runs.status.CompactionStatusStore``);
* ``permissions``: produce/consume grants of roles (``api.broker.grants.GrantStore``).

The file is created owner-only (0600); SQLite gives its ``-wal`` and ``-shm`` the same mode.
* ``schemas``: schema versions per base topic (``api.broker.schemas.SchemaRegistry``).

**Versions.** A component's migrations are SQL files shipped in its package,
``sql/<component>/NNN_<what>.sql`` (``load_migrations`` reads them; ``NNN`` is the version the
file brings, and a shipped file is never edited: a change of tables is the next number).
``Database.register(component, migrations, ...)`` applies the component's migrations it has
not yet had, each in one transaction with its version row in
``schema_versions(component, version)``; a component version newer than the code knows is
refused (``SchemaVersionError``). ``PRAGMA user_version`` names the *layout* (``LAYOUT``:
per-component versions); a file from the single-list era (user_version 1–3, one
``MIGRATIONS`` tuple) is converted in place, keeping every row, the first time it is opened
read-write. A read-only database refuses a layout or component version it would have to
upgrade.

**Rows owned per topic.** A layer that keeps rows per topic declares the table at
registration (``TopicTable``); the declaration is persisted, so that deleting a topic
(``forget_topic``, inside the ledger layer's delete transaction) removes every layer's rows
atomically even in a process that never loaded that layer, and a table whose rows hold a
topic's data against trimming (durable cursors' mark-delete positions) is read by
``held_positions`` without the ledger layer knowing what a cursor is.

**Atomicity.** Writes go through ``transaction(name)`` (``BEGIN IMMEDIATE`` with
``synchronous=FULL``: a committed change survives a power cut). A write spanning layers
shares one transaction: a store's method may take the open connection of its caller's
transaction.

**Reads.** A SELECT through ``query`` from a thread outside a transaction goes through a
second, read-only connection (WAL: it sees every committed transaction whole), so a read on
the broker's event loop never waits for another thread's commit and its fsync; a thread
inside a transaction (or ``reading``) reads through its transaction (its own uncommitted
rows included), and any other statement (a PRAGMA) goes through the writing connection.

**Faults: the one seam.** Tests inject faults into the metadata through
``Database.fault_points`` only, never by replacing a store's methods. A callable registered
under a name is called with the operation's keyword details at that point:
``"<name>.before"`` before a named transaction begins (raising: nothing was written — a
crash before the write), ``"<name>.after"`` after it commits (raising: written, yet the
caller sees a failure — a crash right after the commit; sleeping: a slow write), and the
named ``checkpoint``s inside a transaction (raising: rolled back). Ledger I/O faults go
through ``ledger.storage.faulty.FaultyLedgerStore``.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import re
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ledger.errors import MetadataError, SchemaVersionError
from ledger.position import Position

__all__ = ["LAYOUT", "Database", "FaultPoint", "TopicTable", "load_migrations"]

log = logging.getLogger(__name__)

LAYOUT = 4
"""``PRAGMA user_version`` of a per-component database; 1–3 were the single-list layout."""

FaultPoint = Callable[..., None]
"""A fault: called with the operation's keyword details; raise to fail it."""

# SQLite errors a later attempt of the same write may get past: the disk filled up (or
# ``max_page_count`` was reached), an I/O error, another connection held the lock.
_RETRIABLE_SQLITE_ERRORS = frozenset({"SQLITE_FULL", "SQLITE_IOERR", "SQLITE_BUSY", "SQLITE_LOCKED"})
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
_MIGRATION_FILE = re.compile(r"([0-9]{3})_[a-z0-9_]+\.sql")

_BOOKKEEPING = """
    CREATE TABLE IF NOT EXISTS schema_versions (
        component TEXT PRIMARY KEY,
        version INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS topic_tables (
        table_name TEXT PRIMARY KEY,
        component TEXT NOT NULL,
        topic_column TEXT NOT NULL,
        hold_ledger_column TEXT NOT NULL DEFAULT '',
        hold_entry_column TEXT NOT NULL DEFAULT ''
    );
"""


@dataclass(frozen=True, slots=True)
class TopicTable:
    """A table whose rows belong to one topic (deleted with it).

    Attributes:
        name: the table.
        topic_column: the column naming the topic.
        hold: ``(ledger_id column, entry_id column)`` of a position before which the
            topic's data must not be trimmed, or None.
    """

    name: str
    topic_column: str
    hold: tuple[str, str] | None = None


# What the single-list layout (user_version 1..3) had, per component: (component, version,
# first user_version that had it), and its tables owned per topic.
_LEGACY_VERSIONS = (("ledger", 1, 1), ("cursor", 1, 1), ("policies", 1, 1), ("compaction", 1, 2), ("ledger", 2, 3))
_LEGACY_TOPIC_TABLES = (
    ("cursor", TopicTable("cursors", "topic", ("mark_delete_ledger_id", "mark_delete_entry_id"))),
    ("cursor", TopicTable("cursor_properties", "topic")),
    ("policies", TopicTable("policies", "scope")),
    ("compaction", TopicTable("compaction_status", "topic")),
)


class Database:
    """The SQLite database at ``path`` (``":memory:"`` for tests), shared by every layer.

    ``read_only=True`` opens an existing, up-to-date database without owning it: no
    migration, no pragma that writes, and every write raises ``MetadataError``.
    """

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._lock = threading.RLock()
        self.fault_points: dict[str, FaultPoint] = {}
        try:
            if read_only:
                self._db = self._connect_read_only(path)
            else:
                _create_owner_only(path)
                self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._open_layout()
            self._reader = None if read_only or not os.path.isfile(path) else self._connect_read_only(path)
        except sqlite3.Error as error:
            raise MetadataError(f"cannot open metadata store {path}: {error}") from error
        self._read_lock = threading.Lock()  # the reader connection's; never held across a commit

    @staticmethod
    def _connect_read_only(path: str) -> sqlite3.Connection:
        """A connection that never writes: for readers of a live data dir (the Spark data
        source), which take no lock. WAL lets them read while the owner writes; they see
        each committed transaction whole. The file must exist (nothing is created)."""
        if not os.path.isfile(path):
            raise MetadataError(f"no metadata store at {path}")
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)

    # -- layout and component versions ----------------------------------------------------

    def _open_layout(self) -> None:
        """Check the layout; read-write, create it or convert a single-list database."""
        layout = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if layout > LAYOUT:
            raise SchemaVersionError(
                f"{self.path} has layout version {layout}; this compactd knows up to {LAYOUT}: upgrade compactd"
            )
        if layout == LAYOUT:
            return
        if self.read_only:  # only the owner brings a schema up to date
            raise SchemaVersionError(
                f"{self.path} has layout version {layout}; open it read-write once to upgrade it"
            )
        script = [_BOOKKEEPING]
        for component, version, since in _LEGACY_VERSIONS:
            if layout >= since:
                script.append(f"INSERT OR REPLACE INTO schema_versions VALUES ('{component}', {version});")
        if layout:
            script.extend(_declare_sql(component, table) for component, table in _LEGACY_TOPIC_TABLES)
        self._db.executescript(f"BEGIN IMMEDIATE; {''.join(script)} PRAGMA user_version = {LAYOUT}; COMMIT;")
        if layout:
            log.info("metadata store %s: converted layout %d to per-component versions", self.path, layout)

    def register(self, component: str, migrations: Sequence[str], *, topic_tables: Sequence[TopicTable] = ()) -> None:
        """Bring ``component``'s tables up to date with ``migrations`` (ordered; version N
        = the first N applied), and declare its ``topic_tables``.

        Raises ``SchemaVersionError`` when the file has a newer version of the component,
        or (read-only) an older one.
        """
        with self._lock:
            try:
                version = self.version(component)
                self._check_version(component, version, len(migrations))
                if self.read_only:
                    return
                for number, script in enumerate(migrations[version:], start=version + 1):
                    self._db.executescript(
                        f"BEGIN IMMEDIATE; {script}; "
                        f"INSERT OR REPLACE INTO schema_versions VALUES ('{_checked(component)}', {number}); COMMIT;"
                    )
                declared = set(self.query(
                    "SELECT table_name, topic_column, hold_ledger_column, hold_entry_column FROM topic_tables "
                    "WHERE component = ?", (component,)))
                missing = [table for table in topic_tables if _row(table) not in declared]
                if missing:
                    declarations = "".join(_declare_sql(component, table) for table in missing)
                    self._db.executescript(f"BEGIN IMMEDIATE; {declarations} COMMIT;")
            except sqlite3.Error as error:
                self._rollback()
                raise _metadata_error(self.path, error) from error

    def _check_version(self, component: str, version: int, known: int) -> None:
        if version > known:
            raise SchemaVersionError(
                f"{self.path} has {component} schema version {version}; this compactd knows up to "
                f"{known}: upgrade compactd"
            )
        if self.read_only and version < known:
            raise SchemaVersionError(
                f"{self.path} has {component} schema version {version}; open it read-write once to upgrade it"
            )

    def version(self, component: str) -> int:
        """The schema version of ``component`` in the file (0: none of its migrations)."""
        rows = self.query("SELECT version FROM schema_versions WHERE component = ?", (component,))
        return int(rows[0][0]) if rows else 0

    @property
    def layout(self) -> int:
        """``PRAGMA user_version``: ``LAYOUT`` once open."""
        return int(self.query("PRAGMA user_version")[0][0])

    # -- transactions and queries ---------------------------------------------------------

    @contextmanager
    def transaction(self, name: str = "", /, **details: object) -> Iterator[sqlite3.Connection]:
        """One atomic write: commits on normal exit, rolls back on any exception.

        A ``name`` makes it a fault seam: ``<name>.before`` runs before it begins and
        ``<name>.after`` after it commits, each called with ``details``.
        """
        if name:
            self.checkpoint(f"{name}.before", **details)
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as error:
                raise _metadata_error(self.path, error) from error
            try:
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.Error as error:
                self._rollback()
                raise _metadata_error(self.path, error) from error
            except BaseException:
                self._rollback()
                raise
        if name:
            self.checkpoint(f"{name}.after", **details)

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

    def checkpoint(self, name: str, /, **details: object) -> None:
        """Run the fault registered under ``name``, if any, with ``details``."""
        fault = self.fault_points.get(name)
        if fault is not None:
            fault(**details)

    def query(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement; ``MetadataError`` on failure. A SELECT from a thread
        outside any transaction (and ``reading``) reads the last committed state through
        the reader connection (WAL), without waiting for a commit in progress on another
        thread (its fsync may take long: the event loop must not wait for it); anything
        else (a PRAGMA, a read inside the caller's own transaction) goes through the
        connection that writes."""
        if (self._reader is not None and sql.lstrip()[:6].upper() == "SELECT"
                and not self._lock._is_owned()):  # type: ignore[attr-defined]
            with self._read_lock:
                try:
                    return self._reader.execute(sql, parameters).fetchall()
                except sqlite3.Error as error:
                    raise _metadata_error(self.path, error) from error
        with self._lock:
            try:
                return self._db.execute(sql, parameters).fetchall()
            except sqlite3.Error as error:
                raise _metadata_error(self.path, error) from error

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the connection for several queries that must see one state: one read
        transaction (WAL: one snapshot, even while another process commits), unless a
        transaction is already open on the connection. No write may be made inside."""
        with self._lock:
            if self._db.in_transaction:
                yield
                return
            try:
                self._db.execute("BEGIN DEFERRED")
            except sqlite3.Error as error:
                raise _metadata_error(self.path, error) from error
            try:
                yield
            finally:
                self._rollback()

    @contextmanager
    def backed_up_to(self, path: str) -> Iterator[None]:
        """Copy the database to the new file ``path`` with SQLite's online backup API, and
        hold every write of this process off until the block ends: what the block does
        (linking the files the copy references) sees the state the copy holds."""
        with self._lock:
            _create_owner_only(path)
            try:
                target = sqlite3.connect(path)
                try:
                    self._db.backup(target)
                finally:
                    target.close()
            except sqlite3.Error as error:
                raise _metadata_error(self.path, error) from error
            yield

    def close(self) -> None:
        """Close the connection; the database is unusable afterwards."""
        with self._lock, self._read_lock:
            if self._reader is not None:
                self._reader.close()
            self._db.close()

    # -- rows owned per topic -------------------------------------------------------------

    def _topic_tables(self) -> list[tuple[str, str, str, str]]:
        """The declared topic tables: (table, topic column, hold ledger/entry columns or "")."""
        rows = self.query("SELECT table_name, topic_column, hold_ledger_column, hold_entry_column FROM topic_tables")
        return [(_checked(table), _checked(column), ledger_column and _checked(ledger_column),
                 entry_column and _checked(entry_column)) for table, column, ledger_column, entry_column in rows]

    def forget_topic(self, db: sqlite3.Connection, topic: str) -> None:
        """Inside the caller's transaction ``db``: delete every declared row of ``topic``."""
        for table, column, _, _ in self._topic_tables():
            db.execute(f"DELETE FROM {table} WHERE {column} = ?", (topic,))

    def held_positions(self, topic: str) -> list[Position]:
        """Every persisted position before which ``topic``'s data must be kept."""
        positions: list[Position] = []
        for table, column, ledger_column, entry_column in self._topic_tables():
            if ledger_column:
                rows = self.query(
                    f"SELECT {ledger_column}, {entry_column} FROM {table} WHERE {column} = ?",
                    (topic,),
                )
                positions.extend(Position(ledger_id, entry_id) for ledger_id, entry_id in rows)
        return positions


def load_migrations(package: str, component: str) -> tuple[str, ...]:
    """``component``'s migrations for ``Database.register``, in version order: the SQL
    files ``sql/<component>/NNN_<what>.sql`` of ``package`` (``NNN`` from 001, no gap),
    each as it is written. Raises ``MetadataError`` for a misnamed or misnumbered file."""
    folder = importlib.resources.files(package) / "sql" / component
    if not folder.is_dir():
        raise MetadataError(f"{package}: no migrations of {component} (sql/{component}/ is missing)")
    scripts: dict[int, str] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _MIGRATION_FILE.fullmatch(entry.name)
        if match is None or int(match[1]) in scripts:
            raise MetadataError(f"{package}: {entry.name} is not one migration NNN_<what>.sql of {component}")
        scripts[int(match[1])] = entry.read_text(encoding="utf-8")
    if not scripts or sorted(scripts) != list(range(1, len(scripts) + 1)):
        raise MetadataError(f"{package}: the migrations of {component} are not numbered 001 to {len(scripts):03d}")
    return tuple(scripts[number] for number in sorted(scripts))


def _create_owner_only(path: str) -> None:
    """Create the database file at ``path`` (not ``:memory:``) readable by its owner only,
    if it is missing; SQLite gives its ``-wal`` and ``-shm`` files the same mode."""
    if path == ":memory:" or path.startswith("file:") or os.path.exists(path):
        return
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as error:
        raise MetadataError(f"cannot create metadata store {path}: {error.strerror or error}") from error


def _checked(identifier: str) -> str:
    """``identifier`` if it is a plain lower-case SQL name (they come from code or the file)."""
    if not _IDENTIFIER.fullmatch(identifier):
        raise MetadataError(f"not a table or column name: {identifier!r}")
    return identifier


def _row(table: TopicTable) -> tuple[str, str, str, str]:
    """``table`` as its ``topic_tables`` row (less the component)."""
    ledger_column, entry_column = table.hold or ("", "")
    return (table.name, table.topic_column, ledger_column, entry_column)


def _declare_sql(component: str, table: TopicTable) -> str:
    values = (component, *_row(table))
    checked = [_checked(value) if value else "" for value in values]
    return (
        "INSERT OR REPLACE INTO topic_tables (component, table_name, topic_column, hold_ledger_column, "
        "hold_entry_column) VALUES ({});".format(", ".join(f"'{value}'" for value in checked))
    )


def _metadata_error(path: str, error: sqlite3.Error) -> MetadataError:
    """``error`` as a ``MetadataError``; ``retriable`` when a later attempt may succeed."""
    failure = MetadataError(f"metadata store {path}: {error}")
    name = getattr(error, "sqlite_errorname", "")
    failure.retriable = any(name == code or name.startswith(code + "_") for code in _RETRIABLE_SQLITE_ERRORS)
    return failure
