"""Shared fixtures: every storage-level test can run against each backend."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from ledger.metadata import MetadataStore
from ledger.storage import FileLedgerStore, LedgerStore, MemoryLedgerStore, SyncPolicy
from ledger.storage.object_fs import BucketConfig
from tests.s3_server import AWS_ENV, S3Server


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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server (moto) on loopback, one per session and xdist worker;
    the dummy credentials are in the environment (``tests.s3_server.AWS_ENV``)."""
    for key, value in AWS_ENV.items():
        os.environ.setdefault(key, value)
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> BucketConfig:
    """A fresh bucket on ``s3_server``."""
    return s3_server.bucket()
