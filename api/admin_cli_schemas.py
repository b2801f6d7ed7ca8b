"""``compactd admin schemas`` and the schema compatibility strategy verbs, as ``pulsar-admin``.

::

    compactd admin schemas get TOPIC [--version N]     the latest schema, or version N
    compactd admin schemas upload TOPIC -f FILE        register the schema FILE describes
    compactd admin schemas delete TOPIC                delete every version
    compactd admin namespaces|topics set-schema-compatibility-strategy NAME -c STRATEGY
    compactd admin namespaces|topics get-|remove-schema-compatibility-strategy NAME

FILE is pulsar-admin's schema file, a JSON object ``{"type": "AVRO", "schema": "…",
"properties": {…}}``; ``schema`` may also be the definition itself (a JSON object), which
is sent as its text. A file that cannot be read or is not such an object is a usage error
(exit 2) naming it. Output and failures are ``api.admin_cli``'s.

This module registers its verbs on ``api.admin_cli.app`` when imported (``api.cli`` does).
Like ``api.admin_cli`` it has no ``from __future__ import annotations``: typer reads the
annotations of the factory-built verbs as live objects.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from api import admin_cli
from api.admin_cli import _call, _namespace, _print_json, _topic
from api.schema_names import STRATEGIES

__all__ = ["read_schema_file", "schema_path", "schemas"]

STRATEGY_NAMES = STRATEGIES

schemas = typer.Typer(name="schemas", no_args_is_help=True, help="Operations on topic schemas.")
admin_cli.app.add_typer(schemas)

Topic = Annotated[str, typer.Argument(metavar="TOPIC", help="persistent://tenant/namespace/topic, or its short form.")]


def schema_path(topic: str) -> str:
    """The schema REST path of ``topic`` (a usage error for a bad name)."""
    return _topic(topic).replace("/admin/v2/persistent/", "/admin/v2/schemas/", 1) + "/schema"


def read_schema_file(path: Path) -> dict[str, Any]:
    """The upload body pulsar-admin's schema file ``path`` describes; ``ValueError`` naming
    the file and what is wrong."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"cannot read schema file {str(path)!r}: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("type"), str):
        raise ValueError(f"schema file {str(path)!r} is not a JSON object with a \"type\"")  # noqa: TRY004
    definition = document.get("schema", "")
    if not isinstance(definition, str):
        definition = json.dumps(definition)
    properties = document.get("properties") or {}
    if not isinstance(properties, dict) or not all(isinstance(v, str) for v in properties.values()):
        raise ValueError(f"schema file {str(path)!r}: \"properties\" must map names to strings")
    return {"type": document["type"], "schema": definition, "properties": properties}


@schemas.command("get")
def get_schema(
    ctx: typer.Context, topic: Topic,
    version: Annotated[int | None, typer.Option("--version", min=0, help="That version instead of the latest.")] = None,
) -> None:
    """Print the topic's latest schema, or one version of it."""
    path = schema_path(topic) if version is None else f"{schema_path(topic)}/{version}"
    _print_json(_call(ctx, "GET", path))


@schemas.command("upload")
def upload_schema(
    ctx: typer.Context, topic: Topic,
    filename: Annotated[Path, typer.Option("--filename", "-f", metavar="FILE",
                                           help="pulsar-admin's schema file (JSON: type, schema, properties).")],
) -> None:
    """Register a schema on the topic (checked as a producer's); prints its version."""
    try:
        body = read_schema_file(filename)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="'--filename'") from None
    _print_json(_call(ctx, "POST", schema_path(topic), body=body, has_body=True))


@schemas.command("delete")
def delete_schema(ctx: typer.Context, topic: Topic) -> None:
    """Delete every version of the topic's schema."""
    _call(ctx, "DELETE", schema_path(topic))


def _add_strategy_verbs(group: typer.Typer, scope: str, to_path: Callable[[str], str]) -> None:
    metavar = "TOPIC" if scope == "topic" else "NAMESPACE"
    target_help = ("persistent://tenant/namespace/topic, or its short form." if scope == "topic"
                   else "tenant/namespace, e.g. public/default.")

    def set_strategy(
        ctx: typer.Context,
        target: str = typer.Argument(..., metavar=metavar, help=target_help),
        strategy: str = typer.Option(..., "--compatibility", "-c", metavar="STRATEGY",
                                     help=f"One of {', '.join(STRATEGY_NAMES)}."),
    ) -> None:
        if strategy.upper() not in STRATEGY_NAMES:
            raise typer.BadParameter(f"invalid strategy {strategy!r}: expected one of {', '.join(STRATEGY_NAMES)}",
                                     param_hint="'--compatibility'")
        _call(ctx, "PUT", f"{to_path(target)}/schemaCompatibilityStrategy", body=strategy.upper(), has_body=True)

    def get_strategy(ctx: typer.Context, target: str = typer.Argument(..., metavar=metavar, help=target_help)) -> None:
        _print_json(_call(ctx, "GET", f"{to_path(target)}/schemaCompatibilityStrategy"))

    def remove_strategy(ctx: typer.Context,
                        target: str = typer.Argument(..., metavar=metavar, help=target_help)) -> None:
        _call(ctx, "DELETE", f"{to_path(target)}/schemaCompatibilityStrategy")

    group.command("set-schema-compatibility-strategy",
                  help=f"Set the {scope}'s schema compatibility strategy.")(set_strategy)
    group.command("get-schema-compatibility-strategy",
                  help=f"Print the {scope}'s schema compatibility strategy (null when unset).")(get_strategy)
    group.command("remove-schema-compatibility-strategy",
                  help=f"Remove the {scope}'s schema compatibility strategy.")(remove_strategy)


_add_strategy_verbs(admin_cli.topics, "topic", _topic)
_add_strategy_verbs(admin_cli.namespaces, "namespace", _namespace)
