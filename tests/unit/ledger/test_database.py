"""The shared metadata database: per-component versions, the conversion of a single-list
database, read-only refusals, rows owned per topic, and the named fault points.

A database of the single-list layout (``PRAGMA user_version`` 1 to 3) is built here from
the migrations that layout had, copied below as they were, then opened by this code.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from api.broker.policies import PolicyStore
from compactor.runs.status import CompactionStatusStore
from cursor.store import CursorRecord, CursorStore
from ledger.data_dir import DataDir
from ledger.database import LAYOUT, Database
from ledger.errors import MetadataError, SchemaVersionError
from ledger.metadata import MIGRATIONS as LEDGER_MIGRATIONS
from ledger.metadata import MetadataStore
from ledger.position import Position

TOPIC = "persistent://public/default/t"
OTHER = "persistent://public/default/other"

# The single MIGRATIONS list of compactd before per-component versions (ledger/metadata.py).
SINGLE_LIST_MIGRATIONS = (
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


def _single_list_database(path: Path, version: int) -> None:
    """A metadata.db as the single-list code left it at ``version``, with a row in each table."""
    db = sqlite3.connect(path)
    for script in SINGLE_LIST_MIGRATIONS[:version]:
        db.executescript(script)
    db.execute(f"PRAGMA user_version = {version}")
    db.execute("INSERT INTO topics VALUES (?, 1)", (TOPIC,))
    db.execute("INSERT INTO ledgers (ledger_id, topic, role, entries, size_bytes, created_at_ms, closed_at_ms) "
               "VALUES (3, ?, 'data', 10, 100, 1, 2)", (TOPIC,))
    db.execute("INSERT INTO cursors VALUES (?, 'sub', 3, 4, '[[3, 6, 7]]', 5)", (TOPIC,))
    db.execute("INSERT INTO cursor_properties VALUES (?, 'sub', 'CompactedTopicLedger', 9)", (TOPIC,))
    db.execute("INSERT INTO policies VALUES (?, 'deleteRetentionMs', '60000')", (TOPIC,))
    db.execute("INSERT INTO policies VALUES ('public/default', 'compactionThreshold', '100')")
    if version >= 2:
        db.execute("INSERT INTO compaction_status VALUES (?, 'SUCCESS', '', 3)", (TOPIC,))
    if version >= 3:
        db.execute("INSERT INTO counters VALUES ('broker_instance_id', 4)")
    db.commit()
    db.close()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_single_list_database_is_converted_keeping_every_row(tmp_path: Path, version: int) -> None:
    _single_list_database(tmp_path / "metadata.db", version)
    data_dir = DataDir.open(str(tmp_path))
    try:
        database = data_dir.database
        cursors, policies = CursorStore(database), PolicyStore(database)
        statuses = CompactionStatusStore(database)
        assert database.layout == LAYOUT
        assert {c: database.version(c) for c in ("ledger", "cursor", "policies", "compaction")} == {
            "ledger": len(LEDGER_MIGRATIONS), "cursor": 1, "policies": 1, "compaction": 1}
        assert data_dir.metadata.list_topics() == [TOPIC]
        assert [(r.ledger_id, r.entries, r.size_bytes, r.offloaded, r.local_deleted)
                for r in data_dir.metadata.topic_ledgers(TOPIC)] == [(3, 10, 100, False, False)]
        assert cursors.load(TOPIC, "sub") == CursorRecord(
            TOPIC, "sub", Position(3, 4), ((3, 6, 7),), {"CompactedTopicLedger": 9}, 5)
        assert policies.get_policy(TOPIC, "deleteRetentionMs") == 60000
        assert policies.get_policy("public/default", "compactionThreshold") == 100
        assert statuses.compaction_status(TOPIC) == (("SUCCESS", "") if version >= 2 else None)
        assert data_dir.metadata.next_counter("broker_instance_id") == (5 if version >= 3 else 0)
        assert data_dir.metadata.held_positions(TOPIC) == [Position(3, 4)]
    finally:
        data_dir.close()


def test_a_converted_database_forgets_every_layers_rows_of_a_deleted_topic(tmp_path: Path) -> None:
    """The conversion declares the old tables' topic rows, so a process that loads only the
    ledger layer still deletes the cursors, policies and status of a topic with it."""
    _single_list_database(tmp_path / "metadata.db", 3)
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    assert metadata.held_positions(TOPIC) == [Position(3, 4)]  # the cursor holds data: no trimming past it
    assert metadata.delete_topic(TOPIC) == [3]
    for table, column in (("cursors", "topic"), ("cursor_properties", "topic"), ("policies", "scope"),
                          ("compaction_status", "topic")):
        assert metadata.database.query(f"SELECT count(*) FROM {table} WHERE {column} = ?", (TOPIC,)) == [(0,)]
    assert PolicyStore(metadata.database).get_policy("public/default", "compactionThreshold") == 100
    metadata.close()


def test_a_newer_component_version_is_refused(tmp_path: Path) -> None:
    DataDir.open(str(tmp_path)).close()
    path = str(tmp_path / "metadata.db")
    first = Database(path)
    CursorStore(first)
    first.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_versions SET version = 2 WHERE component = 'cursor'")
    db.commit()
    db.close()
    database = Database(path)
    MetadataStore(database)  # the other layers are not concerned
    with pytest.raises(SchemaVersionError, match="cursor schema version 2.*upgrade compactd"):
        CursorStore(database)
    reader = Database(path, read_only=True)
    with pytest.raises(SchemaVersionError, match="cursor schema version 2"):
        CursorStore(reader)
    reader.close()
    database.close()


def test_read_only_refuses_a_single_list_database_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    _single_list_database(path, 3)
    before = path.read_bytes()
    with pytest.raises(SchemaVersionError, match="open it read-write once"):
        MetadataStore(str(path), read_only=True)
    assert path.read_bytes() == before
    MetadataStore(str(path)).close()  # the owner converts it
    reader = MetadataStore(str(path), read_only=True)
    assert reader.list_topics() == [TOPIC]
    assert CursorStore(reader.database).load(TOPIC, "sub") is not None
    reader.close()


def test_read_only_refuses_a_component_it_would_have_to_upgrade(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.db")
    MetadataStore(path).close()  # no cursor tables yet
    reader = Database(path, read_only=True)
    with pytest.raises(SchemaVersionError, match="cursor schema version 0; open it read-write once"):
        CursorStore(reader)
    reader.close()


def test_deleting_a_topic_is_one_transaction_over_every_layer(metadata: MetadataStore) -> None:
    cursors, policies = CursorStore(metadata.database), PolicyStore(metadata.database)
    statuses = CompactionStatusStore(metadata.database)
    for topic in (TOPIC, OTHER):
        metadata.create_topic(topic, 1)
        cursors.save(CursorRecord(topic, "sub", Position(1, 2), (), {"k": 1}))
        policies.set_policy(topic, "deleteRetentionMs", 5)
        statuses.set_compaction_status(topic, "SUCCESS", "", 1)

    def crash(**_: object) -> None:
        raise MetadataError("injected")

    metadata.database.fault_points["ledger.delete_topic.after_forgetting"] = crash
    with pytest.raises(MetadataError):
        metadata.delete_topic(TOPIC)
    assert cursors.load(TOPIC, "sub") is not None  # rolled back, every layer's rows
    assert policies.get_policy(TOPIC, "deleteRetentionMs") == 5
    assert statuses.compaction_status(TOPIC) == ("SUCCESS", "")
    del metadata.database.fault_points["ledger.delete_topic.after_forgetting"]
    metadata.delete_topic(TOPIC)
    assert (cursors.list(TOPIC), policies.get_policy(TOPIC, "deleteRetentionMs")) == ([], None)
    assert (statuses.compaction_status(TOPIC), metadata.topic_exists(TOPIC)) == (None, False)
    assert cursors.list(OTHER) == ["sub"] and statuses.topics_with_status("SUCCESS") == [OTHER]


def test_named_fault_points_before_and_after_a_write(metadata: MetadataStore) -> None:
    """``<name>.before`` fails a write that never happened; ``<name>.after`` one that did."""
    cursors = CursorStore(metadata.database)
    seen: list[object] = []

    def fail(**details: object) -> None:
        seen.append(details["record"])
        raise MetadataError("injected")

    record = CursorRecord(TOPIC, "sub", Position(1, 2))
    metadata.database.fault_points["cursor.save.before"] = fail
    with pytest.raises(MetadataError):
        cursors.save(record)
    assert cursors.load(TOPIC, "sub") is None
    metadata.database.fault_points.clear()
    metadata.database.fault_points["cursor.save.after"] = fail
    with pytest.raises(MetadataError):
        cursors.save(record)
    assert cursors.load(TOPIC, "sub") == record
    assert seen == [record, record]


def test_compaction_statuses_by_status(metadata: MetadataStore) -> None:
    statuses = CompactionStatusStore(metadata.database)
    statuses.set_compaction_status(OTHER, "RUNNING", "", 1)
    statuses.set_compaction_status(TOPIC, "RUNNING", "", 1)
    statuses.set_compaction_status("persistent://public/default/done", "SUCCESS", "", 1)
    assert statuses.topics_with_status("RUNNING") == [OTHER, TOPIC]
    statuses.set_compaction_status(TOPIC, "ERROR", "stopped", 2)
    assert statuses.topics_with_status("RUNNING") == [OTHER]
    assert statuses.compaction_status(TOPIC) == ("ERROR", "stopped")
