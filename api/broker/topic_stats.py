"""Message counters and rates of topics, subscriptions, producers and consumers.

A ``RateCounter`` counts messages and bytes since it was made (Pulsar's ``msgInCounter``,
``bytesInCounter``, ``msgOutCounter``, ``bytesOutCounter``: since the topic was loaded, as
in Pulsar) and derives their rates (``msgRateIn``, ``msgThroughputIn``, …) from what was
recorded over the last ``RATE_WINDOW_S`` seconds, in one-second buckets; a counter younger
than the window divides by its age (at least one second). It is used on the event loop
(messages out are counted as they are handed to consumers); ``ThreadSafeRateCounter``
takes a lock for a topic's messages in, counted as their appends become durable (on the
ledger's flusher thread).

``TopicCounters`` is what a ``Topic`` keeps: messages in, messages out, and messages out
per subscription (a subscription's counters outlive its consumers, as Pulsar's do).
Producers and consumers keep their own ``RateCounter`` and say what they are with
``describe()`` (the wire layer's ``WireProducer`` and ``WireConsumer``).

Messages, not entries: a batch of n messages counts n (the SEND's ``num_messages``, the
delivery's slot count).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["RATE_WINDOW_S", "RateCounter", "ThreadSafeRateCounter", "TopicCounters", "connected_since"]

# Rates are averaged over this many seconds (Pulsar averages over its stats period).
RATE_WINDOW_S = 10


class RateCounter:
    """Messages and bytes counted, and their rates over the last ``RATE_WINDOW_S``; for
    one thread (the event loop)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self.messages = 0
        self.bytes = 0
        self._buckets: deque[list[int]] = deque()  # [second, messages, bytes], oldest first

    def record(self, messages: int, size: int) -> None:
        """Count ``messages`` messages of ``size`` bytes in all, now."""
        second = int(self._clock())
        self.messages += messages
        self.bytes += size
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            bucket = buckets[-1]
            bucket[1] += messages
            bucket[2] += size
        else:
            buckets.append([second, messages, size])
            while buckets[0][0] <= second - RATE_WINDOW_S:
                buckets.popleft()

    def rates(self) -> tuple[float, float]:
        """Messages per second and bytes per second over the last ``RATE_WINDOW_S``."""
        now = self._clock()
        recent = self._recent(int(now) - RATE_WINDOW_S + 1)  # from the window's oldest bucket
        span = min(float(RATE_WINDOW_S), max(1.0, now - self._started))
        return sum(b[1] for b in recent) / span, sum(b[2] for b in recent) / span

    def _recent(self, first: int) -> list[list[int]]:
        return [list(bucket) for bucket in self._buckets if bucket[0] >= first]

    def average_size(self) -> float:
        """Bytes a message, over every message counted (0.0 before any)."""
        return self.bytes / self.messages if self.messages else 0.0


class ThreadSafeRateCounter(RateCounter):
    """A ``RateCounter`` recorded from one thread and read from another."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._lock = threading.Lock()

    def record(self, messages: int, size: int) -> None:
        with self._lock:
            super().record(messages, size)

    def _recent(self, first: int) -> list[list[int]]:
        with self._lock:
            return super()._recent(first)


class TopicCounters:
    """A loaded topic's messages in and out, and out per subscription."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.message_in = ThreadSafeRateCounter(clock)  # counted on the ledger's flusher thread
        self.message_out = RateCounter(clock)
        self._subscriptions: dict[str, RateCounter] = {}

    def record_in(self, messages: int, size: int) -> None:
        self.message_in.record(messages, size)

    def record_out(self, subscription: str, messages: int, size: int) -> None:
        """``messages`` of ``size`` bytes handed to a consumer of ``subscription``."""
        self.message_out.record(messages, size)
        self.subscription(subscription).record(messages, size)

    def subscription(self, name: str) -> RateCounter:
        """The out counter of subscription ``name`` (made on first use)."""
        counter = self._subscriptions.get(name)
        if counter is None:
            counter = self._subscriptions[name] = RateCounter(self._clock)
        return counter

    def forget(self, subscription: str) -> None:
        """A deleted subscription's counters go with it."""
        self._subscriptions.pop(subscription, None)

    def in_fields(self) -> dict[str, Any]:
        """Pulsar's topic-level in figures."""
        rate, throughput = self.message_in.rates()
        return {"msgRateIn": rate, "msgThroughputIn": throughput, "msgInCounter": self.message_in.messages,
                "bytesInCounter": self.message_in.bytes, "averageMsgSize": self.message_in.average_size()}

    @staticmethod
    def out_fields(counter: RateCounter) -> dict[str, Any]:
        """Pulsar's out figures of a topic, subscription or consumer."""
        rate, throughput = counter.rates()
        return {"msgRateOut": rate, "msgThroughputOut": throughput, "msgOutCounter": counter.messages,
                "bytesOutCounter": counter.bytes}


def connected_since(since: float) -> str:
    """``since`` (``time.time()``) as Pulsar's ``connectedSince`` writes it (ISO 8601, UTC,
    with milliseconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since)) + f".{int(since * 1000) % 1000:03d}Z"
