"""``api.server``: start order, the ready line, clean stop on signals, start failures.

These run the real data dir and the real uvicorn listener in this process, with a fake
broker service (anything with ``start``/``stop``); the subprocess tests in ``test_cli.py``
run the real broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from api.config import ConfigError, Settings, load_settings
from api.http import HEALTH_PATH, create_app
from api.server import GIL_SWITCH_INTERVAL_S, ListenError, ready_line, run, serve
from ledger.data_dir import DataDir
from ledger.errors import DataDirLockedError
from ledger.lock import DataDirLock
from ledger.storage.base import SyncPolicy

READY = re.compile(r"compactd ready broker=pulsar://127\.0\.0\.1:(\d+) http=http://127\.0\.0\.1:(\d+)")
WAIT_S = 30.0


class FakeBroker:
    """A broker service that answers every connection with ``fake`` and records its life."""

    def __init__(self, data_dir: DataDir, settings: Settings) -> None:
        self.data_dir = data_dir
        self.settings = settings
        self.ledgers_at_start = data_dir.ledgers.list()
        self.http_port: int | None = None  # set by the test once it knows it
        self.observed_at_stop: dict[str, bool] = {}
        self.stopped = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._answer, host, port)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def _answer(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"fake")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def stop(self) -> None:
        self.observed_at_stop = {"http_closed": _refused(self.http_port),
                                 "data_dir_locked": _locked(self.data_dir.path)}
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.stopped = True


def _refused(port: int | None) -> bool:
    if port is None:
        return False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _locked(path: str) -> bool:
    try:
        DataDirLock.acquire(path).release()
    except DataDirLockedError:
        return True
    return False


def _settings(tmp_path: Path, **flags: object) -> Settings:
    return load_settings({"data_dir": str(tmp_path / "data"), "broker_port": 0, "http_port": 0,
                          "fsync": "none", **flags}, {}, None)


class Recorder:
    """The broker factory and ready callback of one ``serve``, with what they saw."""

    def __init__(self, broker_class: Callable[[DataDir, Settings], FakeBroker] = FakeBroker) -> None:
        self.broker_class = broker_class
        self.brokers: list[FakeBroker] = []
        self.lines: list[str] = []
        self.ready = asyncio.Event()

    def factory(self, data_dir: DataDir, settings: Settings) -> FakeBroker:
        broker = self.broker_class(data_dir, settings)
        self.brokers.append(broker)
        return broker

    def on_ready(self, line: str) -> None:
        self.lines.append(line)
        self.ready.set()

    async def until_ready(self, task: asyncio.Task[int]) -> tuple[int, int]:
        ready = asyncio.create_task(self.ready.wait())
        await asyncio.wait({ready, task}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if task.done():
            task.result()
        assert self.ready.is_set(), "serve printed no ready line"
        match = READY.fullmatch(self.lines[0])
        assert match, self.lines
        return int(match[1]), int(match[2])


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_announces_both_listeners_then_stops_on_a_signal(tmp_path: Path, stop_signal: int) -> None:
    _leave_an_orphan_ledger(tmp_path)
    recorder = Recorder()

    async def scenario() -> int:
        task = asyncio.create_task(serve(_settings(tmp_path), broker_factory=recorder.factory,
                                         ready=recorder.on_ready))
        broker_port, http_port = await recorder.until_ready(task)
        recorder.brokers[0].http_port = http_port
        reader, writer = await asyncio.open_connection("127.0.0.1", broker_port)
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b"fake"
        writer.close()
        await writer.wait_closed()
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            response = await client.get(f"http://127.0.0.1:{http_port}{HEALTH_PATH}")
        assert (response.status_code, response.text) == (200, "ok")
        os.kill(os.getpid(), stop_signal)
        return await asyncio.wait_for(task, WAIT_S)

    assert asyncio.run(scenario()) == 0
    assert len(recorder.lines) == 1
    [broker] = recorder.brokers
    assert broker.ledgers_at_start == [], "orphan ledgers are collected before the broker starts"
    assert broker.data_dir.ledgers.sync is SyncPolicy.NONE  # type: ignore[attr-defined]
    assert broker.stopped
    assert broker.observed_at_stop == {"http_closed": True, "data_dir_locked": True}
    assert not _locked(str(tmp_path / "data")), "the lock is released after the stop"


def _leave_an_orphan_ledger(tmp_path: Path) -> None:
    """One ledger nothing references, as a compaction that crashed leaves it."""
    data_dir = DataDir.open(str(tmp_path / "data"))
    data_dir.ledgers.create()
    assert data_dir.ledgers.list()
    data_dir.close()


def test_a_missing_token_key_is_refused_before_the_data_dir_is_touched(tmp_path: Path) -> None:
    settings = _settings(tmp_path, authentication_enabled=True, token_secret_key="file:///k")
    recorder = Recorder()
    with pytest.raises(ConfigError, match="--token-secret-key: cannot read key file /k"):
        asyncio.run(serve(settings, broker_factory=recorder.factory, ready=recorder.on_ready))
    assert not (tmp_path / "data").exists()
    assert recorder.brokers == []


def test_a_locked_data_dir_is_refused_before_the_broker_is_built(tmp_path: Path) -> None:
    holder = DataDir.open(str(tmp_path / "data"))
    recorder = Recorder()
    try:
        with pytest.raises(DataDirLockedError, match="in use by another compactd process"):
            asyncio.run(serve(_settings(tmp_path), broker_factory=recorder.factory, ready=recorder.on_ready))
    finally:
        holder.close()
    assert recorder.brokers == []


@pytest.mark.parametrize("listener", ["broker", "http"])
def test_a_port_in_use_is_a_listen_error_and_everything_is_released(tmp_path: Path, listener: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        key = "broker_port" if listener == "broker" else "http_port"
        recorder = Recorder()
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port} for the "):
            asyncio.run(serve(_settings(tmp_path, **{key: port}), broker_factory=recorder.factory,
                              ready=recorder.on_ready))
    assert recorder.lines == []
    assert [broker.stopped for broker in recorder.brokers] == [True]
    assert not _locked(str(tmp_path / "data"))


def test_run_reports_an_unexpected_error_as_exit_code_1(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    def broken_factory(data_dir: DataDir, settings: Settings) -> FakeBroker:
        raise ZeroDivisionError("a bug")

    with caplog.at_level(logging.ERROR, logger="api.server"):
        assert run(_settings(tmp_path), broker_factory=broken_factory, ready=print) == 1
    assert "unexpected error" in caplog.text
    assert not _locked(str(tmp_path / "data"))


def test_run_raises_expected_start_errors_for_the_caller(tmp_path: Path) -> None:
    settings = _settings(tmp_path, tls_cert_file="/c.pem", tls_key_file="/k.pem")
    with pytest.raises(ConfigError, match=r"--tls-cert-file/--tls-key-file: cannot load /c.pem"):
        run(settings, broker_factory=FakeBroker, ready=print)


def test_run_serves_with_a_short_gil_switch_interval_and_restores_the_callers(tmp_path: Path) -> None:
    """A compaction run's thread must not keep the event loop off the GIL for CPython's
    default 5 ms at each hand-over (``bench.wire --during-compaction``)."""
    seen: list[float] = []

    def recording_factory(data_dir: DataDir, settings: Settings) -> FakeBroker:
        seen.append(sys.getswitchinterval())
        raise ZeroDivisionError("stop here")

    before = sys.getswitchinterval()
    assert before != GIL_SWITCH_INTERVAL_S
    assert run(_settings(tmp_path), broker_factory=recording_factory, ready=print) == 1
    assert seen == [pytest.approx(GIL_SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before


def test_the_ready_line() -> None:
    assert ready_line("127.0.0.1", 6650, 8080) == \
        "compactd ready broker=pulsar://127.0.0.1:6650 http=http://127.0.0.1:8080"
    assert ready_line("::1", 1, 2) == "compactd ready broker=pulsar://[::1]:1 http=http://[::1]:2"


def test_the_admin_app_answers_the_health_check() -> None:
    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(Settings()))
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as client:
            return await client.get(HEALTH_PATH)

    response = asyncio.run(scenario())
    assert (response.status_code, response.text) == (200, "ok")
    assert response.headers["content-type"].startswith("text/plain")
    operation = create_app().openapi()["paths"][HEALTH_PATH]["get"]
    assert operation["summary"] and operation["description"]
