"""The transport-independent broker core: topics, subscriptions and dispatch, compaction.

Both doors (``api.wire`` and the REST API) translate between their protocol and this core.
"""

from api.broker.dispatch import Consumer, Delivery, Subscription, SubType
from api.broker.errors import (
    BrokerError,
    ConsumerBusyError,
    InvalidTopicNameError,
    NotAllowedError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from api.broker.service import BrokerService
from api.broker.topic import Topic
from api.broker.topic_name import TopicName

__all__ = [
    "BrokerError",
    "BrokerService",
    "Consumer",
    "ConsumerBusyError",
    "Delivery",
    "InvalidTopicNameError",
    "NotAllowedError",
    "SubType",
    "Subscription",
    "SubscriptionNotFoundError",
    "Topic",
    "TopicName",
    "TopicNotFoundError",
]
