"""Pulsar's topic, subscription and broker metric families, for ``GET /metrics``.

``TopicCollector`` reads the broker's loaded topics at each scrape (on the broker's loop,
like ``api.metrics.CompactionCollector``), from the same figures topic stats answer
(``api.broker.admin_topics``, ``api.broker.topic_stats``), so the two never disagree.

Per topic (labels ``cluster``, ``namespace``, ``topic``), Pulsar's names:

* gauges ``pulsar_subscriptions_count``, ``pulsar_producers_count``,
  ``pulsar_consumers_count``, ``pulsar_rate_in``, ``pulsar_rate_out`` (messages/s),
  ``pulsar_throughput_in``, ``pulsar_throughput_out`` (bytes/s), ``pulsar_storage_size``
  (bytes), ``pulsar_msg_backlog`` (entries, all subscriptions), ``pulsar_storage_backlog_size``;
* counters ``pulsar_in_messages_total``, ``pulsar_in_bytes_total``,
  ``pulsar_out_messages_total``, ``pulsar_out_bytes_total`` (since the topic was loaded).

Per subscription (labels plus ``subscription``): ``pulsar_subscription_back_log``,
``pulsar_subscription_msg_rate_out``, ``pulsar_subscription_msg_throughput_out``,
``pulsar_subscription_consumers_count``.

Broker-wide (label ``cluster``): ``pulsar_broker_topics_count``,
``pulsar_broker_subscriptions_count``, ``pulsar_broker_producers_count``,
``pulsar_broker_consumers_count``, ``pulsar_broker_rate_in``, ``pulsar_broker_rate_out``,
``pulsar_broker_throughput_in``, ``pulsar_broker_throughput_out``,
``pulsar_broker_storage_size``, ``pulsar_broker_msg_backlog``, and
``pulsar_active_connections`` (open Pulsar connections).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.broker.admin_topics import TopicOperations

if TYPE_CHECKING:
    from api.broker.service import BrokerService

__all__ = ["TopicCollector"]

TOPIC_LABELS = ("cluster", "namespace", "topic")
SUBSCRIPTION_LABELS = (*TOPIC_LABELS, "subscription")

_TOPIC_GAUGES = {
    "pulsar_subscriptions_count": ("Subscriptions of the topic.", "subscriptionCount"),
    "pulsar_producers_count": ("Producers connected to the topic.", "producers"),
    "pulsar_consumers_count": ("Consumers connected to the topic.", "consumers"),
    "pulsar_rate_in": ("Messages a second published to the topic.", "msgRateIn"),
    "pulsar_rate_out": ("Messages a second dispatched from the topic.", "msgRateOut"),
    "pulsar_throughput_in": ("Bytes a second published to the topic.", "msgThroughputIn"),
    "pulsar_throughput_out": ("Bytes a second dispatched from the topic.", "msgThroughputOut"),
    "pulsar_storage_size": ("Bytes the topic stores.", "storageSize"),
    "pulsar_msg_backlog": ("Entries not acknowledged, over all subscriptions.", "backlog"),
    "pulsar_storage_backlog_size": ("Bytes of the largest subscription backlog.", "backlogSize"),
}
_TOPIC_COUNTERS = {
    "pulsar_in_messages": ("Messages published since the topic was loaded.", "msgInCounter"),
    "pulsar_in_bytes": ("Bytes published since the topic was loaded.", "bytesInCounter"),
    "pulsar_out_messages": ("Messages dispatched since the topic was loaded.", "msgOutCounter"),
    "pulsar_out_bytes": ("Bytes dispatched since the topic was loaded.", "bytesOutCounter"),
}
_SUBSCRIPTION_GAUGES = {
    "pulsar_subscription_back_log": ("Entries the subscription has not acknowledged.", "msgBacklog"),
    "pulsar_subscription_msg_rate_out": ("Messages a second dispatched to the subscription.", "msgRateOut"),
    "pulsar_subscription_msg_throughput_out": ("Bytes a second dispatched to the subscription.",
                                               "msgThroughputOut"),
    "pulsar_subscription_consumers_count": ("Consumers of the subscription.", "consumers"),
}
_BROKER_GAUGES = {
    "pulsar_broker_topics_count": ("Topics loaded on the broker.", "topics"),
    "pulsar_broker_subscriptions_count": ("Subscriptions of the loaded topics.", "subscriptionCount"),
    "pulsar_broker_producers_count": ("Producers connected.", "producers"),
    "pulsar_broker_consumers_count": ("Consumers connected.", "consumers"),
    "pulsar_broker_rate_in": ("Messages a second published to the broker.", "msgRateIn"),
    "pulsar_broker_rate_out": ("Messages a second dispatched by the broker.", "msgRateOut"),
    "pulsar_broker_throughput_in": ("Bytes a second published to the broker.", "msgThroughputIn"),
    "pulsar_broker_throughput_out": ("Bytes a second dispatched by the broker.", "msgThroughputOut"),
    "pulsar_broker_storage_size": ("Bytes the loaded topics store.", "storageSize"),
    "pulsar_broker_msg_backlog": ("Entries not acknowledged, over all loaded topics.", "backlog"),
}


class TopicCollector(Collector):
    """Reads the broker's loaded topics at each collection (see the module docstring)."""

    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        cluster = self.broker.settings.cluster_name
        topic_gauges = {name: GaugeMetricFamily(name, text, labels=TOPIC_LABELS)
                        for name, (text, _) in _TOPIC_GAUGES.items()}
        topic_counters = {name: CounterMetricFamily(name, text, labels=TOPIC_LABELS)
                          for name, (text, _) in _TOPIC_COUNTERS.items()}
        subscription_gauges = {name: GaugeMetricFamily(name, text, labels=SUBSCRIPTION_LABELS)
                               for name, (text, _) in _SUBSCRIPTION_GAUGES.items()}
        totals: dict[str, float] = dict.fromkeys((field for _, field in _BROKER_GAUGES.values()), 0.0)
        operations = TopicOperations(self.broker.admin)
        for topic in self.broker.registry.loaded_topics():
            stats = _figures(operations.stats(str(topic.name)))
            labels = [cluster, topic.name.namespace_name, str(topic.name)]
            for name, (_, field) in _TOPIC_GAUGES.items():
                topic_gauges[name].add_metric(labels, float(stats[field]))
            for name, (_, field) in _TOPIC_COUNTERS.items():
                topic_counters[name].add_metric(labels, float(stats[field]))
            for subscription, sub_stats in stats["subscriptions"].items():
                figures = {**sub_stats, "consumers": len(sub_stats["consumers"])}
                for name, (_, field) in _SUBSCRIPTION_GAUGES.items():
                    subscription_gauges[name].add_metric([*labels, subscription], float(figures[field]))
            totals["topics"] += 1
            for field in totals.keys() - {"topics"}:
                totals[field] += float(stats[field])
        yield from topic_gauges.values()
        yield from topic_counters.values()
        yield from subscription_gauges.values()
        for name, (text, field) in _BROKER_GAUGES.items():
            family = GaugeMetricFamily(name, text, labels=("cluster",))
            family.add_metric([cluster], totals[field])
            yield family
        connections = getattr(self.broker, "connections", ())
        active = GaugeMetricFamily("pulsar_active_connections", "Open Pulsar protocol connections.",
                                   labels=("cluster",))
        active.add_metric([cluster], float(len(connections)))
        yield active


def _figures(stats: dict[str, Any]) -> dict[str, Any]:
    """Topic stats plus the counts the families need."""
    subscriptions = stats["subscriptions"].values()
    return {
        **stats,
        "subscriptionCount": len(stats["subscriptions"]),
        "producers": len(stats["publishers"]),
        "consumers": sum(len(s["consumers"]) for s in subscriptions),
        "backlog": sum(s["msgBacklog"] for s in subscriptions),
    }
