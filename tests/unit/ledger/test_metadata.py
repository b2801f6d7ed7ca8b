"""The SQLite metadata store and the data-dir lock."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from api.broker.policies import PolicyStore
from cursor.store import CursorRecord, CursorStore
from ledger.data_dir import DataDir
from ledger.database import LAYOUT
from ledger.errors import DataDirLockedError, MetadataError, SchemaVersionError
from ledger.metadata import MIGRATIONS, MetadataStore
from ledger.position import Position


def test_new_database_is_wal_and_at_latest_schema(tmp_path: Path) -> None:
    store = MetadataStore(str(tmp_path / "m.db"))
    assert store.schema_version == len(MIGRATIONS)
    assert store.database.layout == LAYOUT
    store.close()
    db = sqlite3.connect(tmp_path / "m.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_database_from_a_newer_compactd_is_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "m.db")
    db.execute(f"PRAGMA user_version = {LAYOUT + 1}")
    db.close()
    with pytest.raises(SchemaVersionError, match="upgrade compactd"):
        MetadataStore(str(tmp_path / "m.db"))


def test_migrations_apply_in_order_from_an_older_version(tmp_path: Path, monkeypatch) -> None:
    store = MetadataStore(str(tmp_path / "m.db"))
    store.close()
    extra = "CREATE TABLE later_feature (x INTEGER)"
    monkeypatch.setattr("ledger.metadata.MIGRATIONS", (*MIGRATIONS, extra))
    store = MetadataStore(str(tmp_path / "m.db"))
    assert store.schema_version == len(MIGRATIONS) + 1
    assert store._query("SELECT count(*) FROM later_feature") == [(0,)]
    store.close()


def test_cursor_round_trip_with_properties(metadata: MetadataStore) -> None:
    cursors = CursorStore(metadata.database)
    record = CursorRecord("t", "__compaction", Position(3, 9), ((4, 2, 5),), {"CompactedTopicLedger": 17}, 5)
    cursors.save(record)
    assert cursors.load("t", "__compaction") == record
    assert cursors.mark_delete_positions("t") == {"__compaction": Position(3, 9)}
    assert cursors.delete("t", "__compaction")
    assert cursors.load("t", "__compaction") is None


def test_fault_between_position_and_properties_changes_neither(metadata: MetadataStore) -> None:
    cursors = CursorStore(metadata.database)
    before = CursorRecord("t", "s", Position(1, 1), (), {"a": 1}, 1)
    cursors.save(before)

    def fault(**_: object) -> None:
        raise MetadataError("injected")

    metadata.database.fault_points["cursor.save.between_position_and_properties"] = fault
    with pytest.raises(MetadataError):
        cursors.save(CursorRecord("t", "s", Position(2, 5), (), {"a": 2}, 2))
    assert cursors.load("t", "s") == before


def test_policies_and_topics(metadata: MetadataStore) -> None:
    policies = PolicyStore(metadata.database)
    assert metadata.create_topic("persistent://public/default/a", 1)
    assert not metadata.create_topic("persistent://public/default/a", 2)
    policies.set_policy("public/default", "compactionThreshold", 100)
    assert policies.get_policy("public/default", "compactionThreshold") == 100
    assert policies.remove_policy("public/default", "compactionThreshold")
    assert policies.get_policy("public/default", "compactionThreshold") is None
    metadata.add_ledger("persistent://public/default/a", 5, role="data", created_at_ms=1)
    assert metadata.delete_topic("persistent://public/default/a") == [5]
    assert metadata.list_topics() == []


SECOND = (
    "import sys\n"
    "from ledger.data_dir import DataDir\n"
    "from ledger.errors import DataDirLockedError\n"
    "try:\n"
    "    DataDir.open(sys.argv[1])\n"
    "except DataDirLockedError as error:\n"
    "    print(error); sys.exit(3)\n"
)


def test_second_process_on_the_same_data_dir_fails_at_once_and_touches_nothing(tmp_path: Path) -> None:
    first = DataDir.open(str(tmp_path))
    ledger_id = first.ledgers.create()
    first.ledgers.append(ledger_id, b"x").result(timeout=10)
    snapshot = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()}
    result = subprocess.run([sys.executable, "-c", SECOND, str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 3, result.stderr
    assert "in use by another compactd process" in result.stdout
    assert "pid" in result.stdout
    after = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()}
    assert after == snapshot
    first.close()
    DataDir.open(str(tmp_path)).close()  # released: the next owner gets in


def test_lock_in_the_same_process_is_refused_too(tmp_path: Path) -> None:
    first = DataDir.open(str(tmp_path))
    with pytest.raises(DataDirLockedError):
        DataDir.open(str(tmp_path))
    first.close()
