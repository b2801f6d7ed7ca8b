"""Small helpers shared by the real-client integration tests."""

from __future__ import annotations

import uuid
from typing import Any

import pulsar

RECEIVE_MS = 5_000  # how long a message that should come is waited for
SILENCE_MS = 300  # how long "nothing more comes" is checked for


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
