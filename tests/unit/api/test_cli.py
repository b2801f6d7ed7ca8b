"""The ``compactd`` console script as a user runs it.

In-process tests (typer's runner, ``api.server.run`` replaced) pin how the command line
becomes ``Settings`` and how errors become exit codes; subprocess tests run the real
``compactd serve`` with the real broker and talk to both of its ports.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from api import server
from api.cli import app
from api.config import ConfigError, Settings
from ledger.errors import DataDirLockedError

COMPACTD = [sys.executable, "-c", "from api.cli import main; main()"]
READY = re.compile(r"compactd ready broker=pulsar://127\.0\.0\.1:(\d+) http=http://127\.0\.0\.1:(\d+)\n")
WAIT_S = 30.0


@pytest.fixture(autouse=True)
def _no_compactd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("COMPACTD_"):
            monkeypatch.delenv(name)


def test_help_lists_serve() -> None:
    result = subprocess.run([*COMPACTD, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    assert "serve" in result.stdout


# -- from the command line to Settings, in process ----------------------------------------

class Captured:
    """Stands in for ``api.server.run``: keeps the settings, returns ``code`` or raises."""

    def __init__(self, code: int = 0, error: Exception | None = None) -> None:
        self.code = code
        self.error = error
        self.settings: list[Settings] = []

    def __call__(self, settings: Settings) -> int:
        self.settings.append(settings)
        if self.error is not None:
            raise self.error
        return self.code


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Captured]:
    stand_in = Captured()
    monkeypatch.setattr(server, "run", stand_in)
    yield stand_in


def test_only_the_flags_given_count_as_flags(captured: Captured, tmp_path: Path) -> None:
    config = tmp_path / "compactd.toml"
    config.write_text('bind = "0.0.0.0"\nhttp_port = 7001\ntopic_compaction_retain_null_key = true\n'
                      'compaction_engine = "local"\n')
    env = {"COMPACTD_CONFIG": str(config), "COMPACTD_BROKER_PORT": "7000", "COMPACTD_COMPACTION_ENGINE": "spark"}
    result = CliRunner().invoke(app, ["serve", "--bind", "127.0.0.2", "--no-topic-compaction-retain-null-key"],
                                env=env)
    assert result.exit_code == 0, result.output
    [settings] = captured.settings
    assert (settings.bind, settings.broker_port, settings.http_port) == ("127.0.0.2", 7000, 7001)
    assert settings.topic_compaction_retain_null_key is False
    assert settings.compaction_engine == "spark"
    assert settings.data_dir == "./data"


def test_the_config_flag_beats_the_config_env_var(captured: Captured, tmp_path: Path) -> None:
    (tmp_path / "flag.toml").write_text("broker_port = 1\n")
    (tmp_path / "env.toml").write_text("broker_port = 2\n")
    result = CliRunner().invoke(app, ["serve", "--config", str(tmp_path / "flag.toml")],
                                env={"COMPACTD_CONFIG": str(tmp_path / "env.toml")})
    assert result.exit_code == 0, result.output
    assert captured.settings[0].broker_port == 1


def test_every_setting_flag_reaches_the_settings(captured: Captured) -> None:
    args = ["serve", "--data-dir", "/d", "--bind", "0.0.0.0", "--broker-port", "1", "--http-port", "2",
            "--compaction-monitor-interval-seconds", "0.5", "--compaction-threshold-bytes", "10",
            "--compaction-phase-one-loop-timeout-seconds", "3", "--topic-compaction-retain-null-key",
            "--compaction-max-concurrent-runs", "4", "--compaction-engine", "local",
            "--spark-master", "spark://h:7077", "--fsync", "always",
            "--managed-ledger-max-entries-per-ledger", "5", "--managed-ledger-max-size-per-ledger-bytes", "6",
            "--no-authentication-enabled", "--token-public-key", "file:///pub.pem",
            "--super-user-roles", "a,b", "--broker-port-tls", "7", "--http-port-tls", "8"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert captured.settings == [Settings(
        data_dir="/d", bind="0.0.0.0", broker_port=1, http_port=2, compaction_monitor_interval_seconds=0.5,
        compaction_threshold_bytes=10, compaction_phase_one_loop_timeout_seconds=3.0,
        topic_compaction_retain_null_key=True, compaction_max_concurrent_runs=4, compaction_engine="local",
        spark_master="spark://h:7077", fsync="always", managed_ledger_max_entries_per_ledger=5,
        managed_ledger_max_size_per_ledger_bytes=6, authentication_enabled=False,
        token_public_key="file:///pub.pem", super_user_roles=("a", "b"), broker_port_tls=7, http_port_tls=8,
    )]


@pytest.mark.parametrize(("error", "code"), [
    (None, 0),
    (None, 1),
    (ConfigError("bad"), 2),
    (DataDirLockedError("data dir d is in use by another compactd process", data_dir="d"), 1),
])
def test_exit_codes(captured: Captured, error: Exception | None, code: int) -> None:
    captured.code, captured.error = code, error
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == code
    if error is not None:
        assert result.stderr == f"compactd: {error}\n"


def test_a_missing_config_file_is_a_settings_error(captured: Captured, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"compactd: cannot read config file {tmp_path / 'missing.toml'}")
    assert captured.settings == []


# -- the real process -----------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--broker-port", "abc"], "compactd: --broker-port: 'abc' is not an integer"),
    (["--http-port", "70000"], "compactd: --http-port: '70000' is out of range (0..65535)"),
    (["--compaction-engine", "flink"], "compactd: --compaction-engine: 'flink' is not one of auto, local, spark"),
    (["--authentication-enabled", "--token-secret-key", "file:///k"],
     "compactd: --token-secret-key: cannot read key file /k"),
    (["--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"], "compactd: --tls-cert-file/--tls-key-file: cannot load c.pem"),
])
def test_bad_settings_exit_2_naming_the_value(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run([*COMPACTD, "serve", "--data-dir", str(tmp_path / "data"), *args],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def _start(data_dir: Path | None, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    args = [*COMPACTD, "serve", "--broker-port", "0", "--http-port", "0"]
    if data_dir is not None:
        args += ["--data-dir", str(data_dir)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _ready(process: subprocess.Popen[str]) -> tuple[int, int]:
    """The (broker, http) ports of the ready line, waiting for it at most ``WAIT_S``."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], WAIT_S)
    assert ready, "serve printed nothing"
    line = process.stdout.readline()
    match = READY.fullmatch(line)
    assert match, (line, process.poll())
    return int(match[1]), int(match[2])


