"""Migrations as SQL files (``ledger.database.load_migrations``): a database made when the
migrations were Python strings opens with the tables a new database gets, and a component's
files are read in version order or refused when misnumbered.

``data/metadata_strings_era.sql`` is the dump (``iterdump`` and its ``PRAGMA user_version``)
of a database every store had opened with that code.
"""

from __future__ import annotations

import re
import sqlite3
import uuid
from pathlib import Path

import pytest

from api.broker.grants import GrantStore
from api.broker.partitions import PartitionedTopics
from api.broker.policies import PolicyStore
from api.broker.schemas import SchemaRegistry
from api.broker.tenants import Tenants
from compactor.runs.status import CompactionStatusStore
from compactor.view.manifest import CompactedManifests
from cursor.store import CursorStore
from ledger.database import Database, load_migrations
from ledger.errors import MetadataError
from ledger.metadata import MetadataStore

STRINGS_ERA_DUMP = Path(__file__).parent / "data" / "metadata_strings_era.sql"


def _open_every_store(path: Path) -> None:
    """Open the database at ``path`` with every layer's store: each registers its migrations."""
    database = Database(str(path))
    try:
        MetadataStore(database)
        CursorStore(database)
        CompactedManifests(database)
        CompactionStatusStore(database)
        policies = PolicyStore(database)
        GrantStore(database)
        SchemaRegistry(database, policies, max_size_bytes=1 << 20)
        PartitionedTopics(database, max_partitions=4)
        Tenants(database, cluster="standalone")
    finally:
        database.close()


def _schema(path: Path) -> list[tuple[object, ...]]:
    """What migrations decide in the file at ``path``: its tables and indexes (their SQL,
    white space folded), component versions, declared topic tables and layout."""
    connection = sqlite3.connect(path)
    try:
        objects = [(kind, name, re.sub(r"\s+", " ", sql).strip()) for kind, name, sql in connection.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")]
        versions = connection.execute("SELECT component, version FROM schema_versions ORDER BY component").fetchall()
        topic_tables = connection.execute("SELECT * FROM topic_tables ORDER BY table_name").fetchall()
        layout = connection.execute("PRAGMA user_version").fetchall()
    finally:
        connection.close()
    return [*objects, *versions, *topic_tables, *layout]


def test_a_database_made_when_migrations_were_strings_opens_with_a_new_databases_tables(tmp_path: Path) -> None:
    """Each migration file still makes what its string did: the old file needs none of them
    again (or only later ones) and ends with the tables, versions and declarations that a
    new database gets from the files alone."""
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    connection = sqlite3.connect(old)
    connection.executescript(STRINGS_ERA_DUMP.read_text(encoding="utf-8"))
    connection.close()
    made_by_strings = _schema(old)
    assert ("table", "compacted_marks") in [entry[:2] for entry in made_by_strings]
    _open_every_store(old)
    _open_every_store(new)
    assert _schema(old) == _schema(new)


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> str:
    """An importable package holding ``files`` under ``sql/thing/``; its name."""
    name = f"migrations_{uuid.uuid4().hex}"
    folder = tmp_path / name / "sql" / "thing"
    folder.mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text("")
    for file_name, text in files.items():
        (folder / file_name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_migrations_are_read_in_version_order_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _package(tmp_path, monkeypatch, {
        "002_more.sql": "-- the second\nALTER TABLE a ADD COLUMN y;\n",
        "001_first.sql": "-- the first\nCREATE TABLE a (x);\n",
        "notes.txt": "not a migration",
    })
    assert load_migrations(package, "thing") == (
        "-- the first\nCREATE TABLE a (x);\n", "-- the second\nALTER TABLE a ADD COLUMN y;\n")


@pytest.mark.parametrize("names", [
    ["001_a.sql", "003_c.sql"],  # a gap
    ["002_b.sql"],  # not from 001
    ["001_a.sql", "001_b.sql"],  # two of one version
    ["001_a.sql", "2_b.sql"],  # not NNN_<what>.sql
    [],  # none
])
def test_misnumbered_migrations_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]) -> None:
    package = _package(tmp_path, monkeypatch, {name: "SELECT 1;\n" for name in names})
    with pytest.raises(MetadataError, match="thing"):
        load_migrations(package, "thing")


def test_a_component_without_a_migrations_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = _package(tmp_path, monkeypatch, {})
    with pytest.raises(MetadataError, match="sql/other/ is missing"):
        load_migrations(package, "other")
