"""A full disk under the metadata store: a clean, typed error, a consistent database, and
writes that work again once there is room.

SQLite's own ``PRAGMA max_page_count`` makes the real database answer SQLITE_FULL (the
error a full disk gives), with no mock: the write that needs a page past the limit fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cursor.store import CursorRecord, CursorStore
from ledger.errors import MetadataError
from ledger.metadata import MetadataStore
from ledger.position import Position

TOPIC = "persistent://public/default/full"


def _cursor(entry_id: int, properties: int) -> CursorRecord:
    """A cursor save that writes many rows in one transaction."""
    return CursorRecord(TOPIC, "sub", Position(1, entry_id), ((1, entry_id + 2, entry_id + 3),),
                        {f"property-{i:04d}-{'x' * 40}": i for i in range(properties)}, entry_id)


def _cap_at_current_size(metadata: MetadataStore) -> int:
    pages = int(metadata._query("PRAGMA page_count")[0][0])
    metadata._query(f"PRAGMA max_page_count = {pages}")
    return pages


def test_a_full_database_fails_the_write_cleanly_and_recovers_when_room_frees(tmp_path: Path) -> None:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    metadata.create_topic(TOPIC, 1)
    metadata.add_ledger(TOPIC, 7, role="data", created_at_ms=1)
    cursors = CursorStore(metadata.database)
    before = _cursor(0, 2)
    cursors.save(before)
    _cap_at_current_size(metadata)

    with pytest.raises(MetadataError, match="full") as raised:
        cursors.save(_cursor(5, 400))  # needs new pages: SQLITE_FULL mid-transaction
    assert raised.value.retriable
    # all or nothing, and the connection is not left inside a dead transaction
    assert cursors.load(TOPIC, "sub") == before
    assert metadata._query("PRAGMA integrity_check") == [("ok",)]
    with pytest.raises(MetadataError, match="full"):  # the next write fails the same clean way
        cursors.save(_cursor(6, 400))
    metadata.close_ledger(7, entries=3, size_bytes=30, closed_at_ms=2)  # fits in existing pages

    metadata._query("PRAGMA max_page_count = 1000000")  # room again
    after = _cursor(9, 400)
    cursors.save(after)
    assert cursors.load(TOPIC, "sub") == after
    assert metadata.topic_ledgers(TOPIC)[0].entries == 3
    metadata.close()
    reopened = MetadataStore(str(tmp_path / "metadata.db"))  # and the file is sound on disk
    assert CursorStore(reopened.database).load(TOPIC, "sub") == after
    assert reopened._query("PRAGMA integrity_check") == [("ok",)]
    reopened.close()


def test_a_failed_read_is_a_metadata_error_too(tmp_path: Path) -> None:
    metadata = MetadataStore(str(tmp_path / "metadata.db"))
    with pytest.raises(MetadataError, match="no such table"):
        metadata._query("SELECT * FROM no_such_table")
    metadata.close()
