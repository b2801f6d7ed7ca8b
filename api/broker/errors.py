"""Errors of the broker core, each with the Pulsar ``ServerError`` code the wire answers::

    CompactionServiceError (ledger.errors)
    └── BrokerError                     a request the broker refuses; ``code`` is the ServerError
        ├── InvalidTopicNameError       a malformed topic name (InvalidTopicName)
        ├── NotAllowedError             an operation Pulsar refuses (NotAllowedError)
        ├── ConsumerBusyError           exclusive subscription already has a consumer (ConsumerBusy)
        ├── ProducerBusyError           a producer of that name is already connected (ProducerBusy)
        ├── SubscriptionNotFoundError   (SubscriptionNotFound)
        ├── TopicNotFoundError          (TopicNotFound)
        ├── TopicExistsError            an admin create of an existing topic (HTTP 409)
        ├── StorageUnavailableError     the topic cannot store appends now: a full disk (PersistenceError)
        └── PreconditionFailedError     e.g. deleting a topic with clients attached (HTTP 412)

The REST layer maps the same classes to HTTP codes in one place.
"""

from __future__ import annotations

from ledger.errors import CompactionServiceError

__all__ = [
    "BrokerError",
    "ConsumerBusyError",
    "InvalidTopicNameError",
    "NotAllowedError",
    "PreconditionFailedError",
    "ProducerBusyError",
    "StorageUnavailableError",
    "SubscriptionNotFoundError",
    "TopicExistsError",
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


class ProducerBusyError(BrokerError):
    code = "ProducerBusy"


class SubscriptionNotFoundError(BrokerError):
    code = "SubscriptionNotFound"


class TopicNotFoundError(BrokerError):
    code = "TopicNotFound"


class TopicExistsError(BrokerError):
    code = "NotAllowedError"


class PreconditionFailedError(BrokerError):
    code = "NotAllowedError"


class StorageUnavailableError(BrokerError):
    """The topic's roll-over failed (a full disk): its appends would fail. Retriable; a
    client reconnecting a producer retries it with its growing back-off."""

    code = "PersistenceError"
    retriable = True
