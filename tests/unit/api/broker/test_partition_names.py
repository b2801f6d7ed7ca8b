"""Partition names: ``<parent>-partition-<i>``, parsed as strictly as Pulsar parses them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.broker.partitions import parent_of, partition_index, partition_name, policy_scopes
from api.broker.topic_name import TopicName

local_names = st.from_regex(r"[A-Za-z0-9_.=:\-]{1,20}", fullmatch=True)


@given(local_names, st.integers(min_value=0, max_value=10**6))
def test_a_partition_name_parses_back_to_its_parent_and_index(local: str, index: int) -> None:
    parent = TopicName("public", "default", local)

    partition = TopicName.parse(str(partition_name(parent, index)))

    assert partition_index(partition) == index
    assert parent_of(partition) == parent
    assert policy_scopes(str(partition)) == (str(partition), str(parent))


@pytest.mark.parametrize("local", [
    "t", "t-partition-", "t-partition-01", "t-partition--1", "t-partition-1a", "t-partition-x",
    "-partition-3", "t-partition-1-suffix",
])
def test_names_that_are_not_partitions(local: str) -> None:
    name = TopicName("public", "default", local)

    assert partition_index(name) is None
    assert parent_of(name) is None
    assert policy_scopes(str(name)) == (str(name),)
