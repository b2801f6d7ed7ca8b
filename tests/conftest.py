"""Shared fixtures: every storage-level test can run against each backend."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from ledger.metadata import MetadataStore
from ledger.storage import FileLedgerStore, LedgerStore, MemoryLedgerStore, SyncPolicy


@pytest.fixture(autouse=True)
def _quiet_logs() -> None:
    logging.getLogger("ledger").setLevel(logging.ERROR)


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[LedgerStore]:
    """A ledger store of each backend (file: group commit, the production default)."""
    backend: LedgerStore
    if request.param == "memory":
        backend = MemoryLedgerStore()
    else:
        backend = FileLedgerStore(str(tmp_path / "ledgers"), sync=SyncPolicy.GROUP)
    yield backend
    backend.shutdown()


@pytest.fixture
def metadata(tmp_path) -> Iterator[MetadataStore]:
    """A real SQLite metadata store in a temporary directory."""
    store = MetadataStore(str(tmp_path / "metadata.db"))
    yield store
    store.close()
