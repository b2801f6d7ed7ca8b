"""Avro schema resolution (``api.broker.schema_compat``): the rules of the Avro
specification, each as a case, and the invariants as properties over generated records.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("fastavro")  # a dependency of compactd: AVRO and JSON schema checks

from api.broker.schema_compat import InvalidDefinitionError, can_read, parse_definition

PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]


def parse(definition: Any) -> Any:
    return parse_definition(json.dumps(definition).encode())


def record(*fields: dict[str, Any], name: str = "R") -> Any:
    return parse({"type": "record", "name": name, "namespace": "ns", "fields": list(fields)})


def field(name: str, kind: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, **extra}


@pytest.mark.parametrize(("writer", "reader", "readable"), [
    ("int", "long", True), ("int", "double", True), ("long", "float", True), ("float", "double", True),
    ("string", "bytes", True), ("bytes", "string", True),
    ("long", "int", False), ("double", "float", False), ("string", "int", False),
    (["null", "int"], ["null", "long"], True), (["null", "string"], "string", False),
    ("string", ["null", "string"], True), (["null", "long"], ["null", "int"], False),
    ({"type": "array", "items": "int"}, {"type": "array", "items": "long"}, True),
    ({"type": "map", "values": "long"}, {"type": "map", "values": "int"}, False),
    ({"type": "enum", "name": "E", "symbols": ["A"]}, {"type": "enum", "name": "E", "symbols": ["A", "B"]}, True),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, {"type": "enum", "name": "E", "symbols": ["A"]}, False),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]},
     {"type": "enum", "name": "E", "symbols": ["A"], "default": "A"}, True),
    ({"type": "fixed", "name": "F", "size": 4}, {"type": "fixed", "name": "F", "size": 8}, False),
    ({"type": "fixed", "name": "F", "size": 4}, {"type": "fixed", "name": "G", "size": 4}, False),
])
def test_types_resolve_by_the_avro_rules(writer: Any, reader: Any, readable: bool) -> None:
    assert can_read(parse(reader), parse(writer)) is readable


def test_a_reader_field_the_writer_lacks_needs_a_default() -> None:
    old = record(field("a", "string"))
    added = record(field("a", "string"), field("b", ["null", "int"]))
    added_with_default = record(field("a", "string"), field("b", ["null", "int"], default=None))
    assert not can_read(added, old)
    assert can_read(added_with_default, old)
    assert can_read(old, added)  # a writer field the reader lacks is skipped


def test_records_match_by_name_or_alias_and_fields_by_name_or_alias() -> None:
    assert not can_read(record(field("a", "int"), name="S"), record(field("a", "int")))
    aliased = parse({"type": "record", "name": "S", "aliases": ["R"], "fields": [
        {"name": "renamed", "aliases": ["a"], "type": "long"}]})
    assert can_read(aliased, record(field("a", "int")))


def test_recursive_and_referenced_named_types_resolve() -> None:
    linked = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}
    assert can_read(parse(linked), parse(linked))
    widened = json.loads(json.dumps(linked))
    widened["fields"][0]["type"] = "long"
    assert can_read(parse(widened), parse(linked))
    assert not can_read(parse(linked), parse(widened))


@pytest.mark.parametrize("data", [b"{not json", b"\xff",
                                  b'{"type": "record", "name": "R", "fields": [{"name": "a", "type": "x"}]}'])
def test_a_definition_that_is_not_an_avro_schema_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidDefinitionError):
        parse_definition(data)


# -- properties ----------------------------------------------------------------------------

NAMES = st.text("abcdefgh", min_size=1, max_size=4)
TYPES = st.recursive(
    st.sampled_from(PRIMITIVES),
    lambda inner: st.one_of(
        st.builds(lambda items: {"type": "array", "items": items}, inner),
        st.builds(lambda values: {"type": "map", "values": values}, inner),
        st.builds(lambda kind: ["null", kind], st.sampled_from(PRIMITIVES[1:])),
    ),
    max_leaves=4,
)
FIELDS = st.dictionaries(NAMES, TYPES, min_size=1, max_size=5)


def as_record(fields: dict[str, Any], defaults: frozenset[str] = frozenset()) -> Any:
    return record(*(field(name, kind, **({"default": None} if name in defaults and _nullable(kind) else {}))
                    for name, kind in fields.items()))


def _nullable(kind: Any) -> bool:
    return kind == "null" or (isinstance(kind, list) and kind[0] == "null")


@given(FIELDS)
def test_every_schema_reads_its_own_data(fields: dict[str, Any]) -> None:
    schema = as_record(fields)
    assert can_read(schema, schema)


@given(FIELDS, st.data())
def test_dropping_fields_keeps_a_reader_compatible_and_adding_them_does_not(
        fields: dict[str, Any], data: st.DataObject) -> None:
    kept = data.draw(st.sets(st.sampled_from(sorted(fields)), min_size=1))
    fewer = as_record({name: fields[name] for name in fields if name in kept})
    assert can_read(fewer, as_record(fields))  # the reader skips what it lacks
    if kept != set(fields):
        assert not can_read(as_record(fields), fewer)  # a new field with no default


@given(FIELDS)
def test_nullable_fields_added_with_a_null_default_keep_backward_compatibility(fields: dict[str, Any]) -> None:
    added = {f"new{name}": ["null", "string"] for name in fields}
    old = as_record(fields)
    new = as_record({**fields, **added}, defaults=frozenset(added))
    assert can_read(new, old) and can_read(old, new)
