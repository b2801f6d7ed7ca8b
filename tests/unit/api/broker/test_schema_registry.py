"""The schema registry (``api.broker.schemas``) on a real SQLite database: versions,
reuse, strategies by Pulsar's names, the consumer rule, deletion, partitions sharing
their base topic's entry, and versions surviving a reopen.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("fastavro")  # a dependency of compactd: AVRO and JSON schema checks

from api.broker.policies import PolicyStore
from api.broker.schemas import (
    STRATEGIES,
    STRATEGY_POLICY,
    IncompatibleSchemaError,
    InvalidSchemaError,
    SchemaData,
    SchemaNotFoundError,
    SchemaRegistry,
    schema_base,
    version_bytes,
)
from api.broker.topic_name import TopicName
from api.config import Settings
from ledger.database import Database

JSON, AVRO, STRING = 2, 4, 1
TOPIC = TopicName.parse("persistent://public/default/orders")
SIZE_MAX = Settings().schema_max_size_bytes


def definition(*fields: dict[str, Any]) -> bytes:
    return json.dumps({"type": "record", "name": "R", "fields": list(fields)}, indent=1).encode()


A = {"name": "a", "type": ["null", "string"]}
B = {"name": "b", "type": ["null", "int"]}
B_DEFAULT = {**B, "default": None}
V0 = SchemaData(JSON, definition(A))
ADDED = SchemaData(JSON, definition(A, B))  # new field, no default: not backward
ADDED_DEFAULT = SchemaData(JSON, definition(A, B_DEFAULT))  # compatible both ways


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    db = Database(str(tmp_path / "metadata.db"))
    yield db
    db.close()


@pytest.fixture
def registry(database: Database) -> SchemaRegistry:
    return SchemaRegistry(database, PolicyStore(database), max_size_bytes=SIZE_MAX)


def test_versions_start_at_zero_and_an_equal_schema_reuses_its_version(registry: SchemaRegistry) -> None:
    assert registry.put_if_absent(TOPIC, V0) == 0
    compact = SchemaData(JSON, json.dumps(json.loads(V0.data)).encode())  # whitespace aside
    assert registry.put_if_absent(TOPIC, compact) == 0
    assert registry.put_if_absent(TOPIC, ADDED_DEFAULT) == 1
    assert registry.put_if_absent(TOPIC, V0) == 0  # any live version matches, not only the latest
    assert [s.version for s in registry.versions(schema_base(TOPIC))] == [0, 1]
    assert registry.get(TOPIC).version == 1 and registry.get(TOPIC, 0).schema == V0
    assert version_bytes(1) == b"\0" * 7 + b"\1"


@pytest.mark.parametrize(("strategy", "accepted"), [
    ("FULL", {"default"}), ("BACKWARD", {"default"}), ("FORWARD", {"default", "added"}),
    ("ALWAYS_COMPATIBLE", {"default", "added", "string"}), ("NONE", {"default", "added", "string"}),
    ("ALWAYS_INCOMPATIBLE", set()),
])
def test_the_strategy_decides_what_a_new_version_may_be(registry: SchemaRegistry, strategy: str,
                                                        accepted: set[str]) -> None:
    candidates = {"default": ADDED_DEFAULT, "added": ADDED, "string": SchemaData(STRING, b"null")}
    for name, schema in candidates.items():
        registry.policies.set_policy(schema_base(TOPIC), STRATEGY_POLICY, strategy)
        registry.put_if_absent(TOPIC, V0)
        try:
            registry.put_if_absent(TOPIC, schema)
        except IncompatibleSchemaError:
            assert name not in accepted, name
        else:
            assert name in accepted, name
        registry.delete(TOPIC)


def test_transitive_strategies_check_every_live_version(registry: SchemaRegistry) -> None:
    x_string = {"name": "x", "type": "string"}
    x_int = {"name": "x", "type": "int", "default": 0}
    registry.policies.set_policy(TOPIC.namespace_name, STRATEGY_POLICY, "BACKWARD")
    registry.put_if_absent(TOPIC, SchemaData(JSON, definition(A, x_string)))
    registry.put_if_absent(TOPIC, SchemaData(JSON, definition(A)))
    third = SchemaData(JSON, definition(A, x_int))  # reads version 1, not version 0
    registry.policies.set_policy(schema_base(TOPIC), STRATEGY_POLICY, "BACKWARD_TRANSITIVE")
    with pytest.raises(IncompatibleSchemaError, match="version 0"):
        registry.put_if_absent(TOPIC, third)
    registry.policies.remove_policy(schema_base(TOPIC), STRATEGY_POLICY)  # the namespace's BACKWARD
    assert registry.put_if_absent(TOPIC, third) == 2


def test_a_different_type_is_refused_and_types_without_a_checker_get_new_versions(registry: SchemaRegistry) -> None:
    registry.put_if_absent(TOPIC, SchemaData(STRING, b"null"))
    assert registry.put_if_absent(TOPIC, SchemaData(STRING, b"")) == 1  # a Java STRING producer's data
    with pytest.raises(IncompatibleSchemaError, match="JSON schema is incompatible with version 1, a STRING"):
        registry.put_if_absent(TOPIC, V0)


def test_an_avro_definition_that_does_not_parse_is_refused(registry: SchemaRegistry) -> None:
    with pytest.raises(InvalidSchemaError, match="AVRO"):
        registry.put_if_absent(TOPIC, SchemaData(AVRO, b"{not json"))
    assert registry.versions(schema_base(TOPIC)) == []


def test_a_consumer_registers_on_an_idle_topic_and_must_read_the_latest_otherwise(registry: SchemaRegistry) -> None:
    with pytest.raises(IncompatibleSchemaError, match="does not have schema to check"):
        registry.check_consumer(TOPIC, V0, in_use=True)
    registry.check_consumer(TOPIC, V0, in_use=False)
    assert [s.version for s in registry.versions(schema_base(TOPIC))] == [0]
    registry.check_consumer(TOPIC, V0, in_use=True)
    registry.check_consumer(TOPIC, ADDED_DEFAULT, in_use=True)  # reads version 0
    with pytest.raises(IncompatibleSchemaError):
        registry.check_consumer(TOPIC, ADDED, in_use=True)  # needs b, which version 0 lacks
    with pytest.raises(IncompatibleSchemaError):
        registry.check_consumer(TOPIC, SchemaData(STRING, b"null"), in_use=True)
    assert [s.version for s in registry.versions(schema_base(TOPIC))] == [0]  # consumers added nothing


def test_a_deleted_schema_is_not_served_and_numbering_goes_on(registry: SchemaRegistry) -> None:
    with pytest.raises(SchemaNotFoundError):
        registry.delete(TOPIC)
    registry.put_if_absent(TOPIC, V0)
    assert registry.delete(TOPIC) == 0
    with pytest.raises(SchemaNotFoundError):
        registry.get(TOPIC, 0)
    assert registry.put_if_absent(TOPIC, SchemaData(STRING, b"null")) == 1  # checked against nothing


def test_versions_survive_reopening_the_database(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.db")
    first = Database(path)
    SchemaRegistry(first, PolicyStore(first), max_size_bytes=SIZE_MAX).put_if_absent(TOPIC, V0)
    first.close()
    again = Database(path)
    try:
        registry = SchemaRegistry(again, PolicyStore(again), max_size_bytes=SIZE_MAX)
        assert registry.get(TOPIC).schema == V0
        assert registry.put_if_absent(TOPIC, V0) == 0
    finally:
        again.close()


@given(st.from_regex(r"[a-z][a-z0-9]{0,8}(-[a-z]{1,4})?", fullmatch=True), st.integers(0, 10**6))
def test_every_partition_maps_to_its_base_topic(local: str, index: int) -> None:
    base = TopicName.parse(f"persistent://t/ns/{local}")
    assert schema_base(TopicName.parse(f"{base}-partition-{index}")) == str(base) == schema_base(base)
    assert schema_base(TopicName.parse(f"{base}-partition-0{index}")) == f"{base}-partition-0{index}"


def test_a_partition_shares_its_base_topics_versions(registry: SchemaRegistry) -> None:
    assert registry.put_if_absent(TopicName.parse("orders-partition-2"), V0) == 0
    assert registry.get(TOPIC).schema == V0
    with pytest.raises(IncompatibleSchemaError):
        registry.put_if_absent(TopicName.parse("orders-partition-0"), SchemaData(STRING, b"null"))


def test_every_strategy_name_is_pulsars() -> None:
    assert set(STRATEGIES) == {"ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL",
                               "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE", "NONE"}
