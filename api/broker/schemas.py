"""The schema registry: one list of schema versions per base topic, persisted.

``SchemaRegistry`` owns the ``schemas`` component of ``ledger.database.Database``. The
registry key is the *base* topic (``schema_base``): the partitions ``t-partition-N`` of a
partitioned topic share the entry of ``t``, as Pulsar's ``TopicName.getSchemaName`` does.
Rows belong to the base topic (a ``TopicTable``), so deleting that topic removes them.

Versions are int64 from 0, each stored with its type (the wire's ``Schema.Type`` number),
data, properties, timestamp and a ``deleted`` flag; on the wire a version is 8 bytes
big-endian (``version_bytes``). Rules, as Pulsar's registry keeps them:

* **Producers** (``put_if_absent``): a schema equal to a live version (same type; for AVRO
  and JSON the same parsed definition, whitespace aside) gets that version back; else the
  strategy decides and a new version ``last + 1`` is written, or ``IncompatibleSchemaError``.
* **Strategy** (``strategy_of``): Pulsar's names, from the topic policy
  ``schemaCompatibilityStrategy`` (set on the base topic), else the namespace's, else the
  broker's ``schema_compatibility_strategy`` (FULL). ALWAYS_COMPATIBLE and NONE accept
  anything, a new type included; ALWAYS_INCOMPATIBLE refuses every new version; otherwise a
  different type is refused, types without a checker (STRING, primitives, PROTOBUF, ...)
  pass, and AVRO/JSON go through ``api.broker.schema_compat``: BACKWARD (the new schema
  reads the old data), FORWARD (the old reads the new), FULL (both), against the latest
  version, or every live one for the ``_TRANSITIVE`` forms.
* **Consumers** (``check_consumer``): a topic without schema registers the consumer's when
  it is idle (no data, no producer, no consumer) and refuses it otherwise ("Topic does not
  have schema to check"); with a schema, the consumer's must equal a live version or read
  the latest (every live one under BACKWARD_TRANSITIVE and FULL_TRANSITIVE).
* **Delete** (``delete``) marks every version deleted; the next schema starts a new line
  of versions after the last number, checked against nothing.
* **Limits**, the same through both doors (a producer, a consumer, GET_OR_CREATE_SCHEMA,
  the REST upload): a definition over ``max_size_bytes`` (``--schema-max-size-bytes``,
  Pulsar's default maxMessageSize, the most its binary port carries) is refused, whatever
  its type; an AVRO or JSON definition must be UTF-8 text, nested at most
  ``SCHEMA_DEPTH_MAX`` deep, and a valid Avro schema (``api.broker.schema_compat``).
  Every refusal is ``InvalidSchemaError`` (the wire's IncompatibleSchema, REST 400).

Writes are the named transactions ``schemas.put`` and ``schemas.delete``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from api.broker.errors import BrokerError, TopicNotFoundError
from api.broker.policies import PolicyStore
from api.broker.schema_compat import (
    InvalidDefinitionError,
    can_read,
    load_definition,
    parse_definition,
)
from api.broker.topic_name import TopicName
from api.schema_names import STRATEGIES
from ledger.database import Database, TopicTable, load_migrations

__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "STRATEGIES",
    "STRATEGY_POLICY",
    "TYPE_NAMES",
    "IncompatibleSchemaError",
    "InvalidSchemaError",
    "SchemaData",
    "SchemaNotFoundError",
    "SchemaRegistry",
    "StoredSchema",
    "schema_base",
    "version_bytes",
]

COMPONENT = "schemas"
MIGRATIONS = load_migrations("api.broker", COMPONENT)

STRATEGY_POLICY = "schemaCompatibilityStrategy"

TYPE_NAMES = {
    0: "NONE", 1: "STRING", 2: "JSON", 3: "PROTOBUF", 4: "AVRO", 5: "BOOLEAN", 6: "INT8",
    7: "INT16", 8: "INT32", 9: "INT64", 10: "FLOAT", 11: "DOUBLE", 12: "DATE", 13: "TIME",
    14: "TIMESTAMP", 15: "KEY_VALUE", 16: "INSTANT", 17: "LOCAL_DATE", 18: "LOCAL_TIME",
    19: "LOCAL_DATE_TIME", 20: "PROTOBUF_NATIVE",
}
"""Pulsar's ``SchemaType`` names by the wire's ``Schema.Type`` number."""

_AVRO_TYPES = frozenset({2, 4})  # JSON and AVRO carry an Avro record definition
_PARTITION = re.compile(r"(.+)-partition-(0|[1-9][0-9]*)")


class IncompatibleSchemaError(BrokerError):
    """A schema the topic's strategy refuses (the client's ``IncompatibleSchema``)."""

    code = "IncompatibleSchema"


class InvalidSchemaError(IncompatibleSchemaError):
    """A schema whose definition does not parse (AVRO/JSON that is not an Avro schema)."""


class SchemaNotFoundError(TopicNotFoundError):
    """No such (live) schema version; the wire's TopicNotFound, REST 404."""


