"""A read-only metadata store: what a reader of a live data dir (the Spark data source) opens.

It takes no lock and writes nothing, sees what the owner commits while the owner keeps the
data dir locked, refuses every write with ``MetadataError``, and refuses a database that
does not exist or is not up to date rather than creating or migrating it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from ledger.data_dir import DataDir
from ledger.errors import MetadataError, SchemaVersionError
from ledger.metadata import MetadataStore

TOPIC = "persistent://public/default/t"


def test_reads_what_the_locked_owner_commits(tmp_path: Path) -> None:
    owner = DataDir.open(str(tmp_path))
    reader = MetadataStore(str(tmp_path / "metadata.db"), read_only=True)
    try:
        assert not reader.topic_exists(TOPIC)
        owner.metadata.create_topic(TOPIC, 1)
        owner.metadata.add_ledger(TOPIC, 7, role="data", created_at_ms=1)
        assert reader.topic_exists(TOPIC)
        assert [record.ledger_id for record in reader.topic_ledgers(TOPIC)] == [7]
        with pytest.raises(MetadataError):
            reader.create_topic("persistent://public/default/other", 1)
        assert not owner.metadata.topic_exists("persistent://public/default/other")
    finally:
        reader.close()
        owner.close()


def test_opens_a_stopped_data_dir_changing_nothing(tmp_path: Path) -> None:
    DataDir.open(str(tmp_path)).close()
    before = set(os.listdir(tmp_path))
    database = (tmp_path / "metadata.db").read_bytes()
    reader = MetadataStore(str(tmp_path / "metadata.db"), read_only=True)
    assert reader.list_topics() == []
    reader.close()
    # SQLite's WAL index files may appear (a WAL reader needs them); the database does not change.
    assert set(os.listdir(tmp_path)) - before <= {"metadata.db-wal", "metadata.db-shm"}
    assert (tmp_path / "metadata.db").read_bytes() == database
    DataDir.open(str(tmp_path)).close()  # the owner opens it as before
    with pytest.raises(MetadataError, match="no metadata store"):
        MetadataStore(str(tmp_path / "missing.db"), read_only=True)
    assert not (tmp_path / "missing.db").exists()


def test_an_old_schema_is_refused_not_migrated(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    sqlite3.connect(path).close()  # schema version 0
    with pytest.raises(SchemaVersionError, match="open it read-write once"):
        MetadataStore(str(path), read_only=True)
