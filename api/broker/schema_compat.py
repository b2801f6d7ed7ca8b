"""Avro schema resolution: can data written with one schema be read with another?

This is the check behind Pulsar's BACKWARD, FORWARD and FULL strategies for AVRO and JSON
schemas (both carry an Avro record definition). Definitions are parsed by fastavro
(``parse_definition``: names expanded to full names, named types resolved), so this module
only walks two parsed schemas by the Avro specification's resolution rules (below).

A definition is read hostile-first (``load_definition``, ``parse_definition``): UTF-8 text
(``InvalidDefinitionError`` otherwise), JSON nested at most ``SCHEMA_DEPTH_MAX`` deep
(measured on the text before it is parsed, so no parser recurses past it), no lone
surrogate anywhere (``"\udcff"`` is valid JSON but no text), no NaN or Infinity. fastavro
then parses it, and ``_check_names`` adds the Avro rules fastavro leaves out and that
Pulsar's parser (Avro's Java one) applies: a record has a ``fields`` array (it may be
empty, as in Avro and Pulsar), field and symbol names are unique, names are Avro names,
``aliases`` and ``symbols`` are lists of names, a fixed ``size`` is an integer, a union
holds no union and no two branches of one unnamed type. Resolution walks at most
``COMPAT_STEPS_MAX`` pairs of types: a pair of schemas that needs more (named types reused
many times over) is refused rather than compared for minutes.

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

``can_read(reader, writer)`` answers for parsed schemas; for a valid pair it raises only
``InvalidDefinitionError`` when the walk would pass ``COMPAT_STEPS_MAX``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

__all__ = [
    "COMPAT_STEPS_MAX",
    "REASON_CHARS_MAX",
    "SCHEMA_DEPTH_MAX",
    "InvalidDefinitionError",
    "can_read",
    "load_definition",
    "parse_definition",
]

SCHEMA_DEPTH_MAX = 100
"""Deepest nesting of JSON arrays and objects in a definition. A record nested in a field
of a record takes three levels; real schemas stay far below. It keeps every recursive walk
(the JSON parser, fastavro, ``can_read``) far from Python's recursion limit."""
COMPAT_STEPS_MAX = 100_000
"""Most pairs of types one ``can_read`` compares (every named-type reference counts again)."""

