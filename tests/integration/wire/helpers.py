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
