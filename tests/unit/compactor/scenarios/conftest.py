"""Fixtures of the Pulsar scenario tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.metadata import MetadataStore
from ledger.storage import FileLedgerStore, LedgerStore, MemoryLedgerStore, SyncPolicy
from tests.unit.compactor.scenarios.support import Harness, MakeHarness, RecordingStore


@pytest.fixture(params=["memory", "file"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeHarness]:
    """Builds ``Harness`` topics on each ledger-store backend (file: group commit, the
    production default) with a SQLite metadata store; ``record=True`` wraps the store in a
    ``RecordingStore`` (``harness.store``)."""
    built: list[Harness] = []

    def build(*, record: bool = False, **kwargs: Any) -> Harness:
        store: LedgerStore
        if request.param == "memory":
            store = MemoryLedgerStore()
        else:
            store = FileLedgerStore(str(tmp_path / f"ledgers-{len(built)}"), sync=SyncPolicy.GROUP)
        if record:
            store = RecordingStore(store)
        harness = Harness(store, MetadataStore(str(tmp_path / f"metadata-{len(built)}.db")), **kwargs)
        built.append(harness)
        return harness

    yield build
    for harness in built:
        harness.store.shutdown()
        harness.metadata.close()