_PROMOTIONS = {
    ("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
    ("float", "double"), ("string", "bytes"), ("bytes", "string"),
}  # (writer, reader)
_NAMED = ("record", "error", "enum", "fixed")
_UNNAMED = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string", "array", "map"})
REASON_CHARS_MAX = 200
"""A refusal quotes at most this much of the definition (a name, fastavro's message)."""
_STRING = re.compile(r'"(?:[^"\\]|\\.)*+"', re.DOTALL)  # a JSON string literal, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FULL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


class InvalidDefinitionError(ValueError):
    """A schema definition that is not JSON or not a valid Avro schema."""


def load_definition(data: bytes) -> Any:
    """The JSON value of a definition, read as the module docstring says (UTF-8 text, at
    most ``SCHEMA_DEPTH_MAX`` deep, no lone surrogate, no NaN); ``InvalidDefinitionError``
    naming the problem otherwise. Never recurses deeper than ``SCHEMA_DEPTH_MAX``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidDefinitionError(f"the schema definition is not UTF-8 text: {error}") from None
    depth = _depth(text)
    if depth > SCHEMA_DEPTH_MAX:
        raise InvalidDefinitionError(
            f"the schema definition is nested {depth} deep, more than the limit of {SCHEMA_DEPTH_MAX}")
    try:
        definition = json.loads(text, parse_constant=_no_constant)
    except ValueError as error:
        raise InvalidDefinitionError(f"the schema definition is not JSON: {_clip(error)}") from None
    try:  # a "\ud800" escape alone parses to a lone surrogate: not text
        json.dumps(definition, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        lone = ascii(error.object[error.start:error.end])
        raise InvalidDefinitionError(f"the schema definition holds a lone surrogate {lone}: not text") from None
    return definition


def parse_definition(data: bytes) -> Any:
    """The fastavro-parsed form of an Avro definition (JSON text); ``InvalidDefinitionError``
    naming the problem when it is not one."""
    definition = load_definition(data)
    import fastavro  # here: only AVRO and JSON schemas need it (a dependency of compactd)

    try:
        parsed = fastavro.parse_schema(definition, _write_hint=False, _force=True)
    except Exception as error:  # noqa: BLE001 - fastavro raises several types for a bad schema
        raise InvalidDefinitionError(f"the schema definition is not a valid Avro schema: {_clip(error)}") from None
    problem = next(_check_names(definition), None)
    if problem is not None:
        raise InvalidDefinitionError(f"the schema definition is not a valid Avro schema: {_clip(problem)}")
    return parsed


def can_read(reader: Any, writer: Any) -> bool:
    """True when data written with ``writer`` resolves against ``reader`` (parsed schemas);
    ``InvalidDefinitionError`` when that takes more than ``COMPAT_STEPS_MAX`` steps."""
    return _resolves(reader, writer, {}, {}, set(), [COMPAT_STEPS_MAX])


def _depth(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text`` (its string literals left out);
    a loop in C over the brackets, never a recursion."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def _clip(text: object) -> str:
    shown = str(text)
    return shown if len(shown) <= REASON_CHARS_MAX else shown[:REASON_CHARS_MAX] + "…"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _check_names(definition: Any) -> Iterator[str]:
    """The Avro rules fastavro does not check, in the raw definition (a walk without
    recursion: an explicit stack): each problem found, as a sentence."""
    stack = [definition]
    while stack:
        schema = stack.pop()
        if isinstance(schema, list):
            yield from _union_problems(schema)
            stack.extend(schema)
            continue
        if not isinstance(schema, dict):
            continue
        kind = schema.get("type")
        if isinstance(kind, dict | list):
            stack.append(kind)
            continue
        if kind in _NAMED:
            yield from _named_problems(schema)
        if kind in ("record", "error"):
            fields = schema.get("fields")
            if not isinstance(fields, list):
                yield f"record {schema.get('name')!r} has no fields array"
                continue
            names = [field.get("name") for field in fields if isinstance(field, dict)]
            yield from (f"field name {name!r} is not an Avro name" for name in names
                        if not isinstance(name, str) or not _NAME.fullmatch(name))
            yield from (f"duplicate field {name!r} in record {schema.get('name')!r}"
                        for name in {n for n in names if names.count(n) > 1})
            for field in fields:
                if isinstance(field, dict):
                    yield from _aliases_problems(field)
                    stack.append(field.get("type"))
        elif kind == "enum":
            symbols = schema.get("symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) and _NAME.fullmatch(s) for s in symbols):
                yield f"the symbols of enum {schema.get('name')!r} are not a list of Avro names"
        elif kind == "fixed":
            size = schema.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                yield f"the size of fixed {schema.get('name')!r} is not a non-negative integer"
        elif kind == "array":
            stack.append(schema.get("items"))
        elif kind == "map":
            stack.append(schema.get("values"))


def _named_problems(schema: dict[str, Any]) -> Iterator[str]:
    name, namespace = schema.get("name"), schema.get("namespace")
    if not isinstance(name, str) or not _FULL_NAME.fullmatch(name):
        yield f"name {name!r} is not an Avro name"
    if namespace is not None and (not isinstance(namespace, str)
                                  or (namespace and not _FULL_NAME.fullmatch(namespace))):
        yield f"namespace {namespace!r} is not an Avro namespace"
    yield from _aliases_problems(schema)


def _aliases_problems(schema: dict[str, Any]) -> Iterator[str]:
    aliases = schema.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and _FULL_NAME.fullmatch(a) for a in aliases):
        yield f"the aliases of {schema.get('name')!r} are not a list of Avro names"


def _union_problems(branches: list[Any]) -> Iterator[str]:
    if any(isinstance(branch, list) for branch in branches):
        yield "a union holds a union"
    unnamed = [kind for kind in map(_kind, branches) if kind in _UNNAMED]
    if len(unnamed) != len(set(unnamed)):
        yield f"a union holds two branches of one unnamed type: {sorted(unnamed)}"


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        kind = schema.get("type")
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
              seen: set[tuple[str, str]], steps: list[int]) -> bool:
    steps[0] -= 1
    if steps[0] < 0:
        raise InvalidDefinitionError(
            f"comparing the two schemas takes more than {COMPAT_STEPS_MAX} steps (named types reused too often)")
    reader, writer = _named(reader, rnames), _named(writer, wnames)
    rkind, wkind = _kind(reader), _kind(writer)
    if wkind == "union":
        return all(_resolves(reader, branch, rnames, wnames, seen, steps) for branch in writer)
    if rkind == "union":
        return any(_resolves(branch, writer, rnames, wnames, seen, steps) for branch in reader)
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
        return _record_resolves(reader, writer, rnames, wnames, seen, steps)
    if rkind == "enum":
        return "default" in reader or set(writer["symbols"]) <= set(reader["symbols"])
    if rkind == "fixed":
        return bool(reader["size"] == writer["size"])
    if rkind == "array":
        return _resolves(reader["items"], writer["items"], rnames, wnames, seen, steps)
    if rkind == "map":
        return _resolves(reader["values"], writer["values"], rnames, wnames, seen, steps)
    return True  # the same primitive


def _record_resolves(reader: dict[str, Any], writer: dict[str, Any], rnames: dict[str, Any],
                     wnames: dict[str, Any], seen: set[tuple[str, str]], steps: list[int]) -> bool:
    written = {field["name"]: field for field in writer["fields"]}
    for field in reader["fields"]:
        names = (field["name"], *field.get("aliases", ()))
        match = next((written[name] for name in names if name in written), None)
        if match is None:
            if "default" not in field:
                return False
        elif not _resolves(field["type"], match["type"], rnames, wnames, seen, steps):
            return False
    return True
