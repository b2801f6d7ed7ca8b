"""An in-process compactd broker for integration tests, driven by the real pulsar-client.

``broker`` runs a real ``PulsarBroker`` (the broker core and its Pulsar listener) over a
real data dir (files + SQLite) on its own event loop in a background thread, listening on
a free loopback port. The real client
(C++ core) talks to it over TCP exactly as to a separate process. ``broker.restart()``
stops it (sealing ledgers, releasing the data dir) and starts a new one on the same dir;
``broker.compact(topic)`` runs a compaction as the REST trigger will.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pulsar = pytest.importorskip("pulsar")

from api.config import Settings
from api.wire.listener import PulsarBroker
from compactor.record import RunFigures
from compactor.runs.runner import collect_orphans
from ledger.data_dir import DataDir

START_TIMEOUT_S = 30


class BrokerHarness:
    """A running broker plus helpers; see the module docstring."""

    def __init__(self, data_dir: Path, settings: Settings | None = None) -> None:
        self.path = data_dir
        self.settings = settings or Settings()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="broker-loop", daemon=True)
        self._thread.start()
        self.service: PulsarBroker | None = None
        self.data_dir: DataDir | None = None
        self.port = 0
        self.start()

    def call(self, coroutine: Any, timeout_s: float = START_TIMEOUT_S) -> Any:
        """Run ``coroutine`` on the broker's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def start(self) -> None:
        self.data_dir = DataDir.open(str(self.path))
        collect_orphans(self.data_dir)
        self.service = PulsarBroker(self.data_dir, self.settings)
        self.port = self.call(self._start(self.service))

    async def _start(self, service: PulsarBroker) -> int:
        return await service.start("127.0.0.1", self.port)

    def stop(self) -> None:
        if self.service is not None:
            self.call(self.service.stop())
            self.service = None
        if self.data_dir is not None:
            self.data_dir.close()
            self.data_dir = None

    def restart(self) -> None:
        """Stop and start again on the same data dir and port."""
        self.stop()
        self.start()

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def compact(self, topic: str) -> RunFigures:
        assert self.service is not None
        figures: RunFigures = self.call(self.service.compact(topic), timeout_s=120)
        return figures

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=START_TIMEOUT_S)
        self.loop.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerHarness]:
    harness = BrokerHarness(tmp_path / "data")
    yield harness
    harness.close()


@pytest.fixture
def client(broker: BrokerHarness) -> Iterator[Any]:
    """A real pulsar client with a quiet logger and short timeouts."""
    instance = pulsar.Client(
        broker.url, operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield instance
    instance.close()
