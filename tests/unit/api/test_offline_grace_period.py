"""``compactd compact-topic`` and replaced compacted ledgers (issue 13, point 1): the run
keeps the view it replaces for ``compacted_ledger_grace_period_s`` and deletes the
replaced ledgers whose grace period is over, as a broker's start does."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from compactor.view.manifest import CompactedManifests
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger
from message.encoder import encode_entry
from message.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/offline-grace"


@pytest.fixture(autouse=True)
def _no_compactd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("COMPACTD_"):
            monkeypatch.delenv(name)


def append(path: Path, *values: bytes) -> None:
    data_dir = DataDir.open(str(path))
    try:
        ledger = ManagedLedger.open(TOPIC, data_dir.ledgers, data_dir.metadata)
        for value in values:
            metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key="k")
            ledger.append(encode_entry(metadata, value, with_checksum=False)).result(timeout=30)
        ledger.close()
    finally:
        data_dir.close()


def compact(path: Path) -> int:
    result = CliRunner().invoke(app, ["compact-topic", "--data-dir", str(path), "--topic", TOPIC])
    assert result.exit_code == 0, result.output
    return int(json.loads(result.stdout)["ledgerId"])


def test_compact_topic_keeps_the_replaced_view_and_deletes_due_garbage(tmp_path: Path) -> None:
    data = tmp_path / "data"
    append(data, b"1")
    first = compact(data)
    data_dir = DataDir.open(str(data))
    try:  # two replaced ledgers of an earlier view: one past its grace period, one not
        due, waiting = data_dir.ledgers.create(), data_dir.ledgers.create()
        data_dir.ledgers.close(due)
        data_dir.ledgers.close(waiting)
        now_ms = int(time.time() * 1000)
        with data_dir.database.transaction() as db:
            CompactedManifests(data_dir.database).write(db, "persistent://public/default/gone", None,
                                                         [due], now_ms - 1)
            CompactedManifests(data_dir.database).write(db, "persistent://public/default/gone", None,
                                                         [waiting], now_ms + 3_600_000)
    finally:
        data_dir.close()
    append(data, b"2")

    second = compact(data)

    assert second not in (-1, first)
    data_dir = DataDir.open(str(data))
    try:
        on_disk = set(data_dir.ledgers.list())
        assert {first, second, waiting} <= on_disk  # the replaced view waits for the default 60 s
        assert due not in on_disk
        assert set(CompactedManifests(data_dir.database).garbage()) == {first, waiting}
    finally:
        data_dir.close()
