"""The admin REST API end to end: a real ``compactd serve`` process, httpx and pulsar-client.

What each test shows (issue 6):

* ``test_trigger_then_read_compacted_sees_the_latest_value_per_key`` — PUT compaction,
  GET it until SUCCESS, then a ``is_read_compacted`` reader sees one message per key, the
  latest; stats and internal stats show the run.
* ``test_compaction_status_survives_a_restart`` — SUCCESS is persisted: SIGTERM, restart
  on the same data dir, still SUCCESS.
* ``test_topic_threshold_starts_a_run_without_a_trigger`` — with the monitor at 1 s, a
  topic ``compactionThreshold`` set over REST starts a run once the backlog passes it.
* ``test_threshold_precedence_topic_over_namespace_over_broker_default`` — a topic policy
  that is too high holds a topic back although its namespace's is low; removing it lets the
  namespace's apply; a high namespace policy holds back a topic the broker default would
  compact, and removing it lets the default apply.
* ``test_concurrent_runs_never_exceed_the_limit`` — with ``--compaction-max-concurrent-runs
  1``, several topics triggered at once over REST and by the scheduler: the run intervals
  from stats never overlap, and ``/metrics`` never reports more than one run running.
* ``test_delete_topic_and_compaction_subscription_delete_the_compacted_ledger`` — the
  compacted ledger's file is gone after DELETE topic, and after DELETE of the
  ``__compaction`` subscription (internal stats then read ledgerId -1).
* ``test_schemathesis_finds_no_server_error`` — a bounded schemathesis run over the served
  ``/openapi.json``, one test item per operation and generation mode (so that xdist spreads
  them), on one ``compactd serve`` per module and worker: no 5xx, answers conform to the
  documented codes, types and schemas, every error carries ``{"reason"}``, each item made
  requests; ``test_the_schemathesis_items_cover_every_served_operation`` — the items were
  collected from the document the server serves, every operation of it.

Every wait is bounded; every process, pipe and client is closed.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.config import Settings
from api.http import create_app
from tests.integration.wire.helpers import wait_until
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 30.0  # a compaction of these small topics ends within seconds
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


class Serve(ServeProcess):
    """``compactd serve`` (fsync none: these tests kill nothing) with an HTTP client on its port."""

    def __init__(self, data_dir: Path, log_path: Path, *flags: str) -> None:
        super().__init__(data_dir, log_path, "--fsync", "none", *flags)
        self.http = httpx.Client(base_url=self.http_url, timeout=30)

    def _close(self) -> None:
        self.http.close()
        super()._close()


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[Callable[..., Serve]]:
    """Start ``compactd serve`` on ``directory/data`` with extra flags; all are stopped after."""
    started: list[Serve] = []

    def run(*flags: str) -> Serve:
        serve = Serve(directory / "data", directory / "serve.log", *flags)
        started.append(serve)
        return serve

    yield run
    for serve in started:
        if serve.running:
            assert serve.terminate() == 0
        else:
            serve.kill()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    """``serving`` for one test, on ``tmp_path``."""
    with serving(tmp_path) as run:
        yield run


class PulsarClient:
    """A real pulsar client that closes itself."""

    def __init__(self, url: str) -> None:
        self.client = pulsar.Client(url, operation_timeout_seconds=10, logger=QUIET)

    def __enter__(self) -> Any:
        return self.client

    def __exit__(self, *_exc: object) -> None:
        self.client.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def topic_url(topic: str) -> str:
    """``persistent://t/n/x`` → ``/admin/v2/persistent/t/n/x``."""
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def produce(url: str, topic: str, pairs: list[tuple[str, str]], *, batched: bool = False) -> None:
    with PulsarClient(url) as client:
        producer = client.create_producer(topic, batching_enabled=batched, batching_max_publish_delay_ms=5)
        try:
            for key, value in pairs:
                producer.send_async(value.encode(), lambda _result, _message_id: None, partition_key=key)
            producer.flush()
        finally:
            producer.close()


