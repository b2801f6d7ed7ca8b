"""A read never waits for another thread's commit (``Database.query``'s reader connection).

A commit holds the database's lock through its fsync, which a busy disk can make long; the
broker's event loop reads policies, statuses and topics through ``query`` and must not wait
for it. The slow commit is a transaction the test holds open on another thread.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ledger.database import Database

WAIT_S = 10.0


def test_a_read_on_another_thread_answers_the_committed_state_during_a_commit(tmp_path: Path) -> None:
    database = Database(str(tmp_path / "metadata.db"))
    release = threading.Event()
    try:
        database.register("t", ("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)",))
        with database.transaction() as db:
            db.execute("INSERT INTO kv VALUES ('a', 'committed')")
        inside = threading.Event()

        def write() -> None:
            with database.transaction() as db:
                db.execute("UPDATE kv SET v = 'uncommitted' WHERE k = 'a'")
                assert database.query("SELECT v FROM kv") == [("uncommitted",)]  # its own rows
                inside.set()
                release.wait(WAIT_S)  # a commit that takes long
        writer = threading.Thread(target=write)
        writer.start()
        assert inside.wait(WAIT_S)
        answered: list[object] = []
        reader = threading.Thread(target=lambda: answered.append(database.query("SELECT v FROM kv")))
        reader.start()
        reader.join(WAIT_S / 2)
        assert answered == [[("committed",)]]  # answered while the writer holds the lock
        assert writer.is_alive()
        release.set()
        writer.join(WAIT_S)
        assert database.query("SELECT v FROM kv") == [("uncommitted",)]
    finally:
        release.set()
        database.close()


def test_an_in_memory_database_reads_through_its_one_connection() -> None:
    database = Database(":memory:")
    try:
        database.register("t", ("CREATE TABLE kv (k TEXT)",))
        with database.transaction() as db:
            db.execute("INSERT INTO kv VALUES ('a')")
        assert database.query("SELECT k FROM kv") == [("a",)]
    finally:
        database.close()