@dataclass(frozen=True, slots=True)
class SchemaData:
    """A schema as a client sends it: wire type number, definition bytes, properties."""

    type: int
    data: bytes
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, str(self.type))

    def canonical(self) -> Any:
        """What equality of two schemas of one type compares: the parsed JSON for AVRO and
        JSON (whitespace is irrelevant), the bytes otherwise."""
        if self.type in _AVRO_TYPES:
            try:
                return load_definition(self.data)  # bounded: never a RecursionError
            except InvalidDefinitionError:
                return self.data
        return self.data


@dataclass(frozen=True, slots=True)
class StoredSchema:
    """One registered version."""

    version: int
    schema: SchemaData
    timestamp_ms: int


def schema_base(name: TopicName) -> str:
    """The registry key of topic ``name``: its full name without a ``-partition-N``
    suffix (N a decimal without leading zeros)."""
    match = _PARTITION.fullmatch(name.local_name)
    local = match.group(1) if match else name.local_name
    return f"persistent://{name.tenant}/{name.namespace}/{local}"


def version_bytes(version: int) -> bytes:
    """A version as the wire carries it: 8 bytes, big-endian."""
    return version.to_bytes(8, "big", signed=True)


class SchemaRegistry:
    """The schemas kept in ``database`` (see the module docstring)."""

    def __init__(self, database: Database, policies: PolicyStore, default_strategy: str = "FULL", *,
                 max_size_bytes: int) -> None:
        self.database = database
        self.policies = policies
        self.default_strategy = default_strategy
        self.max_size_bytes = max_size_bytes
        database.register(COMPONENT, MIGRATIONS, topic_tables=(TopicTable("schemas", "topic"),))

    # -- reading ------------------------------------------------------------------------

    def versions(self, base: str) -> list[StoredSchema]:
        """The live versions of registry entry ``base``, oldest first."""
        rows = self.database.query(
            "SELECT version, type, data, properties, timestamp_ms FROM schemas "
            "WHERE topic = ? AND deleted = 0 ORDER BY version", (base,))
        return [StoredSchema(version, SchemaData(kind, bytes(data), json.loads(properties)), stamp)
                for version, kind, data, properties, stamp in rows]

    def get(self, name: TopicName, version: int | None = None) -> StoredSchema:
        """Version ``version`` of ``name``'s schema, or its latest when None;
        ``SchemaNotFoundError`` when there is no such live version."""
        live = self.versions(schema_base(name))
        found = live[-1:] if version is None else [each for each in live if each.version == version]
        if not found:
            which = "any schema" if version is None else f"schema version {version}"
            raise SchemaNotFoundError(f"Topic {schema_base(name)} has no {which}")
        return found[0]

    def registered(self, name: TopicName, schema: SchemaData) -> int | None:
        """The live version of ``name``'s schema equal to ``schema``, or None (a read only;
        None for one over the size limit, which ``put_if_absent`` refuses)."""
        if len(schema.data) > self.max_size_bytes:
            return None
        return _matching(self.versions(schema_base(name)), schema)

    def strategy_of(self, name: TopicName) -> str:
        """The compatibility strategy of ``name``: topic policy (on the base topic), else
        namespace policy, else the broker's default."""
        for scope in (schema_base(name), name.namespace_name):
            value = self.policies.get_policy(scope, STRATEGY_POLICY)
            if value is not None:
                return str(value)
        return self.default_strategy

    # -- writing ------------------------------------------------------------------------

    def put_if_absent(self, name: TopicName, schema: SchemaData) -> int:
        """The version of ``schema`` on ``name``, registered when new and allowed
        (``IncompatibleSchemaError``, ``InvalidSchemaError``)."""
        self._check_size(schema)
        live = self.versions(schema_base(name))
        existing = _matching(live, schema)
        if existing is not None:
            return existing
        parsed = _parsed(schema)
        strategy = self.strategy_of(name)
        if live and strategy not in ("ALWAYS_COMPATIBLE", "NONE"):
            _check_producer(strategy, live, schema, parsed)
        return self._add(schema_base(name), schema)

    def check_consumer(self, name: TopicName, schema: SchemaData, *, in_use: bool) -> None:
        """Admit a consumer with ``schema`` on ``name`` (see the module docstring); ``in_use``:
        the topic has data, a producer or a consumer."""
        self._check_size(schema)
        live = self.versions(schema_base(name))
        if not live:
            if in_use:
                raise IncompatibleSchemaError(f"Topic {name} does not have schema to check")
            _parsed(schema)
            self._add(schema_base(name), schema)
            return
        if _matching(live, schema) is not None:
            return
        parsed = _parsed(schema)
        strategy = self.strategy_of(name)
        if strategy in ("ALWAYS_COMPATIBLE", "NONE"):
            return
        if strategy == "ALWAYS_INCOMPATIBLE":
            raise IncompatibleSchemaError(f"the schema of topic {name} is ALWAYS_INCOMPATIBLE with a new one")
        targets = live if strategy in ("BACKWARD_TRANSITIVE", "FULL_TRANSITIVE") else live[-1:]
        for target in targets:
            _check_pair(target, schema, parsed, reads_old=True, reads_new=False)

    def delete(self, name: TopicName) -> int:
        """Mark every version of ``name``'s schema deleted; the latest version number, or
        ``SchemaNotFoundError`` when it has none."""
        base = schema_base(name)
        with self.database.transaction("schemas.delete", topic=base) as db:
            count = db.execute("UPDATE schemas SET deleted = 1 WHERE topic = ? AND deleted = 0", (base,)).rowcount
            last = db.execute("SELECT MAX(version) FROM schemas WHERE topic = ?", (base,)).fetchone()[0]
        if not count:
            raise SchemaNotFoundError(f"Topic {base} has no schema to delete")
        return int(last)

    def _check_size(self, schema: SchemaData) -> None:
        if len(schema.data) > self.max_size_bytes:
            raise InvalidSchemaError(
                f"the {schema.type_name} schema definition of {len(schema.data)} bytes exceeds the limit of "
                f"{self.max_size_bytes} bytes (--schema-max-size-bytes)")

    def _add(self, base: str, schema: SchemaData) -> int:
        with self.database.transaction("schemas.put", topic=base) as db:
            last = db.execute("SELECT MAX(version) FROM schemas WHERE topic = ?", (base,)).fetchone()[0]
            version = 0 if last is None else int(last) + 1
            db.execute(
                "INSERT INTO schemas (topic, version, type, data, properties, timestamp_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (base, version, schema.type, schema.data, json.dumps(schema.properties), int(time.time() * 1000)))
        return version


def _matching(live: list[StoredSchema], schema: SchemaData) -> int | None:
    canonical = schema.canonical()
    for stored in live:
        if stored.schema.type == schema.type and stored.schema.canonical() == canonical:
            return stored.version
    return None


def _parsed(schema: SchemaData) -> Any:
    """The parsed Avro definition of an AVRO or JSON schema (None for other types)."""
    if schema.type not in _AVRO_TYPES:
        return None
    try:
        return parse_definition(schema.data)
    except InvalidDefinitionError as error:
        raise InvalidSchemaError(f"Invalid {schema.type_name} schema: {error}") from None


def _check_producer(strategy: str, live: list[StoredSchema], schema: SchemaData, parsed: Any) -> None:
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchemaError("the topic's schema strategy is ALWAYS_INCOMPATIBLE: no new version")
    targets = live if strategy.endswith("_TRANSITIVE") else live[-1:]
    reads_old = strategy.startswith(("BACKWARD", "FULL"))
    reads_new = strategy.startswith(("FORWARD", "FULL"))
    for target in targets:
        _check_pair(target, schema, parsed, reads_old=reads_old, reads_new=reads_new)


def _check_pair(old: StoredSchema, schema: SchemaData, parsed: Any, *, reads_old: bool, reads_new: bool) -> None:
    """Refuse ``schema`` unless it can read data of ``old`` (``reads_old``) and ``old`` can
    read its data (``reads_new``); a different type is always refused."""
    if old.schema.type != schema.type:
        raise IncompatibleSchemaError(
            f"{schema.type_name} schema is incompatible with version {old.version}, a {old.schema.type_name} schema")
    if parsed is None:
        return  # no checker for this type: Pulsar's default check passes
    try:
        previous = parse_definition(old.schema.data)
        backward = not reads_old or can_read(parsed, previous)
        forward = not reads_new or can_read(previous, parsed)
    except InvalidDefinitionError as error:  # a stored version under older rules, or too costly a walk
        raise InvalidSchemaError(f"Cannot check the schema against version {old.version}: {error}") from None
    if not backward:
        raise IncompatibleSchemaError(
            f"the new schema cannot read data written with version {old.version} (backward compatibility)")
    if not forward:
        raise IncompatibleSchemaError(
            f"version {old.version} cannot read data written with the new schema (forward compatibility)")
