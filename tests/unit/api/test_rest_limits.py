"""The admin REST API under hostile input: stats never answer 500, names with control
characters are refused, request bodies are bounded before they are read.

Runs on the real application over a real broker, as ``test_rest`` does (its helpers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from api.broker.service import BrokerService
from cursor.cursor import InitialPosition, ManagedCursor
from tests.unit.api.test_rest import TOPIC, TOPIC_URL, assert_reason, publish, run


def test_stats_of_a_topic_with_a_cursor_row_that_is_not_text_answer_200(tmp_path: Path) -> None:
    """A cursor a broker before validation created from a subscription name that was not
    UTF-8 (upb hands such a proto2 string over as bytes) is shown, escaped, not a 500."""
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        publish(broker, TOPIC, ("k", b"v"))
        ledger = broker.get_topic(TOPIC).ledger
        bad_name = b"sub-\xff\xfe"
        cursor = ManagedCursor.open_durable(ledger, bad_name, InitialPosition.EARLIEST,  # type: ignore[arg-type]
                                            store=broker.cursors)
        cursor.mark_delete(cursor.mark_delete_position, {b"producer-\xff": 3})  # type: ignore[dict-item]
        stats = await client.get(TOPIC_URL + "/stats")
        assert stats.status_code == 200, stats.text
        assert "sub-\\xff\\xfe" in stats.json()["subscriptions"]
        internal = await client.get(TOPIC_URL + "/internalStats")
        assert internal.status_code == 200, internal.text
        shown = internal.json()["cursors"]["sub-\\xff\\xfe"]
        assert shown["properties"] == {"producer-\\xff": 3}
    run(tmp_path, body)


def test_a_topic_path_with_a_control_character_answers_412(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        for url in (TOPIC_URL + "%0A", TOPIC_URL + "%0A/stats", "/admin/v2/persistent/public/default%0A"):
            response = await client.put(url) if url.endswith("%0A") and "default%0A" not in url else \
                await client.get(url)
            assert_reason(response, 412, "\\n")
        assert broker.data_dir.metadata.list_topics() == []
    run(tmp_path, body)


POLICY_URL = TOPIC_URL + "/compactionThreshold"


def test_a_body_declared_over_the_limit_answers_413_before_it_is_read(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        read = 0

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal read
            for _ in range(100):
                read += 1
                yield b"1" * 1000

        headers = {"Content-Length": str(100 * 1000)}
        response = await client.post(POLICY_URL, content=chunks(), headers=headers)
        assert_reason(response, 413, "100000", "4096")
        assert read <= 1  # httpx may have started the body; the app never asked for it
        assert broker.policies.get_policy(TOPIC, "compactionThreshold") is None
    run(tmp_path, body, http_max_request_body_bytes=4096)


def test_a_streamed_body_over_the_limit_answers_413_as_soon_as_it_goes_over(tmp_path: Path) -> None:
    async def body(broker: BrokerService, client: httpx.AsyncClient) -> None:
        publish(broker, TOPIC, ("k", b"v"))
        sent = 0

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
            nonlocal sent
            for _ in range(1000):
                sent += 1
                yield b"1" * 1000

        response = await client.post(POLICY_URL, content=chunks())
        assert_reason(response, 413, "4096")
        assert sent < 10
        small = await client.post(POLICY_URL, content=b"1000", headers={"Content-Type": "application/json"})
        assert small.status_code == 204, small.text  # a body within the limit still works
    run(tmp_path, body, http_max_request_body_bytes=4096)
