"""``compactd admin``: pulsar-admin's verbs over the admin REST API.

Three layers: the pure parsers (sizes, durations, ratios, names → REST paths) as tables;
the command layer against an httpx ``MockTransport`` that records every request (paths,
bodies, headers, output, error lines and exit codes); and end to end against a real
``compactd serve`` process, driven by the CLI in process and once as the console script.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from api.admin_cli import (
    namespace_path,
    parse_duration_ms,
    parse_ratio,
    parse_size,
    topic_path,
)
from api.cli import app
from tests.serve_process import ServeProcess

PROCESS_TIMEOUT_S = 60
WAIT_FOR_RUN_S = "60"


@pytest.fixture(autouse=True)
def _no_compactd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("COMPACTD_"):
            monkeypatch.delenv(name)


# -- the pure parsers ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("0", 0), ("1048576", 1048576), ("100", 100), ("1k", 1024), ("1K", 1024), ("100M", 100 << 20),
    ("2g", 2 << 30), ("3G", 3 << 30), ("1T", 1 << 40), (" 5M ", 5 << 20),
])
def test_sizes_parse_as_pulsar_admin(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "-5M", "1.5M", "10X", "M", "1MB", "1 M", "ten", "0x10"])
def test_bad_sizes_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=f"invalid size {text!r}"):
        parse_size(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("0", 0), ("5000", 5000), ("250ms", 250), ("30s", 30_000), ("10m", 600_000), ("1h", 3_600_000),
    ("7d", 604_800_000), ("2w", 1_209_600_000), ("1y", 31_536_000_000),
])
def test_durations_parse_to_milliseconds(text: str, expected: int) -> None:
    assert parse_duration_ms(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "-1h", "1.5h", "1H", "h", "1hour", "1 h", "soon"])
def test_bad_durations_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=f"invalid duration {text!r}"):
        parse_duration_ms(text)


@pytest.mark.parametrize(("text", "expected"), [("0", 0.0), ("0.5", 0.5), ("1", 1.0), (".25", 0.25)])
def test_ratios_parse_between_0_and_1(text: str, expected: float) -> None:
    assert parse_ratio(text) == expected


@pytest.mark.parametrize("text", ["-0.1", "1.01", "2", "nan", "inf", "half", ""])
def test_bad_ratios_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=f"invalid ratio {text!r}"):
        parse_ratio(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("t", "/admin/v2/persistent/public/default/t"),
    ("my-topic.v1", "/admin/v2/persistent/public/default/my-topic.v1"),
    ("persistent://public/default/t", "/admin/v2/persistent/public/default/t"),
    ("persistent://acme/orders/o-partition-0", "/admin/v2/persistent/acme/orders/o-partition-0"),
    ("acme/orders/o", "/admin/v2/persistent/acme/orders/o"),
])
def test_topic_names_map_to_rest_paths(text: str, expected: str) -> None:
    assert topic_path(text) == expected


@pytest.mark.parametrize("text", [
    "", "non-persistent://public/default/t", "http://public/default/t", "persistent://public/t",
    "persistent://a/b/c/d", "a/b", "bad name", "persistent://public/default/", "t?x=1",
])
def test_bad_topic_names_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match="invalid topic name"):
        topic_path(text)


def test_namespaces_map_to_rest_paths() -> None:
    assert namespace_path("public/default") == "/admin/v2/namespaces/public/default"
    for bad in ("public", "public/default/t", "", "a//b", "a/b c"):
        with pytest.raises(ValueError, match=f"invalid namespace {bad!r}"):
            namespace_path(bad)


# -- the command layer, against a recording transport -------------------------------------


class Recorder:
    """An httpx transport answering from a script of responses and keeping the requests."""

    def __init__(self, *answers: httpx.Response | Callable[[httpx.Request], httpx.Response]) -> None:
        self.answers = list(answers) or [httpx.Response(204)]
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
        return answer(request) if callable(answer) else answer

    @property
    def calls(self) -> list[tuple[str, str, Any]]:
        """(method, path, decoded body or None) of every request."""
        return [(r.method, r.url.path, json.loads(r.content) if r.content else None) for r in self.requests]


def _admin(recorder: Recorder, *args: str) -> Result:
    return CliRunner().invoke(app, ["admin", *args], obj=recorder.transport)


@pytest.mark.parametrize(("args", "call"), [
    (["topics", "create", "t"], ("PUT", "/admin/v2/persistent/public/default/t", None)),
    (["topics", "delete", "persistent://a/b/t"], ("DELETE", "/admin/v2/persistent/a/b/t", None)),
    (["topics", "compact", "t"], ("PUT", "/admin/v2/persistent/public/default/t/compaction", None)),
    (["topics", "delete-subscription", "--subscription", "sub-1", "t"],
     ("DELETE", "/admin/v2/persistent/public/default/t/subscription/sub-1", None)),
    (["topics", "delete-subscription", "-s", "__compaction", "t"],
     ("DELETE", "/admin/v2/persistent/public/default/t/subscription/__compaction", None)),
    (["topics", "set-compaction-threshold", "--threshold", "100M", "t"],
     ("POST", "/admin/v2/persistent/public/default/t/compactionThreshold", 100 << 20)),
    (["topics", "remove-compaction-threshold", "t"],
     ("DELETE", "/admin/v2/persistent/public/default/t/compactionThreshold", None)),
    (["namespaces", "set-compaction-threshold", "--threshold", "1G", "public/default"],
     ("POST", "/admin/v2/namespaces/public/default/compactionThreshold", 1 << 30)),
    (["namespaces", "remove-compaction-threshold", "public/default"],
     ("DELETE", "/admin/v2/namespaces/public/default/compactionThreshold", None)),
    (["topics", "set-min-cleanable-dirty-ratio", "--ratio", "0.5", "t"],
     ("POST", "/admin/v2/persistent/public/default/t/minCleanableDirtyRatio", 0.5)),
    (["namespaces", "set-min-cleanable-dirty-ratio", "--ratio", "1", "acme/orders"],
     ("POST", "/admin/v2/namespaces/acme/orders/minCleanableDirtyRatio", 1.0)),
    (["topics", "set-max-compaction-lag", "--lag", "1h", "t"],
     ("POST", "/admin/v2/persistent/public/default/t/maxCompactionLagMs", 3_600_000)),
    (["namespaces", "set-max-compaction-lag", "--lag", "1500", "public/default"],
     ("POST", "/admin/v2/namespaces/public/default/maxCompactionLagMs", 1500)),
    (["topics", "set-delete-retention", "--retention", "1d", "t"],
     ("POST", "/admin/v2/persistent/public/default/t/deleteRetentionMs", 86_400_000)),
    (["topics", "set-min-compaction-lag", "--lag", "10m", "t"],
     ("POST", "/admin/v2/persistent/public/default/t/minCompactionLagMs", 600_000)),
    (["namespaces", "get-min-compaction-lag", "public/default"],
     ("GET", "/admin/v2/namespaces/public/default/minCompactionLagMs", None)),
    (["namespaces", "set-compaction-max-bytes-per-second", "--rate", "10M", "public/default"],
     ("POST", "/admin/v2/namespaces/public/default/compactionMaxBytesPerSecond", 10 << 20)),
    (["topics", "remove-compaction-max-bytes-per-second", "t"],
     ("DELETE", "/admin/v2/persistent/public/default/t/compactionMaxBytesPerSecond", None)),
    (["namespaces", "remove-delete-retention", "public/default"],
     ("DELETE", "/admin/v2/namespaces/public/default/deleteRetentionMs", None)),
    (["topics", "set-deduplication", "--enable", "t"],
     ("POST", "/admin/v2/persistent/public/default/t/deduplicationEnabled", True)),
    (["namespaces", "set-deduplication", "-d", "public/default"],
     ("POST", "/admin/v2/namespaces/public/default/deduplicationEnabled", False)),
    (["topics", "get-deduplication", "t"],
     ("GET", "/admin/v2/persistent/public/default/t/deduplicationEnabled", None)),
    (["namespaces", "remove-deduplication", "public/default"],
     ("DELETE", "/admin/v2/namespaces/public/default/deduplicationEnabled", None)),
])
def test_each_verb_sends_its_request(args: list[str], call: tuple[str, str, Any]) -> None:
    recorder = Recorder()

    result = _admin(recorder, *args)

    assert result.exit_code == 0, result.output
    assert recorder.calls == [call]
    assert result.stderr == ""


def test_policy_values_are_bare_json_and_ratios_stay_floats() -> None:
    recorder = Recorder()

    assert _admin(recorder, "topics", "set-min-cleanable-dirty-ratio", "--ratio", "0", "t").exit_code == 0

    request = recorder.requests[0]
    assert request.content == b"0.0"
    assert request.headers["content-type"] == "application/json"


@pytest.mark.parametrize(("args", "value"), [
    (["topics", "set-compaction-threshold", "--threshold", "-5", "t"], "'-5'"),
    (["topics", "set-compaction-threshold", "--threshold=10X", "t"], "'10X'"),
    (["namespaces", "set-compaction-threshold", "--threshold", "1.5G", "public/default"], "'1.5G'"),
    (["topics", "set-max-compaction-lag", "--lag", "-1h", "t"], "'-1h'"),
    (["namespaces", "set-delete-retention", "--retention", "forever", "public/default"], "'forever'"),
    (["topics", "set-min-cleanable-dirty-ratio", "--ratio", "1.5", "t"], "'1.5'"),
    (["topics", "stats", "non-persistent://public/default/t"], "'non-persistent://public/default/t'"),
    (["namespaces", "get-compaction-threshold", "public"], "'public'"),
    (["topics", "list", "public/default/t"], "'public/default/t'"),
])
def test_bad_values_are_usage_errors_naming_the_value(args: list[str], value: str) -> None:
    recorder = Recorder()

    result = _admin(recorder, *args)

    assert result.exit_code == 2, result.output
    assert value in " ".join(result.stderr.split()), result.stderr  # rich wraps the box
    assert recorder.requests == []


@pytest.mark.parametrize("switches", [[], ["--enable", "--disable"]], ids=["neither", "both"])
def test_set_deduplication_takes_exactly_one_switch(switches: list[str]) -> None:
    recorder = Recorder()
    result = _admin(recorder, "topics", "set-deduplication", *switches, "t")
    assert result.exit_code == 2, result.output
    assert "--enable" in result.stderr
    assert recorder.requests == []


def test_missing_threshold_option_is_a_usage_error() -> None:
    result = _admin(Recorder(), "topics", "set-compaction-threshold", "t")
    assert result.exit_code == 2
    assert "--threshold" in result.stderr


def test_get_prints_the_json_value_and_null_when_unset() -> None:
    assert _admin(Recorder(httpx.Response(200, json=1048576)),
                  "topics", "get-compaction-threshold", "t").stdout.strip() == "1048576"
    unset = _admin(Recorder(httpx.Response(204)), "namespaces", "get-compaction-threshold", "public/default")
    assert unset.exit_code == 0
    assert unset.stdout.strip() == "null"


def test_documents_print_as_plain_json_off_a_terminal() -> None:
    stats = {"msgInCounter": 3, "compaction": {"lastCompactionRemovedEventCount": 2}}
    recorder = Recorder(httpx.Response(200, json=stats))

    result = _admin(recorder, "topics", "stats", "t")

    assert result.exit_code == 0
    assert json.loads(result.stdout) == stats
    assert recorder.calls == [("GET", "/admin/v2/persistent/public/default/t/stats", None)]
    internal = Recorder(httpx.Response(200, json={"entriesAddedCounter": 1}))
    assert json.loads(_admin(internal, "topics", "stats-internal", "t").stdout) == {"entriesAddedCounter": 1}
    assert internal.calls[0][1] == "/admin/v2/persistent/public/default/t/internalStats"


def test_documents_are_pretty_printed_by_rich_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: treat stdout as a terminal

    result = _admin(Recorder(httpx.Response(200, json={"msgInCounter": 3})), "topics", "stats", "t")

    assert result.exit_code == 0
    assert "\x1b[" in result.stdout and "msgInCounter" in result.stdout


def test_list_prints_one_topic_a_line() -> None:
    names = ["persistent://public/default/a", "persistent://public/default/b"]
    recorder = Recorder(httpx.Response(200, json=names))

    result = _admin(recorder, "topics", "list", "public/default")

    assert result.stdout.splitlines() == names
    assert recorder.calls == [("GET", "/admin/v2/persistent/public/default", None)]


def test_compact_says_the_run_was_requested() -> None:
    result = _admin(Recorder(), "topics", "compact", "t")
    assert result.stdout.strip() == "Topic compaction requested for persistent://public/default/t"


@pytest.mark.parametrize(("answer", "line"), [
    (httpx.Response(404, json={"reason": "Topic persistent://public/default/t not found"}),
     "error: Topic persistent://public/default/t not found (HTTP 404)"),
    (httpx.Response(409, json={"reason": "Compaction already in progress"}),
     "error: Compaction already in progress (HTTP 409)"),
    (httpx.Response(404, json={"detail": "Not Found"}), "error: Not Found (HTTP 404)"),
    (httpx.Response(500, text="boom"), "error: boom (HTTP 500)"),
    (httpx.Response(401, text=""), "error: Unauthorized (HTTP 401)"),
])
def test_error_answers_print_one_line_and_exit_1(answer: httpx.Response, line: str) -> None:
    result = _admin(Recorder(answer), "topics", "compact", "t")

    assert result.exit_code == 1
    assert result.stderr.strip() == line
    assert result.stdout == ""


def test_the_auth_token_is_sent_as_a_bearer_header() -> None:
    recorder = Recorder()
    assert _admin(recorder, "--auth-token", "abc.def", "topics", "create", "t").exit_code == 0
    assert recorder.requests[0].headers["authorization"] == "Bearer abc.def"
    anonymous = Recorder()
    assert _admin(anonymous, "topics", "create", "t").exit_code == 0
    assert "authorization" not in anonymous.requests[0].headers


def test_the_admin_url_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder()
    assert _admin(recorder, "topics", "create", "t").exit_code == 0
    assert str(recorder.requests[0].url).startswith("http://127.0.0.1:8080/admin/v2/")
    monkeypatch.setenv("COMPACTD_ADMIN_URL", "http://broker-1:9090/")
    assert _admin(recorder, "topics", "create", "t").exit_code == 0
    assert str(recorder.requests[1].url).startswith("http://broker-1:9090/admin/v2/")
    assert _admin(recorder, "--admin-url", "http://other:1", "topics", "create", "t").exit_code == 0
    assert str(recorder.requests[2].url).startswith("http://other:1/admin/v2/")


def _free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port: int = listener.getsockname()[1]
        return port


def test_connection_refused_is_one_line_naming_the_url() -> None:
    url = f"http://127.0.0.1:{_free_port()}"

    result = CliRunner().invoke(app, ["admin", "--admin-url", url, "topics", "list", "public/default"])

    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: cannot reach the admin API at {url}: connection refused (is compactd serve running?)"]
    assert "Traceback" not in result.output


def _status(status: str, last_error: str = "") -> httpx.Response:
    return httpx.Response(200, json={"status": status, "lastError": last_error})


def test_compaction_status_without_wait_prints_the_status_once() -> None:
    recorder = Recorder(_status("RUNNING"))

    result = _admin(recorder, "topics", "compaction-status", "t")

    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"status": "RUNNING", "lastError": ""}
    assert recorder.calls == [("GET", "/admin/v2/persistent/public/default/t/compaction", None)]


def test_compaction_status_wait_polls_until_the_run_ends() -> None:
    recorder = Recorder(_status("RUNNING"), _status("RUNNING"), _status("SUCCESS"))

    result = _admin(recorder, "topics", "compaction-status", "-w", "--poll-interval", "0.01", "t")

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "SUCCESS"
    assert len(recorder.requests) == 3


def test_compaction_status_error_exits_1_with_the_last_error() -> None:
    recorder = Recorder(_status("RUNNING"), _status("ERROR", "CompactionTimeoutError: a read took too long"))

    result = _admin(recorder, "topics", "compaction-status", "-w", "--poll-interval", "0.01", "t")

    assert result.exit_code == 1
    assert json.loads(result.stdout)["status"] == "ERROR"
    assert result.stderr.strip() == "error: compaction failed: CompactionTimeoutError: a read took too long"


def test_compaction_status_wait_is_bounded() -> None:
    recorder = Recorder(_status("RUNNING"))

    result = _admin(recorder, "topics", "compaction-status", "-w", "--wait-timeout", "0.2",
                    "--poll-interval", "0.05", "t")

    assert result.exit_code == 1
    assert "still RUNNING after 0.2 s" in result.stderr
    assert 2 <= len(recorder.requests) <= 10


def test_every_verb_of_interfaces_section_1_exists() -> None:
    verbs = {
        "topics": ["create", "delete", "list", "stats", "stats-internal", "compact", "compaction-status",
                   "delete-subscription"],
        "namespaces": [],
    }
    for suffix in ("compaction-threshold", "min-cleanable-dirty-ratio", "max-compaction-lag", "delete-retention"):
        for group in verbs.values():
            group.extend(f"{action}-{suffix}" for action in ("set", "get", "remove"))
    for group, names in verbs.items():
        for name in names:
            result = CliRunner().invoke(app, ["admin", group, name, "--help"])
            assert result.exit_code == 0, (group, name, result.output)


# -- end to end, against a real ``compactd serve`` -----------------------------------------


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    pytest.importorskip("api.routers", reason="the admin REST routes (api/routers) have not landed")
    directory = tmp_path_factory.mktemp("serve")
    server = ServeProcess(directory / "data", directory / "serve.log", "--compaction-monitor-interval-seconds", "0")
    yield server
    server.terminate()


def _run(serve: ServeProcess, *args: str) -> Result:
    return CliRunner().invoke(app, ["admin", "--admin-url", serve.http_url, *args])


def _ok(serve: ServeProcess, *args: str) -> str:
    result = _run(serve, *args)
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def _produce(serve: ServeProcess, topic: str, pairs: list[tuple[str, bytes]]) -> None:
    pulsar = pytest.importorskip("pulsar")
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for key, value in pairs:
            producer.send(value, partition_key=key)
        producer.close()
    finally:
        client.close()


def test_e2e_create_list_and_delete_topics(serve: ServeProcess) -> None:
    assert _ok(serve, "topics", "create", "e2e-a") == ""
    assert "persistent://public/default/e2e-a" in _ok(serve, "topics", "list", "public/default").splitlines()

    again = _run(serve, "topics", "create", "persistent://public/default/e2e-a")
    assert again.exit_code == 1
    assert again.stderr.strip().endswith("(HTTP 409)"), again.stderr

    _ok(serve, "topics", "delete", "e2e-a")
    assert "persistent://public/default/e2e-a" not in _ok(serve, "topics", "list", "public/default").splitlines()
    missing = _run(serve, "topics", "delete", "e2e-a")
    assert missing.exit_code == 1
    assert "(HTTP 404)" in missing.stderr and "e2e-a" in missing.stderr


def test_e2e_compact_and_wait_then_stats(serve: ServeProcess) -> None:
    topic = "persistent://public/default/e2e-compact"
    _produce(serve, topic, [(f"k{index % 3}", f"v{index}".encode()) for index in range(30)])
    assert json.loads(_ok(serve, "topics", "compaction-status", topic))["status"] == "NOT_RUN"

    assert _ok(serve, "topics", "compact", topic).startswith("Topic compaction requested")
    status = json.loads(_ok(serve, "topics", "compaction-status", "-w", "--wait-timeout", WAIT_FOR_RUN_S,
                            "--poll-interval", "0.1", topic))

    assert status["status"] == "SUCCESS"
    stats = json.loads(_ok(serve, "topics", "stats", topic))
    assert stats["compaction"]["lastCompactionRemovedEventCount"] == 27
    internal = json.loads(_ok(serve, "topics", "stats-internal", topic))
    assert internal["compactedLedger"]["ledgerId"] >= 0
    assert internal["compactedLedger"]["entries"] == 3


def test_e2e_compaction_of_a_missing_topic_is_404(serve: ServeProcess) -> None:
    result = _run(serve, "topics", "compact", "e2e-never-created")
    assert result.exit_code == 1
    assert "(HTTP 404)" in result.stderr


def test_e2e_thresholds_set_get_remove_on_topics_and_namespaces(serve: ServeProcess) -> None:
    _ok(serve, "topics", "create", "e2e-policy")
    assert _ok(serve, "topics", "get-compaction-threshold", "e2e-policy").strip() == "null"
    _ok(serve, "topics", "set-compaction-threshold", "--threshold", "100M", "e2e-policy")
    assert json.loads(_ok(serve, "topics", "get-compaction-threshold", "e2e-policy")) == 100 << 20
    _ok(serve, "topics", "remove-compaction-threshold", "e2e-policy")
    assert _ok(serve, "topics", "get-compaction-threshold", "e2e-policy").strip() == "null"

    _ok(serve, "namespaces", "set-compaction-threshold", "--threshold", "1G", "public/default")
    assert json.loads(_ok(serve, "namespaces", "get-compaction-threshold", "public/default")) == 1 << 30
    _ok(serve, "namespaces", "remove-compaction-threshold", "public/default")
    assert _ok(serve, "namespaces", "get-compaction-threshold", "public/default").strip() == "null"


@pytest.mark.parametrize(("suffix", "flag", "value", "stored"), [
    ("min-cleanable-dirty-ratio", "--ratio", "0.5", 0.5),
    ("max-compaction-lag", "--lag", "1h", 3_600_000),
    ("delete-retention", "--retention", "30s", 30_000),
    ("min-compaction-lag", "--lag", "5m", 300_000),
    ("compaction-max-bytes-per-second", "--rate", "1M", 1 << 20),
])
def test_e2e_kafka_style_policies(serve: ServeProcess, suffix: str, flag: str, value: str, stored: object) -> None:
    _run(serve, "topics", "create", "e2e-kafka")  # 409 after the first case
    for group, target in (("topics", "e2e-kafka"), ("namespaces", "public/default")):
        _ok(serve, group, f"set-{suffix}", flag, value, target)
        assert json.loads(_ok(serve, group, f"get-{suffix}", target)) == stored
        _ok(serve, group, f"remove-{suffix}", target)
        assert _ok(serve, group, f"get-{suffix}", target).strip() == "null"


def test_e2e_policy_of_a_missing_topic_is_404(serve: ServeProcess) -> None:
    result = _run(serve, "topics", "set-compaction-threshold", "--threshold", "1M", "e2e-no-such-topic")
    assert result.exit_code == 1
    assert "(HTTP 404)" in result.stderr


def test_e2e_delete_subscription(serve: ServeProcess) -> None:
    topic = "persistent://public/default/e2e-subscription"
    pulsar = pytest.importorskip("pulsar")
    client = pulsar.Client(serve.broker_url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        client.subscribe(topic, "to-delete").close()
    finally:
        client.close()
    assert "to-delete" in json.loads(_ok(serve, "topics", "stats", topic))["subscriptions"]

    _ok(serve, "topics", "delete-subscription", "--subscription", "to-delete", topic)

    assert "to-delete" not in json.loads(_ok(serve, "topics", "stats", topic))["subscriptions"]
    again = _run(serve, "topics", "delete-subscription", "--subscription", "to-delete", topic)
    assert again.exit_code == 1
    assert "(HTTP 404)" in again.stderr


def test_e2e_the_console_script_talks_to_the_server(serve: ServeProcess) -> None:
    executable = Path(sys.executable).with_name("compactd")
    env = {name: value for name, value in os.environ.items() if not name.startswith("COMPACTD_")}
    env["COMPACTD_ADMIN_URL"] = serve.http_url
    _ok(serve, "topics", "create", "e2e-script")

    result = subprocess.run([str(executable), "admin", "topics", "list", "public/default"],
                            capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False, env=env)

    assert result.returncode == 0, result.stderr
    assert "persistent://public/default/e2e-script" in result.stdout.splitlines()
    failed = subprocess.run([str(executable), "admin", "topics", "compact", "e2e-never"],
                            capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False, env=env)
    assert failed.returncode == 1
    assert failed.stderr.startswith("error: ") and "(HTTP 404)" in failed.stderr
    assert "Traceback" not in failed.stderr
