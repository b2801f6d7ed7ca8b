"""Small helpers shared by the real-client integration tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pulsar

from ledger.position import Position

RECEIVE_MS = 5_000  # how long a message that should come is waited for
SILENCE_MS = 300  # how long "nothing more comes" is checked for
POLL_S = 0.02  # how often a poll of the broker's state looks again

T = TypeVar("T")


def unique_topic(prefix: str) -> str:
    """A fresh topic name, so tests sharing a broker never see each other's messages."""
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


def drain(consumer: Any, silence_ms: int = SILENCE_MS) -> list[Any]:
    """Every message that arrives until ``silence_ms`` pass without one."""
    out = []
    while True:
        try:
            out.append(consumer.receive(silence_ms))
        except pulsar.Timeout:
            return out


def read_available(reader: Any, limit: int = 200) -> list[Any]:
    """What a reader gets while ``has_message_available`` says so; a stuck reader fails
    (``read_next`` times out) instead of hanging, and so does one that never ends."""
    messages: list[Any] = []
    for _ in range(limit):
        if not reader.has_message_available():
            return messages
        messages.append(reader.read_next(RECEIVE_MS))
    raise AssertionError(f"has_message_available still true after {limit} messages")


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = RECEIVE_MS / 1000) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail naming
    ``what`` once ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not reached within {timeout_s} s"
        time.sleep(POLL_S)
    return value


def wait_for_mark_delete(broker: Any, topic: str, subscription: str, message_id: Any) -> None:
    """Until the broker's cursor of ``subscription`` has its mark-delete position at or past
    ``message_id``'s entry (the client groups acknowledgements for 100 ms before sending)."""
    wanted = Position(message_id.ledger_id(), message_id.entry_id())

    def applied() -> bool:
        loaded = broker.service.registry.loaded.get(topic)
        sub = loaded.subscriptions.get(subscription) if loaded is not None else None
        return sub is not None and sub.cursor.mark_delete_position >= wanted

    wait_until(applied, f"the broker applying the acknowledgement of {wanted} on {subscription}")
