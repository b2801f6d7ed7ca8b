"""Two attempts of one group's rewrite (``compactor.spark.rewrite.rewrite_group``) — a task
retried after its first attempt wrote, or a speculative copy running beside it — both
write the group's ledger at its reserved id: one complete sealed ledger stays, byte for
byte the one a single attempt writes, with no temporary file, and both attempts report
the same row (the commit takes one report per group: ``test_spark_plan``,
``test_the_commit_refuses_unless_every_group_reported_exactly_once``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa

from compactor.engine import LedgerRange
from compactor.spark.rewrite import (
    DECISION_FIGURES,
    DECISION_RETAINED,
    GroupReport,
    GroupSpec,
    RewriteJob,
    rewrite_group,
)
from compactor.view.view import CompactedEntry, encode_compacted_entry
from ledger.position import Position
from ledger.storage import FileLedgerStore, SyncPolicy
from ledger.storage.sealed_writer import TEMP_PREFIX, ledger_file_name
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

KEYS = ("k0", "k1", "k2")
META = {"component": "compacted-ledger", "topic": "t", "compactedTo": "1:8"}


def _message(key: str, value: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1_700_000_000_000,
                                  partition_key=key)
    return encode_entry(metadata, value, with_checksum=True)


def _group(root: Path) -> tuple[RewriteJob, GroupSpec, pa.Table, list[bytes]]:
    """A raw ledger of nine updates of three keys, a reserved id, the group's decisions
    (each key's last update retained, one figures row) and the entries it must keep."""
    store = FileLedgerStore(str(root), sync=SyncPolicy.ALWAYS)
    try:
        ledger_id = store.create()
        data = [_message(KEYS[index % 3], b"v%d" % index) for index in range(9)]
        for item in data:
            store.append(ledger_id, item).result()
        store.close(ledger_id)
        [reserved] = store.reserve_ids(1)
    finally:
        store.shutdown()
    kept = range(6, 9)
    # each key's last update retained: piece 0's index rows 6..8 (one row an entry); the
    # group's presence row
    rows = [{"kind": DECISION_RETAINED, "seq": entry_id} for entry_id in kept]
    rows.append({"kind": DECISION_FIGURES, "seq": None})
    schema = pa.schema([("kind", pa.int32()), ("seq", pa.int64())])
    expected = [encode_compacted_entry(CompactedEntry(Position(ledger_id, entry_id), data[entry_id]))
                for entry_id in kept]
    job = RewriteJob(str(root), META, created_at_ms=123, retain_null_key=False, keep_tombstones_since_ms=None)
    return job, GroupSpec(0, (LedgerRange(ledger_id, 0, 8),), reserved), pa.Table.from_pylist(rows, schema), expected


def test_two_attempts_of_one_group_leave_one_complete_ledger_identical_to_a_single_attempts(tmp_path: Path) -> None:
    job, spec, decisions, expected = _group(tmp_path / "once")
    single = rewrite_group(job, spec, decisions)
    once = (tmp_path / "once" / ledger_file_name(spec.ledger_id)).read_bytes()

    job, spec, decisions, _ = _group(tmp_path / "twice")
    reports: list[GroupReport] = []
    start = threading.Barrier(2)

    def attempt() -> None:
        start.wait()
        reports.append(rewrite_group(job, spec, decisions))

    attempts = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in attempts:
        thread.start()
    for thread in attempts:
        thread.join()

    assert reports == [single, single]
    figures = single.figures
    assert (figures.entries_written, figures.messages_kept, figures.keys_kept, figures.entries_read) == (3, 3, 3, 9)
    assert (tmp_path / "twice" / ledger_file_name(spec.ledger_id)).read_bytes() == once
    assert not [name for name in os.listdir(tmp_path / "twice") if name.startswith(TEMP_PREFIX)]
    store = FileLedgerStore(str(tmp_path / "twice"), sync=SyncPolicy.NONE, read_only=True)
    try:
        assert store.info(spec.ledger_id).metadata == META
        assert list(store.read(spec.ledger_id, 0, store.last_add_confirmed(spec.ledger_id))) == expected
    finally:
        store.shutdown()
