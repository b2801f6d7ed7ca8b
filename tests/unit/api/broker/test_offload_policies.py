"""A topic's offload policies as the broker applies them (``api.broker.offloads``): per field,
topic > namespace > broker setting (Pulsar's ``OffloadPoliciesImpl.mergeConfiguration``),
over the real policy table; a partition without its own value has its parent's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.broker.offloads import TopicOffloads
from api.broker.policies import PolicyStore
from api.broker.topic_name import TopicName
from api.config import Settings
from ledger import DataDir

TOPIC = TopicName.parse("persistent://public/default/t")
NAMESPACE = "public/default"


@pytest.fixture
def policies(tmp_path: Path) -> Iterator[PolicyStore]:
    data_dir = DataDir.open(str(tmp_path / "data"))
    try:
        yield PolicyStore(data_dir.database)
    finally:
        data_dir.close()


def test_broker_defaults_are_pulsars(policies: PolicyStore) -> None:
    offloads = TopicOffloads(None, policies, Settings())
    assert offloads.threshold_bytes(TOPIC) == -1  # automatic offload off
    assert offloads.deletion_lag_ms(TOPIC) == 14_400_000  # 4 h
    assert not offloads.enabled


values = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))


# every example sets (or removes) every value it reads: the shared table is safe to reuse
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topic=values, namespace=values, broker=st.integers(-10, 10**12), other=values)
def test_each_field_takes_the_topic_then_the_namespace_then_the_broker_value(
        policies: PolicyStore, topic: int | None, namespace: int | None, broker: int, other: int | None) -> None:
    """``other`` is the other field's topic value: a field never takes another's."""
    offloads = TopicOffloads(None, policies, Settings(managed_ledger_offload_threshold_in_bytes=broker,
                                                      managed_ledger_offload_deletion_lag_ms=broker))
    for scope, value in ((str(TOPIC), topic), (NAMESPACE, namespace)):
        if value is None:
            policies.remove_policy(scope, "offloadThreshold")
        else:
            policies.set_policy(scope, "offloadThreshold", value)
    if other is None:
        policies.remove_policy(str(TOPIC), "offloadDeletionLagMs")
    else:
        policies.set_policy(str(TOPIC), "offloadDeletionLagMs", other)
    policies.remove_policy(NAMESPACE, "offloadDeletionLagMs")

    expected = topic if topic is not None else namespace if namespace is not None else broker
    assert offloads.threshold_bytes(TOPIC) == expected
    assert offloads.deletion_lag_ms(TOPIC) == (other if other is not None else broker)


def test_a_partition_takes_its_parents_topic_policy(policies: PolicyStore) -> None:
    offloads = TopicOffloads(None, policies, Settings())
    policies.set_policy(NAMESPACE, "offloadThreshold", 100)
    policies.set_policy(str(TOPIC), "offloadThreshold", 0)
    assert offloads.threshold_bytes(TopicName.parse(f"{TOPIC}-partition-2")) == 0


def test_without_a_driver_the_broker_hooks_do_nothing(policies: PolicyStore) -> None:
    offloads = TopicOffloads(None, policies, Settings())
    calls: list[tuple[int, int]] = []
    hook = offloads.on_sealed_hook(TOPIC, lambda: None, lambda ledger_id, entries: calls.append((ledger_id, entries)))
    assert hook is not None
    hook(3, 4)  # the key index hook alone, unchanged
    assert calls == [(3, 4)]
    offloads.trim_pass([])
    offloads.shutdown()
