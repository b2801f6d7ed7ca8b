"""Errors of the broker core, each with the Pulsar ``ServerError`` code the wire answers::

    CompactionServiceError (ledger.errors)
    └── BrokerError                     a request the broker refuses; ``code`` is the ServerError
        ├── InvalidTopicNameError       a malformed topic name (InvalidTopicName)
        ├── NotAllowedError             an operation Pulsar refuses (NotAllowedError)
        ├── ConsumerBusyError           exclusive subscription already has a consumer (ConsumerBusy)
        ├── SubscriptionNotFoundError   (SubscriptionNotFound)
        └── TopicNotFoundError          (TopicNotFound)

The REST layer maps the same classes to HTTP codes in one place.
"""

from __future__ import annotations

from ledger.errors import CompactionServiceError

__all__ = [
    "BrokerError",
    "ConsumerBusyError",
    "InvalidTopicNameError",
    "NotAllowedError",
    "SubscriptionNotFoundError",
    "TopicNotFoundError",
]


class BrokerError(CompactionServiceError):
    """A refused request; ``code`` names the Pulsar ``ServerError`` to answer with."""

    code = "UnknownError"


class InvalidTopicNameError(BrokerError, ValueError):
    code = "InvalidTopicName"


class NotAllowedError(BrokerError):
    code = "NotAllowedError"


class ConsumerBusyError(BrokerError):
    code = "ConsumerBusy"


class SubscriptionNotFoundError(BrokerError):
    code = "SubscriptionNotFound"


class TopicNotFoundError(BrokerError):
    code = "TopicNotFound"