def status_of(serve: Serve, topic: str) -> dict[str, Any]:
    response = serve.http.get(topic_url(topic) + "/compaction")
    assert response.status_code == 200, response.text
    status: dict[str, Any] = response.json()
    return status


def wait_for_success(serve: Serve, topic: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
    def done() -> bool:
        status = status_of(serve, topic)
        assert status["status"] != "ERROR", status
        return status["status"] == "SUCCESS"
    wait_until(done, f"compaction of {topic} to succeed", timeout_s)


def read_compacted(url: str, topic: str) -> list[tuple[str, str]]:
    with PulsarClient(url) as client:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        try:
            seen = []
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while reader.has_message_available():
                assert time.monotonic() < deadline, "the compacted view did not end"
                message = reader.read_next(5000)
                seen.append((message.partition_key(), message.data().decode()))
            return seen
        finally:
            reader.close()


# -- (a), (b): trigger, read compacted, status persisted ------------------------------------------

def test_trigger_then_read_compacted_sees_the_latest_value_per_key(start: Callable[..., Serve]) -> None:
    serve = start()
    topic = f"persistent://public/default/{unique('rest-a')}"
    pairs = [(f"k{index % 10}", f"v{index}") for index in range(200)]
    produce(serve.broker_url, topic, pairs, batched=True)
    assert status_of(serve, topic) == {"status": "NOT_RUN", "lastError": ""}
    assert serve.http.put(topic_url(topic) + "/compaction").status_code == 204
    wait_for_success(serve, topic)
    latest = {key: value for key, value in pairs}
    assert sorted(read_compacted(serve.broker_url, topic)) == sorted(latest.items())
    stats = serve.http.get(topic_url(topic) + "/stats").json()
    assert stats["compaction"]["lastCompactionRemovedEventCount"] == 190
    internal = serve.http.get(topic_url(topic) + "/internalStats").json()
    assert internal["compactedLedger"]["ledgerId"] >= 0
    assert internal["cursors"]["__compaction"]["properties"]["CompactedTopicLedger"] == (
        internal["compactedLedger"]["ledgerId"])


def test_compaction_status_survives_a_restart(start: Callable[..., Serve]) -> None:
    serve = start()
    topic = f"persistent://public/default/{unique('rest-b')}"
    produce(serve.broker_url, topic, [("k", "1"), ("k", "2")])
    serve.http.put(topic_url(topic) + "/compaction")
    wait_for_success(serve, topic)
    assert serve.terminate() == 0
    again = start()
    assert status_of(again, topic) == {"status": "SUCCESS", "lastError": ""}
    assert [value for _, value in read_compacted(again.broker_url, topic)] == ["2"]


# -- (c), (d): the threshold scheduler and policy precedence ----------------------------------

def test_topic_threshold_starts_a_run_without_a_trigger(start: Callable[..., Serve]) -> None:
    serve = start("--compaction-monitor-interval-seconds", "1")
    topic = f"persistent://public/default/{unique('rest-c')}"
    assert serve.http.put(topic_url(topic)).status_code == 204
    assert serve.http.post(topic_url(topic) + "/compactionThreshold", json=1000).status_code == 204
    assert serve.http.get(topic_url(topic) + "/compactionThreshold").json() == 1000
    produce(serve.broker_url, topic, [(f"k{index % 5}", "x" * 100) for index in range(50)])
    wait_for_success(serve, topic)
    assert len(read_compacted(serve.broker_url, topic)) == 5


def test_threshold_precedence_topic_over_namespace_over_broker_default(start: Callable[..., Serve]) -> None:
    serve = start("--compaction-monitor-interval-seconds", "1", "--compaction-threshold-bytes", "1000")
    held_by_topic = f"persistent://public/{unique('ns-low')}/t"  # namespace 1 byte, topic 1 TB
    held_by_namespace = f"persistent://public/{unique('ns-high')}/t"  # namespace 1 TB, default 1000
    namespace_url = "/admin/v2/namespaces/" + held_by_topic.removeprefix("persistent://").rsplit("/", 1)[0]
    high_namespace_url = "/admin/v2/namespaces/" + held_by_namespace.removeprefix("persistent://").rsplit("/", 1)[0]
    for url in (namespace_url, high_namespace_url):  # topics live in existing namespaces (issue 14)
        assert serve.http.put(url).status_code == 204
    for topic in (held_by_topic, held_by_namespace):
        assert serve.http.put(topic_url(topic)).status_code == 204
    assert serve.http.post(namespace_url + "/compactionThreshold", json=1).status_code == 204
    assert serve.http.post(topic_url(held_by_topic) + "/compactionThreshold", json=10**12).status_code == 204
    assert serve.http.post(high_namespace_url + "/compactionThreshold", json=10**12).status_code == 204
    for topic in (held_by_topic, held_by_namespace):
        produce(serve.broker_url, topic, [(f"k{index % 5}", "x" * 100) for index in range(50)])

    deadline = time.monotonic() + 3.5  # three scheduler ticks: none may start a run
    while time.monotonic() < deadline:
        for topic in (held_by_topic, held_by_namespace):
            assert status_of(serve, topic)["status"] == "NOT_RUN", topic
        time.sleep(0.2)

    assert serve.http.delete(topic_url(held_by_topic) + "/compactionThreshold").status_code == 204
    assert serve.http.delete(high_namespace_url + "/compactionThreshold").status_code == 204
    wait_for_success(serve, held_by_topic)  # the namespace's 1 byte applies now
    wait_for_success(serve, held_by_namespace)  # the broker default's 1000 bytes apply now


# -- (e): the concurrency limit --------------------------------------------------------------

def _run_intervals(serve: Serve, topics: list[str]) -> list[tuple[int, int, str]]:
    intervals = []
    for topic in topics:
        section = serve.http.get(topic_url(topic) + "/stats").json()["compaction"]
        end = section["lastCompactionSucceedTimestamp"]
        intervals.append((end - section["lastCompactionDurationTimeInMills"], end, topic))
    return sorted(intervals)


def _running_runs(serve: Serve) -> int:
    text = serve.http.get("/metrics").text
    match = re.search(r"^compactd_compaction_runs_running(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    assert match is not None, "compactd_compaction_runs_running is missing from /metrics"
    return int(float(match.group(1)))


def test_concurrent_runs_never_exceed_the_limit(start: Callable[..., Serve]) -> None:
    serve = start("--compaction-max-concurrent-runs", "1", "--compaction-monitor-interval-seconds", "1")
    topics = [f"persistent://public/default/{unique(f'rest-e{index}')}" for index in range(4)]
    for topic in topics:
        produce(serve.broker_url, topic, [(f"k{index % 500}", f"v{index}") for index in range(6000)], batched=True)

    # all four triggered at once over REST: only the run-slot limit keeps them apart
    for topic in topics:
        assert serve.http.put(topic_url(topic) + "/compaction").status_code == 204
    observed = []
    deadline = time.monotonic() + 4 * RUN_TIMEOUT_S
    while not all(status_of(serve, topic)["status"] == "SUCCESS" for topic in topics):
        assert time.monotonic() < deadline, [status_of(serve, topic) for topic in topics]
        observed.append(_running_runs(serve))
    assert max(observed, default=0) <= 1, observed
    _assert_disjoint(_run_intervals(serve, topics))

    # the scheduler's runs, all four due at the same tick
    for topic in topics:
        produce(serve.broker_url, topic, [(f"k{index % 500}", f"w{index}") for index in range(3000)], batched=True)
    before = {topic: serve.http.get(topic_url(topic) + "/stats").json()["compaction"] for topic in topics}
    assert serve.http.post("/admin/v2/namespaces/public/default/compactionThreshold", json=1).status_code == 204
    try:
        def all_ran_again() -> bool:
            observed.append(_running_runs(serve))
            return all(serve.http.get(topic_url(topic) + "/stats").json()["compaction"]
                       ["lastCompactionSucceedTimestamp"] > before[topic]["lastCompactionSucceedTimestamp"]
                       for topic in topics)
        wait_until(all_ran_again, "the scheduler to compact every topic", 4 * RUN_TIMEOUT_S)
    finally:
        serve.http.delete("/admin/v2/namespaces/public/default/compactionThreshold")
    assert max(observed) <= 1, observed
    _assert_disjoint(_run_intervals(serve, topics))


def _assert_disjoint(intervals: list[tuple[int, int, str]]) -> None:
    slack_ms = 2  # both ends are whole milliseconds, truncated
    # runs long enough that an overlap would show (the topics are sized for tens of ms)
    assert all(end - begin > slack_ms for begin, end, _ in intervals), intervals
    for (_, first_end, first), (second_start, _, second) in itertools.pairwise(intervals):
        assert second_start >= first_end - slack_ms, f"{first} and {second} overlapped: {intervals}"


# -- (f): deletion deletes the compacted ledger ----------------------------------------------------

def test_delete_topic_and_compaction_subscription_delete_the_compacted_ledger(
        start: Callable[..., Serve], tmp_path: Path) -> None:
    serve = start()

    def ledger_file(ledger_id: int) -> Path:  # ledger.storage.file's naming
        return tmp_path / "data" / "ledgers" / f"{ledger_id:020d}.ledger"

    dropped = f"persistent://public/default/{unique('rest-f-sub')}"
    deleted = f"persistent://public/default/{unique('rest-f-topic')}"
    compacted: dict[str, int] = {}
    for topic in (dropped, deleted):
        produce(serve.broker_url, topic, [("k", "1"), ("k", "2"), ("j", "1")])
        serve.http.put(topic_url(topic) + "/compaction")
        wait_for_success(serve, topic)
        compacted[topic] = serve.http.get(topic_url(topic) + "/internalStats").json()["compactedLedger"]["ledgerId"]
        assert ledger_file(compacted[topic]).exists()

    response = serve.http.delete(topic_url(dropped) + "/subscription/__compaction")
    assert response.status_code == 204, response.text
    internal = serve.http.get(topic_url(dropped) + "/internalStats").json()
    assert internal["compactedLedger"]["ledgerId"] == -1 and internal["compactedLedger"]["entries"] == -1
    assert not ledger_file(compacted[dropped]).exists()
    assert sorted(value for _, value in read_compacted(serve.broker_url, dropped)) == ["1", "1", "2"]  # raw

    topic_ledgers = [entry["ledgerId"] for entry in
                     serve.http.get(topic_url(deleted) + "/internalStats").json()["ledgers"]]
    assert topic_ledgers and all(ledger_file(ledger_id).exists() for ledger_id in topic_ledgers)
    assert serve.http.delete(topic_url(deleted)).status_code == 204
    assert not ledger_file(compacted[deleted]).exists()
    assert not any(ledger_file(ledger_id).exists() for ledger_id in topic_ledgers)
    assert serve.http.get(topic_url(deleted) + "/internalStats").status_code == 404
    assert deleted not in serve.http.get("/admin/v2/persistent/public/default").json()


# -- (g): schemathesis over the served schema ------------------------------------------------------

# Generated names are mostly not valid topic names (412); half the cases use real ones.
REAL_NAMES: list[dict[str, str] | None] = [
    None, None, None,
    {"tenant": "public", "namespace": "default", "topic": "a"},
    {"tenant": "public", "namespace": "default", "topic": "b"},
    {"tenant": "public", "namespace": "default", "topic": "a", "subscription": "__compaction"},
]
EXAMPLES = 15  # generated cases per operation and mode
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def openapi_operations(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """``(METHOD, path)`` of every operation of an OpenAPI document."""
    return [(method.upper(), path) for path, item in spec["paths"].items() for method in item
            if method in HTTP_METHODS]


def _negatable(spec: dict[str, Any], method: str, path: str) -> bool:
    """Whether schemathesis can make a request to the operation invalid: it takes a body or
    a parameter other than a plain path string (any text is a valid path segment, so such
    an operation has no negative cases: hypothesis finds none, ``Unsatisfiable``)."""
    operation = spec["paths"][path][method.lower()]
    return "requestBody" in operation or any(
        parameter["in"] != "path" or parameter["schema"].get("type") != "string"
        for parameter in operation.get("parameters", []))


# The admin application's document, the one ``compactd serve`` serves (checked below):
# one test item per operation and generation mode, so that xdist spreads them.
SPEC = create_app(Settings()).openapi()
CASES = [pytest.param(method, path, mode, id=f"{mode}-{method} {path}")
         for method, path in openapi_operations(SPEC) for mode in ("positive", "negative")
         if mode == "positive" or _negatable(SPEC, method, path)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, Any]]:
    """One ``compactd serve`` for this module's schemathesis items (in each xdist worker
    that runs some), with topics ``a`` and ``b``, and the schema it serves, loaded."""
    schemathesis = pytest.importorskip("schemathesis")
    with serving(tmp_path_factory.mktemp("schemathesis")) as run:
        serve = run()
        for topic in ("a", "b"):  # some paths hit existing topics
            assert serve.http.put(f"/admin/v2/persistent/public/default/{topic}").status_code == 204
        yield serve, schemathesis.openapi.from_url(serve.http_url + "/openapi.json")


def test_the_schemathesis_items_cover_every_served_operation(served: tuple[Serve, Any]) -> None:
    serve, _ = served
    document = serve.http.get("/openapi.json").json()
    assert document == SPEC  # the items were collected from what the server serves
    operations = openapi_operations(document)
    assert len(operations) > 50, operations  # the admin API, not an empty document
    assert {(method, path) for method, path, mode in (case.values for case in CASES) if mode == "positive"} == set(
        operations)
    negatable = {(method, path) for method, path in operations if _negatable(document, method, path)}
    assert len(negatable) > 20, negatable  # the bodies, integer and query parameters
    assert {(method, path) for method, path, mode in (case.values for case in CASES) if mode == "negative"} == (
        negatable)


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_schemathesis_finds_no_server_error(served: tuple[Serve, Any], method: str, path: str, mode: str) -> None:
    """A bounded schemathesis run of one operation in one generation mode: no 5xx, answers
    conform to the documented codes, types and schemas, every error carries ``{"reason"}``."""
    schemathesis = pytest.importorskip("schemathesis")
    hypothesis = pytest.importorskip("hypothesis")
    requests = pytest.importorskip("requests")
    from hypothesis import strategies
    from schemathesis import checks

    serve, schema = served
    operation = schema[path][method]
    selected = [checks.not_a_server_error, checks.status_code_conformance,
                checks.content_type_conformance, checks.response_schema_conformance]
    failures: list[str] = []
    statuses: list[int] = []
    generation = {"positive": schemathesis.GenerationMode.POSITIVE,
                  "negative": schemathesis.GenerationMode.NEGATIVE}[mode]
    with requests.Session() as session:

        @hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(case=operation.as_strategy(generation), real=strategies.sampled_from(REAL_NAMES))
        def check(case: Any, real: dict[str, str] | None) -> None:
            if real is not None and case.path_parameters:  # half the time, existing names
                case.path_parameters.update({k: v for k, v in real.items() if k in case.path_parameters})
            response = case.call(base_url=serve.http_url, session=session, timeout=30)
            statuses.append(response.status_code)
            try:
                case.validate_response(response, checks=selected)
            except Exception as error:  # noqa: BLE001 - collected and reported together
                failures.append(f"{case.method} {case.formatted_path}: {error}")
            if response.status_code >= 400:
                body = response.json()
                assert isinstance(body, dict) and set(body) == {"reason"}, (case.path, body)

        check()
    assert failures == [], "\n".join(failures[:10])
    assert statuses, "no request was made"
