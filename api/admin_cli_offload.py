"""``compactd admin`` verbs of tiered storage, as ``pulsar-admin`` names them::

    topics offload (-s SIZE | -m L:E) TOPIC          PUT  …/offload {ledgerId, entryId}
    topics offload-status [-w] TOPIC                 GET  …/offload
    topics|namespaces set-offload-threshold -s SIZE  POST …/offloadThreshold
    topics|namespaces set-offload-deletion-lag -l D  POST …/offloadDeletionLagMs
    get-… / remove-… of both                         GET / DELETE

``offload -s SIZE`` keeps about SIZE bytes of the newest ledgers local, as ``pulsar-admin``
does it: the client reads the internal stats and picks the message id itself
(``offload_message_id``); the broker never sees the size. ``-m L:E`` names the message id:
every sealed ledger before ledger L is offloaded. The policies' values may be negative
(``-1``: off for the threshold, keep local copies for the lag), unlike the other policies.

Importing this module registers the verbs (``api.cli`` does). Output and failures follow
``api.admin_cli``. No ``from __future__ import annotations``: typer reads the annotations.
"""

from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from api.admin_cli import (
    Topic,
    _add_get_remove_verbs,
    _add_status_verb,
    _call,
    _full_name,
    _namespace,
    _parsed,
    _target_argument,
    _topic,
    namespaces,
    parse_duration_ms,
    parse_size,
    topics,
)
from api.admin_cli_topics import parse_message_id

__all__ = ["offload_message_id", "parse_signed_duration_ms", "parse_signed_size"]


def offload_message_id(ledgers: Sequence[dict[str, Any]], threshold_bytes: int) -> tuple[int, int] | None:
    """The message id ``offload -s`` sends for internal stats' ``ledgers`` (oldest first):
    walking newest to oldest and summing sizes, the first time the sum exceeds
    ``threshold_bytes`` the answer is (the ledger visited just before, 0) — every older ledger
    goes; None when the sum never exceeds it (nothing to offload). Pulsar's
    ``findFirstLedgerWithinThreshold``."""
    if not ledgers:
        return None
    newest_first = list(reversed(ledgers))
    previous = int(newest_first[0]["ledgerId"])
    suffix_bytes = 0
    for ledger in newest_first:
        suffix_bytes += int(ledger["size"])
        if suffix_bytes > threshold_bytes:
            return previous, 0
        previous = int(ledger["ledgerId"])
    return None


def _signed(parse: Callable[[str], int]) -> Callable[[str], int]:
    def parse_signed(text: str) -> int:
        stripped = text.strip()
        return -parse(stripped[1:]) if stripped.startswith("-") else parse(stripped)
    return parse_signed


parse_signed_size = _signed(parse_size)
parse_signed_size.__doc__ = "``parse_size``, or a negative one (``-1``)."
parse_signed_duration_ms = _signed(parse_duration_ms)
parse_signed_duration_ms.__doc__ = "``parse_duration_ms``, or a negative one (``-1``)."


@topics.command("offload")
def offload(
    ctx: typer.Context,
    topic: Topic,
    size_threshold: Annotated[str | None, typer.Option(
        "--size-threshold", "-s", metavar="SIZE",
        help="Keep about this much of the newest data local, offload the older ledgers (bytes, or 10M, 1G).")] = None,
    message_id: Annotated[str | None, typer.Option(
        "--messageId", "-m", metavar="L:E", help="Offload every sealed ledger before this message's ledger.")] = None,
) -> None:
    """Offload the topic's older sealed ledgers to the bucket (HTTP 409 while one runs)."""
    if (size_threshold is None) == (message_id is None):
        raise typer.BadParameter("give exactly one of --size-threshold and --messageId", param_hint="'--size-threshold'")
    path = _topic(topic)
    if size_threshold is not None:
        threshold: int = _parsed(parse_size, size_threshold, "'--size-threshold'")
        stats = _call(ctx, "GET", f"{path}/internalStats")
        chosen = offload_message_id(stats.get("ledgers", []) if isinstance(stats, dict) else [], threshold)
        if chosen is None:
            typer.echo(f"Nothing to offload for {_full_name(path)}")
            return
    else:
        assert message_id is not None
        chosen = _parsed(parse_message_id, message_id, "'--messageId'")
    ledger_id, entry_id = chosen
    _call(ctx, "PUT", f"{path}/offload", body={"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1},
          has_body=True)
    typer.echo(f"Offload triggered for {_full_name(path)} for messages before {ledger_id}:{entry_id}")


_add_status_verb("offload-status", "offload", "Print the status of the topic's last offload; exit 1 when it is ERROR.",
                 ends="offload")


def _add_offload_policy_verbs(group: typer.Typer, scope: str, to_path: Callable[[str], str]) -> None:
    """``set-offload-threshold -s SIZE`` and ``set-offload-deletion-lag -l DURATION`` (with
    their ``get-``/``remove-``) on ``group``, as ``pulsar-admin namespaces`` names them."""
    argument = _target_argument(scope)

    def set_offload_threshold(
        ctx: typer.Context,
        target: str = argument,
        size: str = typer.Option(..., "--size", "-s", metavar="SIZE", help=(
            "Bytes of the newest ledgers kept local (or 10M, 1G); 0 offloads every sealed ledger, "
            "-1 turns automatic offload off.")),
    ) -> None:
        value = _parsed(parse_signed_size, size, "'--size'")
        _call(ctx, "POST", f"{to_path(target)}/offloadThreshold", body=value, has_body=True)

    def set_offload_deletion_lag(
        ctx: typer.Context,
        target: str = argument,
        lag: str = typer.Option(..., "--lag", "-l", metavar="DURATION", help=(
            "Time after its offload a ledger's local copy is deleted (ms, or 10m, 4h); -1 keeps it.")),
    ) -> None:
        value = _parsed(parse_signed_duration_ms, lag, "'--lag'")
        _call(ctx, "POST", f"{to_path(target)}/offloadDeletionLagMs", body=value, has_body=True)

    group.command("set-offload-threshold", help=f"Set the {scope}'s offloadThreshold: bytes kept local.")(
        set_offload_threshold)
    group.command("set-offload-deletion-lag", help=f"Set the {scope}'s offloadDeletionLagMs.")(
        set_offload_deletion_lag)
    _add_get_remove_verbs(group, "offload-threshold", "offloadThreshold", scope, to_path)
    _add_get_remove_verbs(group, "offload-deletion-lag", "offloadDeletionLagMs", scope, to_path)


_add_offload_policy_verbs(topics, "topic", _topic)
_add_offload_policy_verbs(namespaces, "namespace", _namespace)
