"""De-duplication state: snapshots, replay after a crash, only durable entries count."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.broker import dedup
from api.broker.dedup import DEDUP_CURSOR, Deduplication
from compactor.encoder import encode_entry
from compactor.proto import pulsar_api_pb2 as pb
from ledger import DataDir, ManagedLedger

TOPIC = "persistent://public/default/dedup"


def entry(producer: str, sequence_id: int, highest: int | None = None) -> bytes:
    metadata = pb.MessageMetadata(producer_name=producer, sequence_id=sequence_id, publish_time=1)
    if highest is not None:
        metadata.highest_sequence_id = highest
    return encode_entry(metadata, b"v", with_checksum=False)


@pytest.mark.parametrize("interval", [1000, 3])
def test_state_is_snapshot_plus_replay_after_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interval: int) -> None:
    monkeypatch.setattr(dedup, "SNAPSHOT_INTERVAL_ENTRIES", interval)
    data_dir = DataDir.open(str(tmp_path))
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    state = Deduplication(ledger)
    sends = [("a", 0, None), ("b", 5, None), ("a", 1, 4), ("b", 6, None), ("c", 9, None), ("a", 5, None), ("b", 7, 9)]
    for producer, sequence_id, highest in sends:
        position = ledger.append(entry(producer, sequence_id, highest)).result(timeout=10)
        state.durable(producer, max(sequence_id, highest or -1), position)
    expected = {"a": 5, "b": 9, "c": 9}
    assert state.sequence_ids == expected
    snapshot = data_dir.metadata.load_cursor(TOPIC, DEDUP_CURSOR)
    assert snapshot is not None
    assert bool(snapshot.properties) == (interval < len(sends))
    data_dir.close()  # a crash: the topic is never closed, no final snapshot
    data_dir = DataDir.open(str(tmp_path))
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    assert Deduplication(ledger).sequence_ids == expected
    data_dir.close()


def test_snapshot_moves_the_cursor_so_it_holds_little_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "SNAPSHOT_INTERVAL_ENTRIES", 2)
    data_dir = DataDir.open(str(tmp_path))
    ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
    state = Deduplication(ledger)
    positions = []
    for sequence_id in range(5):
        positions.append(ledger.append(entry("p", sequence_id)).result(timeout=10))
        state.durable("p", sequence_id, positions[-1])
    assert state.cursor.mark_delete_position == positions[3]
    state.snapshot()
    assert state.cursor.mark_delete_position == positions[4]
    assert data_dir.metadata.load_cursor(TOPIC, DEDUP_CURSOR).properties == {"p": 4}  # type: ignore[union-attr]
    data_dir.close()
