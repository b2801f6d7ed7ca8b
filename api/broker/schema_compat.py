"""Avro schema resolution: can data written with one schema be read with another?

This is the check behind Pulsar's BACKWARD, FORWARD and FULL strategies for AVRO and JSON
schemas (both carry an Avro record definition). Definitions are parsed by fastavro
(``parse_definition``: names expanded to full names, named types resolved), so this module
only walks two parsed schemas by the Avro specification's resolution rules:

* the same primitive, or a promotion: int to long, float or double; long to float or
  double; float to double; string to bytes and bytes to string;
* records with the same name (unqualified, or an alias of the reader's): every reader field
  is matched by name (or an alias) with a writer field it can read, or has a ``default``;
  writer fields the reader lacks are skipped;
* enums with the same name: every writer symbol is a reader symbol, unless the reader has
  a ``default`` symbol;
* fixed of the same name and size; arrays and maps whose items and values resolve;
* a writer union resolves when each of its branches does; a reader union accepts a writer
  (not a union) that one of its branches can read.

``can_read(reader, writer)`` answers for parsed schemas; it never raises for a valid pair.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["InvalidDefinitionError", "can_read", "parse_definition"]

_PROMOTIONS = {
    ("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
    ("float", "double"), ("string", "bytes"), ("bytes", "string"),
}  # (writer, reader)
_NAMED = ("record", "error", "enum", "fixed")


class InvalidDefinitionError(ValueError):
    """A schema definition that is not JSON or not a valid Avro schema."""


def parse_definition(data: bytes) -> Any:
    """The fastavro-parsed form of an Avro definition (JSON text); ``InvalidDefinitionError``
    naming the problem when it is not one."""
    try:
        definition = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidDefinitionError(f"the schema definition is not JSON: {error}") from None
    import fastavro  # here: only AVRO and JSON schemas need it (a dependency of compactd)

    try:
        return fastavro.parse_schema(definition, _write_hint=False, _force=True)
    except Exception as error:  # noqa: BLE001 - fastavro raises several types for a bad schema
        raise InvalidDefinitionError(f"the schema definition is not a valid Avro schema: {error}") from None


def can_read(reader: Any, writer: Any) -> bool:
    """True when data written with ``writer`` resolves against ``reader`` (parsed schemas)."""
    return _resolves(reader, writer, {}, {}, set())


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        kind = schema["type"]
        return kind if isinstance(kind, str) else _kind(kind)
    return str(schema)


def _named(schema: Any, names: dict[str, Any]) -> Any:
    """Resolve a reference to a named type; collect named types as they are defined."""
    if isinstance(schema, str) and schema in names:
        return names[schema]
    if isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
        return _named(schema["type"], names)
    if isinstance(schema, dict) and schema.get("type") in _NAMED and "name" in schema:
        names.setdefault(schema["name"], schema)
    return schema


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _same_name(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    aliases = {_short(alias) for alias in reader.get("aliases", ())}
    return _short(writer["name"]) in {_short(reader["name"]), *aliases}


def _resolves(reader: Any, writer: Any, rnames: dict[str, Any], wnames: dict[str, Any],
              seen: set[tuple[str, str]]) -> bool:
    reader, writer = _named(reader, rnames), _named(writer, wnames)
    rkind, wkind = _kind(reader), _kind(writer)
    if wkind == "union":
        return all(_resolves(reader, branch, rnames, wnames, seen) for branch in writer)
    if rkind == "union":
        return any(_resolves(branch, writer, rnames, wnames, seen) for branch in reader)
    if rkind != wkind:
        return (wkind, rkind) in _PROMOTIONS
    if rkind in _NAMED:
        key = (reader["name"], writer["name"])
        if key in seen:  # a recursive type already being compared
            return True
        if not _same_name(reader, writer):
            return False
        seen = seen | {key}
    if rkind in ("record", "error"):
        return _record_resolves(reader, writer, rnames, wnames, seen)
    if rkind == "enum":
        return "default" in reader or set(writer["symbols"]) <= set(reader["symbols"])
    if rkind == "fixed":
        return bool(reader["size"] == writer["size"])
    if rkind == "array":
        return _resolves(reader["items"], writer["items"], rnames, wnames, seen)
    if rkind == "map":
        return _resolves(reader["values"], writer["values"], rnames, wnames, seen)
    return True  # the same primitive


def _record_resolves(reader: dict[str, Any], writer: dict[str, Any], rnames: dict[str, Any],
                     wnames: dict[str, Any], seen: set[tuple[str, str]]) -> bool:
    written = {field["name"]: field for field in writer["fields"]}
    for field in reader["fields"]:
        names = (field["name"], *field.get("aliases", ()))
        match = next((written[name] for name in names if name in written), None)
        if match is None:
            if "default" not in field:
                return False
        elif not _resolves(field["type"], match["type"], rnames, wnames, seen):
            return False
    return True
