"""``--advertised-address`` (issue 16): what LOOKUP tells clients, on a real ``compactd serve``.

* ``test_lookup_answers_the_advertised_address_and_the_bound_port`` — a raw LOOKUP over
  TCP is answered ``pulsar://ADVERTISED:PORT`` (a name that does not even resolve here: the
  broker only hands it out).
* ``test_lookup_without_an_advertised_address_answers_the_address_reached`` — the default.
* ``test_the_real_client_follows_the_advertised_address`` — advertised ``localhost``: the
  client connects where the lookup points, and produces and consumes there.
* ``test_an_advertised_address_with_a_port_is_refused`` — a clear exit 2 (the other
  malformed values: ``tests/unit/api/test_ops_settings.py``).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from api.wire.frames import FrameDecoder, encode_command, make_command
from message.proto import pulsar_api_pb2 as pb
from tests.serve_process import PROCESS_TIMEOUT_S, ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

SOCKET_TIMEOUT_S = 10.0


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[ServeProcess]]:
    processes: list[ServeProcess] = []
    yield processes
    for process in processes:
        assert process.terminate() == 0


def lookup(broker_url: str, topic: str) -> Any:
    """The LOOKUP_RESPONSE a raw connection to ``broker_url`` gets for ``topic``."""
    address = urlsplit(broker_url)
    assert address.hostname is not None and address.port is not None
    with socket.create_connection((address.hostname, address.port), timeout=SOCKET_TIMEOUT_S) as sock:
        decoder = FrameDecoder(max_frame_bytes=5 * 1024 * 1024)

        def answer() -> Any:
            while True:
                frames = decoder.feed(sock.recv(65536))
                if frames:
                    return frames[0].command

        sock.sendall(encode_command(make_command(pb.CommandConnect(client_version="raw", protocol_version=20))))
        assert answer().type == pb.BaseCommand.CONNECTED
        sock.sendall(encode_command(make_command(pb.CommandLookupTopic(topic=topic, request_id=1))))
        command = answer()
        assert command.type == pb.BaseCommand.LOOKUP_RESPONSE
        return command.lookupTopicResponse


def test_lookup_answers_the_advertised_address_and_the_bound_port(tmp_path: Path,
                                                                  started: list[ServeProcess]) -> None:
    serve = ServeProcess(tmp_path / "data", tmp_path / "serve.log", "--fsync", "none",
                         "--advertised-address", "broker.example.internal")
    started.append(serve)
    port = urlsplit(serve.broker_url).port
    response = lookup(serve.broker_url, "persistent://public/default/t")
    assert response.response == pb.CommandLookupTopicResponse.Connect
    assert response.brokerServiceUrl == f"pulsar://broker.example.internal:{port}"


def test_lookup_without_an_advertised_address_answers_the_address_reached(tmp_path: Path,
                                                                           started: list[ServeProcess]) -> None:
    serve = ServeProcess(tmp_path / "data", tmp_path / "serve.log", "--fsync", "none")
    started.append(serve)
    assert lookup(serve.broker_url, "persistent://public/default/t").brokerServiceUrl == serve.broker_url


def test_the_real_client_follows_the_advertised_address(tmp_path: Path, started: list[ServeProcess]) -> None:
    serve = ServeProcess(tmp_path / "data", tmp_path / "serve.log", "--fsync", "none",
                         "--advertised-address", "localhost")
    started.append(serve)
    port = urlsplit(serve.broker_url).port
    assert lookup(serve.broker_url, "persistent://public/default/t").brokerServiceUrl == f"pulsar://localhost:{port}"
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = client.subscribe("persistent://public/default/t", "s")
        client.create_producer("persistent://public/default/t").send(b"through the advertised address")
        assert consumer.receive(10_000).data() == b"through the advertised address"
    finally:
        client.close()


def test_an_advertised_address_with_a_port_is_refused(tmp_path: Path) -> None:
    bad = "host:6650"
    executable = Path(sys.executable).with_name("compactd")
    result = subprocess.run(
        [str(executable), "serve", "--data-dir", str(tmp_path / "data"), "--advertised-address", bad],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert result.returncode == 2, result.stderr
    assert "--advertised-address" in result.stderr and repr(bad) in result.stderr
    assert "Traceback" not in result.stderr