def _stop(process: subprocess.Popen[str], stop_signal: int) -> str:
    """Signal ``process``, assert it exits 0 having printed nothing more; its stderr."""
    process.send_signal(stop_signal)
    stdout, stderr = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0, stderr
    assert stdout == ""
    assert "Traceback" not in stderr
    return stderr


def _kill_if_running(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.communicate(timeout=WAIT_S)


def test_serve_answers_on_both_ports_holds_the_lock_and_stops_on_sigterm(tmp_path: Path) -> None:
    pytest.importorskip("api.broker.service")
    with _start(tmp_path / "data") as first:
        try:
            broker_port, http_port = _ready(first)
            socket.create_connection(("127.0.0.1", broker_port), timeout=WAIT_S).close()
            response = httpx.get(f"http://127.0.0.1:{http_port}/admin/v2/brokers/health", timeout=WAIT_S)
            assert (response.status_code, response.text) == (200, "ok")
            _second_serve_is_refused(tmp_path / "data")
            _stop(first, signal.SIGTERM)
        finally:
            _kill_if_running(first)
    assert (tmp_path / "data" / "metadata.db").exists()
    with _start(tmp_path / "data") as third:  # the lock was released
        try:
            _ready(third)
            _stop(third, signal.SIGINT)
        finally:
            _kill_if_running(third)


def _second_serve_is_refused(data_dir: Path) -> None:
    second = subprocess.run([*COMPACTD, "serve", "--broker-port", "0", "--http-port", "0",
                             "--data-dir", str(data_dir)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert second.returncode == 1
    assert "in use by another compactd process" in second.stderr
    assert second.stderr.startswith("compactd: ")
    assert "Traceback" not in second.stderr
    assert second.stdout == ""


def test_serve_reads_the_data_dir_from_the_environment(tmp_path: Path) -> None:
    pytest.importorskip("api.broker.service")
    env = {**os.environ, "COMPACTD_DATA_DIR": str(tmp_path / "from-env")}
    with _start(None, env) as process:
        try:
            _ready(process)
            assert (tmp_path / "from-env" / "LOCK").exists()
            _stop(process, signal.SIGTERM)
        finally:
            _kill_if_running(process)
    assert (tmp_path / "from-env" / "metadata.db").exists()
