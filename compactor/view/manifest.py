"""The compactor's manifest tables: which ledgers make each topic's compacted view, and
which replaced compacted ledgers wait for their grace period to end.

``CompactedManifests`` owns the ``compacted_manifest`` component of
``ledger.database.Database``:

* ``compacted_manifest``: per topic, the compacted ledgers of its published view in stream
  order (``seq`` 0, 1, ...). Written **inside the publish transaction** of the
  ``__compaction`` cursor (``write``, through ``CursorStore.save``'s ``also`` hook), so the
  persisted horizon, the ``CompactedTopicLedger`` property (the first ledger: Pulsar's one
  long) and the list always change together. Declared as the topic's rows: deleting the
  topic removes them in the ledger layer's delete transaction. A topic published before the
  manifest existed has the property only; ``CompactedTopic.restore`` reads it as a
  one-ledger view. ``in_bucket`` records where the view's ledgers were written: 1 when a
  Spark run wrote them into the object store (``ledgers/<id>`` in the bucket: the broker
  reads them from there, through its cache), 0 when they are files of the data dir.
* ``compacted_garbage``: replaced compacted ledgers (the previous view's at a publish, a
  dropped view's) with the time (ms since the epoch) after which they may be deleted, also
  recorded in the publish transaction. Until then a Spark scan or a task retry still
  reading the previous view keeps its input. ``sweep`` deletes the due ones (the broker
  periodically and at start, ``compactd compact-topic``); ``live_ledger_ids`` (what
  ``collect_orphans`` keeps) counts every manifest ledger and the garbage not yet due. The
  rows are not the topic's: a deleted topic's garbage is still swept on time.
* ``compacted_marks``: per topic and ledger of its view, the ledger's dead marks
  (``compactor.view.marks.LedgerMarks``: the entries and batch slots later data superseded,
  and the counts that decide a merge), written in the same publish transaction as the
  manifest: a view and its marks always change together. A ledger of the view without a
  row has nothing dead (a view published before the marks existed). Declared as the
  topic's rows.

Fault points (``ledger.database``): the checkpoints ``compaction.manifest.write`` and
``compaction.marks.write`` inside the publish (or drop) transaction, and the one write outside it, the named transaction
``compaction.garbage_sweep``.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Mapping, Sequence

from compactor.view.marks import LedgerMarks
from ledger.database import Database, TopicTable, load_migrations
from ledger.errors import LedgerNotFoundError
from ledger.storage.base import LedgerStore

__all__ = ["COMPONENT", "GRACE_PERIOD_S_DEFAULT", "MIGRATIONS", "CompactedManifests"]

log = logging.getLogger(__name__)

# The broker's default grace period of replaced compacted ledgers (``compacted_ledger_grace_period_s``).
GRACE_PERIOD_S_DEFAULT = 60.0
COMPONENT = "compacted_manifest"
MIGRATIONS = load_migrations("compactor.view", COMPONENT)
TOPIC_TABLES = (TopicTable("compacted_manifest", "topic"), TopicTable("compacted_marks", "topic"))


class CompactedManifests:
    """The manifest and garbage rows kept in ``database`` (whose tables it brings up to
    date; a read-only database without them reads as holding no manifest)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._present = not (database.read_only and database.version(COMPONENT) == 0)
        if self._present:
            database.register(COMPONENT, MIGRATIONS, topic_tables=TOPIC_TABLES)

    # -- inside the publish transaction ---------------------------------------------------

    def write(self, db: sqlite3.Connection, topic: str, ledger_ids: Sequence[int] | None,
              garbage: Iterable[int] = (), delete_after_ms: int = 0, in_bucket: bool = False,
              marks: Mapping[int, LedgerMarks] | None = None) -> None:
        """Inside the caller's transaction ``db``: make ``ledger_ids`` (None: no view) the
        manifest of ``topic`` (``in_bucket``: written into the object store), store
        ``marks`` (the ledgers' whose marks changed; the rows of ledgers no longer in the
        manifest go) and record ``garbage`` as deletable after ``delete_after_ms``.
        Checkpoints ``compaction.manifest.write`` (before the rows) and
        ``compaction.marks.write`` (after the manifest's, before the marks'); raising at
        either rolls the whole publish back."""
        self.database.checkpoint("compaction.manifest.write", topic=topic, ledger_ids=ledger_ids)
        db.execute("DELETE FROM compacted_manifest WHERE topic = ?", (topic,))
        if ledger_ids is not None:
            db.executemany("INSERT INTO compacted_manifest (topic, seq, ledger_id, in_bucket) VALUES (?, ?, ?, ?)",
                           [(topic, seq, ledger_id, int(in_bucket)) for seq, ledger_id in enumerate(ledger_ids)])
        self.database.checkpoint("compaction.marks.write", topic=topic, ledger_ids=ledger_ids)
        db.execute("DELETE FROM compacted_marks WHERE topic = ? AND ledger_id NOT IN "
                   "(SELECT ledger_id FROM compacted_manifest WHERE topic = ?)", (topic, topic))
        db.executemany(
            "INSERT OR REPLACE INTO compacted_marks (topic, ledger_id, entries, messages, keys, dead_messages, "
            "dead_keys, dead_entries, dead_slots) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(topic, ledger_id, *mark.encode()) for ledger_id, mark in (marks or {}).items()
             if ledger_ids is not None and ledger_id in ledger_ids])
        db.executemany(
            "INSERT OR REPLACE INTO compacted_garbage (ledger_id, topic, delete_after_ms) VALUES (?, ?, ?)",
            [(ledger_id, topic, delete_after_ms) for ledger_id in garbage])

    # -- reading --------------------------------------------------------------------------

    def ledger_ids(self, topic: str) -> tuple[int, ...]:
        """The manifest of ``topic`` in stream order; empty when it has none."""
        if not self._present:
            return ()
        rows = self.database.query("SELECT ledger_id FROM compacted_manifest WHERE topic = ? ORDER BY seq", (topic,))
        return tuple(int(row[0]) for row in rows)

    def marks(self, topic: str) -> dict[int, LedgerMarks]:
        """The dead marks of ``topic``'s view: ledger id → marks (ledgers without a row have
        nothing dead)."""
        if not self._present or self.database.version(COMPONENT) < 3:
            return {}
        rows = self.database.query(
            "SELECT ledger_id, entries, messages, keys, dead_messages, dead_keys, dead_entries, dead_slots "
            "FROM compacted_marks WHERE topic = ?", (topic,))
        return {int(row[0]): LedgerMarks.decode(int(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]),
                                                bytes(row[6]), bytes(row[7])) for row in rows}

    def in_bucket(self, topic: str) -> bool:
        """Whether the manifest of ``topic`` names ledgers written into the object store."""
        if not self._present:
            return False
        rows = self.database.query("SELECT MAX(in_bucket) FROM compacted_manifest WHERE topic = ?", (topic,))
        return bool(rows and rows[0][0])

    def view_ledger_ids(self, topic: str, first_ledger_id: int) -> tuple[int, ...]:
        """The ledgers of ``topic``'s published view whose ``CompactedTopicLedger`` property
        is ``first_ledger_id``: the manifest, or that one ledger when the manifest does not
        start with it (a view published before the manifest existed)."""
        ledger_ids = self.ledger_ids(topic)
        return ledger_ids if ledger_ids and ledger_ids[0] == first_ledger_id else (first_ledger_id,)

    def garbage(self) -> dict[int, int]:
        """Every replaced compacted ledger awaiting deletion: ledger id → delete-after (ms)."""
        if not self._present:
            return {}
        return {int(ledger_id): int(after) for ledger_id, after in
                self.database.query("SELECT ledger_id, delete_after_ms FROM compacted_garbage")}

    def live_ledger_ids(self, now_ms: int) -> set[int]:
        """Ledgers that must not be collected as orphans at ``now_ms``: every manifest's,
        and the garbage whose grace period has not ended."""
        if not self._present:
            return set()
        rows = self.database.query(
            "SELECT ledger_id FROM compacted_manifest UNION "
            "SELECT ledger_id FROM compacted_garbage WHERE delete_after_ms > ?", (now_ms,))
        return {int(row[0]) for row in rows}

    # -- deleting garbage -----------------------------------------------------------------

    def sweep(self, store: LedgerStore, now_ms: int, *, only: Iterable[int] | None = None) -> list[int]:
        """Delete the garbage due at ``now_ms`` (of ``only``, when given), file first, then
        its row (a crash between leaves a row whose file is gone, forgotten next time).
        A ledger some manifest lists is never deleted. Returns the ids deleted."""
        wanted = None if only is None else set(only)
        rows = self.database.query(
            "SELECT ledger_id FROM compacted_garbage WHERE delete_after_ms <= ? "
            "AND ledger_id NOT IN (SELECT ledger_id FROM compacted_manifest) ORDER BY ledger_id", (now_ms,))
        due = [int(row[0]) for row in rows if wanted is None or int(row[0]) in wanted]
        deleted = []
        for ledger_id in due:
            try:
                store.delete(ledger_id)
            except LedgerNotFoundError:
                pass
            except Exception as error:  # noqa: BLE001 - the row stays: the next sweep tries again
                log.warning("could not delete replaced compacted ledger %d: %s", ledger_id, error)
                continue
            deleted.append(ledger_id)
        if deleted:
            with self.database.transaction("compaction.garbage_sweep", ledger_ids=deleted) as db:
                db.executemany("DELETE FROM compacted_garbage WHERE ledger_id = ?", [(i,) for i in deleted])
            log.info("deleted replaced compacted ledgers %s (grace period over)", deleted)
        return deleted
