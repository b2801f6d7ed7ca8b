"""``Database.reading``: the queries inside it see one committed state, even while another
connection (the broker, when the Spark data source reads) commits."""

from __future__ import annotations

from pathlib import Path

from ledger.database import Database


def test_queries_inside_reading_see_one_snapshot_while_another_connection_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.db")
    writer = Database(path)
    with writer.transaction() as db:
        db.execute("CREATE TABLE t (value INTEGER)")
        db.execute("INSERT INTO t VALUES (1)")
    reader = Database(path, read_only=True)
    try:
        with reader.reading():
            before = reader.query("SELECT value FROM t")
            with writer.transaction() as db:
                db.execute("INSERT INTO t VALUES (2)")
            during = reader.query("SELECT value FROM t")
            with reader.reading():  # nested: the same snapshot
                nested = reader.query("SELECT value FROM t")
        after = reader.query("SELECT value FROM t ORDER BY value")
        assert before == during == nested == [(1,)]
        assert after == [(1,), (2,)]
    finally:
        reader.close()
        writer.close()
