"""``compactd admin``'s partitioned-topic, tenant and namespace verbs (issue 14).

The command layer against the recording transport of ``test_admin_cli`` (each verb's
request), then end to end against a real ``compactd serve`` with the real client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from api.cli import app
from tests.serve_process import ServeProcess
from tests.unit.api.test_admin_cli import Recorder, _admin

P = "/admin/v2/persistent/public/default/t"


@pytest.mark.parametrize(("args", "call"), [
    (["topics", "create-partitioned-topic", "-p", "4", "t"], ("PUT", f"{P}/partitions", 4)),
    (["topics", "create-partitioned-topic", "--partitions", "2", "acme/orders/o"],
     ("PUT", "/admin/v2/persistent/acme/orders/o/partitions", 2)),
    (["topics", "update-partitioned-topic", "-p", "6", "t"], ("POST", f"{P}/partitions", 6)),
    (["topics", "get-partitioned-topic-metadata", "t"], ("GET", f"{P}/partitions", None)),
    (["topics", "delete-partitioned-topic", "t"], ("DELETE", f"{P}/partitions", None)),
    (["topics", "list-partitioned-topics", "public/default"],
     ("GET", "/admin/v2/persistent/public/default/partitioned", None)),
    (["topics", "partitioned-stats", "t"], ("GET", f"{P}/partitioned-stats", None)),
    (["tenants", "list"], ("GET", "/admin/v2/tenants", None)),
    (["tenants", "create", "acme"], ("PUT", "/admin/v2/tenants/acme", {})),
    (["tenants", "delete", "acme"], ("DELETE", "/admin/v2/tenants/acme", None)),
    (["namespaces", "list", "acme"], ("GET", "/admin/v2/namespaces/acme", None)),
    (["namespaces", "create", "acme/orders"], ("PUT", "/admin/v2/namespaces/acme/orders", None)),
    (["namespaces", "delete", "acme/orders"], ("DELETE", "/admin/v2/namespaces/acme/orders", None)),
])
def test_each_verb_sends_its_request(args: list[str], call: tuple[str, str, Any]) -> None:
    recorder = Recorder()

    result = _admin(recorder, *args)

    assert result.exit_code == 0, result.output
    assert recorder.calls == [call]


@pytest.mark.parametrize(("args", "value"), [
    (["topics", "create-partitioned-topic", "-p", "0", "t"], "'0'"),
    (["topics", "update-partitioned-topic", "-p", "x", "t"], "'x'"),
    (["topics", "create-partitioned-topic", "-p", "-2", "t"], "'-2'"),
    (["tenants", "create", "bad name"], "'bad name'"),
    (["namespaces", "create", "acme"], "'acme'"),
])
def test_bad_values_are_usage_errors_naming_the_value(args: list[str], value: str) -> None:
    recorder = Recorder()

    result = _admin(recorder, *args)

    assert result.exit_code == 2, result.output
    assert value in " ".join(result.stderr.split()), result.stderr  # rich wraps the box
    assert recorder.calls == []


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    directory = tmp_path_factory.mktemp("serve")
    server = ServeProcess(directory / "data", directory / "serve.log", "--compaction-monitor-interval-seconds", "0",
                          "--fsync", "none")
    yield server
    server.terminate()


def _run(serve: ServeProcess, *args: str) -> Result:
    return CliRunner().invoke(app, ["admin", "--admin-url", serve.http_url, *args])


def _ok(serve: ServeProcess, *args: str) -> str:
    result = _run(serve, *args)
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def test_e2e_partitioned_topic_verbs_and_the_client_on_the_http_url(serve: ServeProcess) -> None:
    pulsar = pytest.importorskip("pulsar")
    _ok(serve, "topics", "create-partitioned-topic", "-p", "3", "cli-p")
    assert json.loads(_ok(serve, "topics", "get-partitioned-topic-metadata", "cli-p")) == {"partitions": 3}
    again = _run(serve, "topics", "create-partitioned-topic", "-p", "3", "cli-p")
    assert again.exit_code == 1 and again.stderr.strip().endswith("(HTTP 409)"), again.stderr
    _ok(serve, "topics", "update-partitioned-topic", "-p", "4", "cli-p")
    assert "persistent://public/default/cli-p" in _ok(serve, "topics", "list-partitioned-topics", "public/default")

    # pulsar.Client on the HTTP URL: lookup and partitioned metadata over REST.
    client = pulsar.Client(serve.http_url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        assert len(client.get_topic_partitions("cli-p")) == 4
        consumer = client.subscribe("cli-p", "sub")
        producer = client.create_producer("cli-p", batching_enabled=False)
        for i in range(8):
            producer.send(f"{i}".encode())
        got = sorted(int(consumer.receive(5000).data()) for _ in range(8))
        assert got == list(range(8))
        assert {m.rsplit("-", 1)[1] for m in client.get_topic_partitions("cli-p")} == {"0", "1", "2", "3"}
        with pytest.raises(pulsar.exceptions.PulsarException):  # a 404 lookup: the client fails at once
            client.create_producer("persistent://nobody/nothing/t")
        producer.close()
        consumer.close()
    finally:
        client.close()

    stats = json.loads(_ok(serve, "topics", "partitioned-stats", "cli-p"))
    assert stats["msgInCounter"] == 8 and stats["metadata"] == {"partitions": 4}
    _ok(serve, "topics", "delete-partitioned-topic", "cli-p")
    assert json.loads(_ok(serve, "topics", "get-partitioned-topic-metadata", "cli-p")) == {"partitions": 0}


def test_e2e_tenant_and_namespace_verbs(serve: ServeProcess) -> None:
    assert _ok(serve, "tenants", "list").splitlines() == ["public"]
    assert _ok(serve, "namespaces", "list", "public").splitlines() == ["public/default"]
    _ok(serve, "tenants", "create", "acme")
    _ok(serve, "namespaces", "create", "acme/orders")
    assert _ok(serve, "namespaces", "list", "acme").splitlines() == ["acme/orders"]
    busy = _run(serve, "tenants", "delete", "acme")
    assert busy.exit_code == 1 and "(HTTP 409)" in busy.stderr
    _ok(serve, "namespaces", "delete", "acme/orders")
    _ok(serve, "tenants", "delete", "acme")
    assert _ok(serve, "tenants", "list").splitlines() == ["public"]
