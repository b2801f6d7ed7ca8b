"""Monitoring and administration a Pulsar operator expects (issue 16, point 6), end to end:
a real ``compactd serve`` process, the real pulsar-client, httpx and the ``compactd admin``
command line.

* ``test_stats_report_connected_clients_and_count_messages_not_entries`` — a batching
  producer and a consumer: stats list the publisher and the consumer with their figures;
  ``msgInCounter`` counts the messages of the batches (more than the entries), in/out
  rates and throughput are positive; a closed producer leaves ``publishers``; a reader
  shows as a non-durable subscription.
* ``test_metrics_carry_topic_subscription_broker_and_process_families`` — ``/metrics``
  agrees with stats on ``pulsar_in_messages_total``, backlog and storage size, and carries
  connections, broker totals and ``process_*``.
* ``test_docs_pages_load_every_asset_from_compactd_itself`` — ``/docs`` and ``/redoc``
  reference only paths on compactd, and each one answers (no CDN: works offline).
* ``test_admin_topic_verbs_move_subscriptions_as_asked`` — ``compactd admin topics``
  subscriptions, peek-messages, last-message-id, clear-backlog, reset-cursor (message id
  and time) and unload, each checked through stats or a consumer; ``--admin-url`` given
  after the sub-command.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from api.cli import app
from tests.integration.wire.helpers import wait_until
from tests.serve_process import PROCESS_TIMEOUT_S, ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

WAIT_S = 10.0
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    process = ServeProcess(tmp_path / "data", tmp_path / "serve.log", "--fsync", "none")
    yield process
    assert process.terminate() == 0


@pytest.fixture
def client(serve: ServeProcess) -> Iterator[Any]:
    instance = pulsar.Client(serve.broker_url, operation_timeout_seconds=10, logger=QUIET)
    yield instance
    instance.close()


def unique_topic() -> str:
    return f"persistent://public/default/ops-{uuid.uuid4().hex[:8]}"


def rest(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def get_json(serve: ServeProcess, path: str) -> Any:
    response = httpx.get(serve.http_url + path, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def admin(serve: ServeProcess, *args: str) -> str:
    """``compactd admin ARGS --admin-url URL`` in this process (the real HTTP client)."""
    result = CliRunner().invoke(app, ["admin", *args, "--admin-url", serve.http_url])
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def produce(client: Any, topic: str, count: int, *, batched: bool) -> Any:
    producer = client.create_producer(topic, producer_name=f"p-{uuid.uuid4().hex[:6]}",
                                      batching_enabled=batched, batching_max_messages=5,
                                      batching_max_publish_delay_ms=50)
    for index in range(count):
        producer.send_async(f"v{index}".encode(), lambda _result, _id: None, partition_key=f"k{index}")
    producer.flush()
    return producer


def test_stats_report_connected_clients_and_count_messages_not_entries(serve: ServeProcess, client: Any) -> None:
    topic = unique_topic()
    consumer = client.subscribe(topic, "sub", consumer_name="reader-1")
    producer = produce(client, topic, 20, batched=True)
    for _ in range(20):
        consumer.acknowledge(consumer.receive(int(WAIT_S * 1000)))
    stats = wait_until(lambda: (s := get_json(serve, rest(topic) + "/stats"))["msgOutCounter"] == 20 and s,
                       "the consumer's messages counted", WAIT_S)
    entries = get_json(serve, rest(topic) + "/internalStats")["entriesAddedCounter"]
    assert stats["msgInCounter"] == 20 > entries  # batches: fewer entries than messages
    assert stats["bytesInCounter"] > 0 and stats["msgRateIn"] > 0 and stats["msgThroughputIn"] > 0
    assert stats["msgRateOut"] > 0 and stats["msgThroughputOut"] > 0 and stats["bytesOutCounter"] > 0
    [publisher] = stats["publishers"]
    assert publisher["producerName"] == producer.producer_name()
    assert publisher["msgRateIn"] > 0 and publisher["address"].startswith("/127.0.0.1:")
    assert publisher["connectedSince"] and publisher["clientVersion"]
    subscription = stats["subscriptions"]["sub"]
    [reader] = subscription["consumers"]
    assert reader["consumerName"] == "reader-1" and reader["msgOutCounter"] == 20
    assert subscription["msgOutCounter"] == 20 and subscription["msgRateOut"] > 0
    producer.close()
    wait_until(lambda: get_json(serve, rest(topic) + "/stats")["publishers"] == [],
               "the closed producer leaving the stats", WAIT_S)
    consumer.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    for _ in range(20):
        reader.read_next(int(WAIT_S * 1000))
    readers = wait_until(lambda: [
        s for s in get_json(serve, rest(topic) + "/stats")["subscriptions"].values()
        if not s["isDurable"] and s["msgOutCounter"] == 20],
        "the reader's messages counted", WAIT_S)
    assert len(readers) == 1 and len(readers[0]["consumers"]) == 1  # a reader's non-durable subscription
    reader.close()


def scrape(serve: ServeProcess) -> dict[tuple[str, str, str], float]:
    """(sample name, topic label, subscription label) -> value."""
    response = httpx.get(serve.http_url + "/metrics", timeout=10)
    assert response.status_code == 200
    return {(sample.name, sample.labels.get("topic", ""), sample.labels.get("subscription", "")): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def test_metrics_carry_topic_subscription_broker_and_process_families(serve: ServeProcess, client: Any) -> None:
    topic = unique_topic()
    consumer = client.subscribe(topic, "sub")
    produce(client, topic, 12, batched=True).close()
    stats = get_json(serve, rest(topic) + "/stats")
    samples = scrape(serve)
    assert samples[("pulsar_in_messages_total", topic, "")] == stats["msgInCounter"] == 12
    assert samples[("pulsar_in_bytes_total", topic, "")] == stats["bytesInCounter"] > 0
    assert samples[("pulsar_storage_size", topic, "")] == stats["storageSize"] > 0
    backlog = stats["subscriptions"]["sub"]["msgBacklog"]
    assert backlog > 0
    assert samples[("pulsar_subscription_back_log", topic, "sub")] == backlog
    assert samples[("pulsar_msg_backlog", topic, "")] == sum(s["msgBacklog"] for s in stats["subscriptions"].values())
    assert samples[("pulsar_consumers_count", topic, "")] == 1
    assert samples[("pulsar_subscription_consumers_count", topic, "sub")] == 1
    assert samples[("pulsar_active_connections", "", "")] >= 1
    assert samples[("pulsar_broker_topics_count", "", "")] >= 1
    assert samples[("pulsar_broker_storage_size", "", "")] >= stats["storageSize"]
    assert samples[("process_resident_memory_bytes", "", "")] > 0
    assert samples[("process_open_fds", "", "")] > 0
    consumer.close()


def test_admin_topic_verbs_move_subscriptions_as_asked(serve: ServeProcess, client: Any) -> None:
    topic = unique_topic()
    client.subscribe(topic, "sub").close()  # a durable subscription at the start, then no consumer
    ids = []
    producer = client.create_producer(topic, batching_enabled=False)
    for index in range(5):
        ids.append(producer.send(f"v{index}".encode(), partition_key=f"k{index}"))

    def backlog() -> int:
        return int(get_json(serve, rest(topic) + "/stats")["subscriptions"]["sub"]["msgBacklog"])

    assert admin(serve, "topics", "subscriptions", topic).split() == ["__compaction", "sub"]
    peeked = admin(serve, "topics", "peek-messages", topic, "-s", "sub", "-n", "2")
    assert peeked.count("Message ID:") == 2 and "v0" in peeked and "v1" in peeked and "v2" not in peeked
    assert f"Message ID: {ids[0].ledger_id()}:{ids[0].entry_id()}" in peeked and "Key: k0" in peeked
    last = json.loads(admin(serve, "topics", "last-message-id", topic))
    assert (last["ledgerId"], last["entryId"]) == (ids[4].ledger_id(), ids[4].entry_id())
    assert backlog() == 5
    admin(serve, "topics", "clear-backlog", topic, "-s", "sub")
    assert backlog() == 0
    admin(serve, "topics", "reset-cursor", topic, "-s", "sub", "-m", f"{ids[2].ledger_id()}:{ids[2].entry_id()}")
    assert backlog() == 3
    admin(serve, "topics", "reset-cursor", topic, "-s", "sub", "-m", f"{ids[2].ledger_id()}:{ids[2].entry_id()}",
          "-e")
    assert backlog() == 2
    admin(serve, "topics", "reset-cursor", topic, "-s", "sub", "-t", "1h")
    assert backlog() == 5
    consumer = client.subscribe(topic, "sub")
    assert consumer.receive(int(WAIT_S * 1000)).data() == b"v0"  # reset to the start: v0 comes first
    admin(serve, "topics", "unload", topic)
    producer.send(b"after-unload", partition_key="k9")  # the client reconnects to the reloaded topic
    # The client learns of the unload (CLOSE_CONSUMER) on its own thread: until it reconnects,
    # receive() may still hand out what it prefetched on the old connection (v1, v2, … in
    # order); then what was not acknowledged comes again from v0, then the new message.
    everything = [b"v1", b"v2", b"v3", b"v4", b"v0", b"v1", b"v2", b"v3", b"v4", b"after-unload"]
    received = [consumer.receive(int(WAIT_S * 1000)).data()]
    while received[-1] != b"after-unload":
        assert len(received) < len(everything), received
        received.append(consumer.receive(int(WAIT_S * 1000)).data())
    prefetched = len(received) - 6
    assert received[prefetched:] == [b"v0", b"v1", b"v2", b"v3", b"v4", b"after-unload"], received
    assert received[:prefetched] == everything[:prefetched], received  # before the reconnect: the old queue
    assert get_json(serve, rest(topic) + "/stats")["msgInCounter"] == 1  # counted since the reload
    producer.close()
    consumer.close()


def test_admin_url_after_the_sub_command_in_a_real_process(serve: ServeProcess, client: Any) -> None:
    topic = unique_topic()
    client.create_producer(topic).close()
    executable = Path(sys.executable).with_name("compactd")
    result = subprocess.run([str(executable), "admin", "topics", "stats", topic, "--admin-url", serve.http_url],
                            capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["msgInCounter"] == 0


class _References(HTMLParser):
    """Every ``src`` and ``href`` of a page, and the spec URL its inline script names."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls.extend(value for name, value in attrs if name in ("src", "href", "spec-url") and value)

    def handle_data(self, data: str) -> None:
        self.urls.extend(re.findall(r"url: '([^']+)'", data))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_every_asset_from_compactd_itself(serve: ServeProcess, page: str) -> None:
    response = httpx.get(serve.http_url + page, timeout=10)
    assert response.status_code == 200
    parser = _References()
    parser.feed(response.text)
    scripts = [url for url in parser.urls if url.endswith(".js")]
    assert scripts and "/openapi.json" in parser.urls
    for url in parser.urls:
        assert url.startswith("/"), f"{page} references {url} outside compactd"
        asset = httpx.get(serve.http_url + url, timeout=10)
        assert asset.status_code == 200 and len(asset.content) > 0, url
    assert "validator.swagger.io" not in response.text
