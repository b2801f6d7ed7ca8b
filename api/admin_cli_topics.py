"""``compactd admin topics`` verbs on subscriptions and loading, as ``pulsar-admin`` names
them; each is one request (``peek-messages -n N``: N of them) to the REST paths of
``api.routers.subscriptions``::

    subscriptions TOPIC                          GET  …/subscriptions
    peek-messages TOPIC -s SUB [-n N]            GET  …/subscription/SUB/position/1..N
    reset-cursor TOPIC -s SUB -t DURATION        POST …/subscription/SUB/resetcursor/NOW-DURATION
    reset-cursor TOPIC -s SUB -m L:E [-e]        POST …/subscription/SUB/resetcursor {ledgerId, entryId}
    clear-backlog TOPIC -s SUB                   POST …/subscription/SUB/skip_all
    unload TOPIC                                 PUT  …/unload
    last-message-id TOPIC                        GET  …/lastMessageId

Importing this module registers the verbs on ``api.admin_cli.topics`` (``api.cli`` does).
Output and failures follow ``api.admin_cli``: JSON or one line a name on stdout, one
``error: …`` line on stderr and exit 1 for an error answer, usage errors exit 2.

Like ``api.admin_cli``, no ``from __future__ import annotations``: typer reads the
annotations as live objects.
"""

import json
import re
import string
import time
from typing import Annotated
from urllib.parse import quote, unquote

import httpx
import typer

from api.admin_cli import (
    AdminError,
    Topic,
    _call,
    _client,
    _fail,
    _parsed,
    _print_json,
    _topic,
    parse_duration_ms,
)
from api.admin_cli import topics as topics_group

__all__ = ["format_peeked", "parse_message_id", "subscription_path"]

_MESSAGE_ID = re.compile(r"^(-?\d+):(-?\d+)(?::-?\d+)*$")  # ledger:entry[:partition[:batch]]
_PRINTABLE = set(string.printable) - set("\x0b\x0c")

Subscription = Annotated[str, typer.Option("--subscription", "-s", metavar="NAME", help="The subscription.")]


def parse_message_id(text: str) -> tuple[int, int]:
    """``(ledger_id, entry_id)`` of ``"L:E"`` (a partition and batch index after it are ignored)."""
    match = _MESSAGE_ID.match(text.strip())
    if match is None:
        raise ValueError(f"invalid message id {text!r}: expected ledgerId:entryId, e.g. 12:3")
    return int(match.group(1)), int(match.group(2))


def subscription_path(topic_path: str, subscription: str) -> str:
    """The REST path of ``subscription`` of the topic at ``topic_path`` (name quoted)."""
    if not subscription:
        raise ValueError("the subscription name is empty")
    return f"{topic_path}/subscription/{quote(subscription, safe='')}"


def format_peeked(index: int, response: httpx.Response) -> str:
    """One peeked entry as text: its id and metadata, then its payload (text when it is
    printable UTF-8, else a hex dump)."""
    headers = response.headers
    lines = [f"Message {index}", f"Message ID: {headers.get('x-pulsar-message-id', '?')}"]
    publish_ms = headers.get("x-pulsar-publish-time")
    if publish_ms and publish_ms.isdigit() and int(publish_ms) > 0:
        shown = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(publish_ms) / 1000))
        lines.append(f"Publish time: {shown}.{int(publish_ms) % 1000:03d}Z ({publish_ms})")
    for header, label in (("x-pulsar-producer-name", "Producer"), ("x-pulsar-partition-key", "Key"),
                          ("x-pulsar-num-batch-message", "Batch messages")):
        if header in headers:
            lines.append(f"{label}: {unquote(headers[header])}")
    properties = {unquote(name[len("x-pulsar-property-"):]): unquote(value)
                  for name, value in headers.items() if name.lower().startswith("x-pulsar-property-")}
    if properties:
        lines.append(f"Properties: {json.dumps(properties, sort_keys=True)}")
    lines.append(_payload_text(response.content))
    return "\n".join(lines)


def _payload_text(payload: bytes) -> str:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(ch in _PRINTABLE or ch.isprintable() for ch in text):
        return text
    rows = []
    for offset in range(0, len(payload), 16):
        chunk = payload[offset:offset + 16]
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        rows.append(f"{offset:08x}  {chunk.hex(' '):<47}  |{shown}|")
    return "\n".join(rows)


def _subscription(topic: str, subscription: str) -> str:
    path: str = _parsed(lambda name: subscription_path(_topic(topic), name), subscription, "'--subscription'")
    return path


@topics_group.command("subscriptions")
def list_subscriptions(ctx: typer.Context, topic: Topic) -> None:
    """List the topic's subscriptions, one a line."""
    for name in _call(ctx, "GET", f"{_topic(topic)}/subscriptions") or []:
        typer.echo(name)


@topics_group.command("peek-messages")
def peek_messages(
    ctx: typer.Context, topic: Topic, subscription: Subscription,
    count: Annotated[int, typer.Option("--count", "-n", min=1, metavar="N",
                                       help="How many messages to show.")] = 1,
) -> None:
    """Show the first N messages the subscription has not acknowledged (nothing moves)."""
    path = _subscription(topic, subscription)
    for index in range(1, count + 1):
        try:
            response = _client(ctx).response("GET", f"{path}/position/{index}")
        except AdminError as error:
            if index > 1 and error.status == 404:  # fewer messages than asked for: show those
                return
            _fail(str(error))
        if index > 1:
            typer.echo("")
        typer.echo(format_peeked(index, response))


@topics_group.command("reset-cursor")
def reset_cursor(
    ctx: typer.Context, topic: Topic, subscription: Subscription,
    time_back: Annotated[str | None, typer.Option(
        "--time", "-t", metavar="DURATION",
        help="Reset to this long ago (ms, or 30s, 10m, 1h, 2d, 5w).")] = None,
    message_id: Annotated[str | None, typer.Option(
        "--messageId", "-m", metavar="L:E", help="Reset to this message id (ledgerId:entryId).")] = None,
    exclude: Annotated[bool, typer.Option(
        "--exclude-reset-position", "-e", help="With -m: start just after that message.")] = False,
) -> None:
    """Move the subscription to a time or a message id; its consumers reconnect there."""
    if (time_back is None) == (message_id is None):
        raise typer.BadParameter("give exactly one of --time and --messageId", param_hint="'--time'")
    path = _subscription(topic, subscription)
    if time_back is not None:
        back_ms: int = _parsed(parse_duration_ms, time_back, "'--time'")
        timestamp = max(0, int(time.time() * 1000) - back_ms)
        _call(ctx, "POST", f"{path}/resetcursor/{timestamp}")
        return
    assert message_id is not None
    ledger_id, entry_id = _parsed(parse_message_id, message_id, "'--messageId'")
    body = {"ledgerId": ledger_id, "entryId": entry_id, "isExcluded": exclude}
    _call(ctx, "POST", f"{path}/resetcursor", body=body, has_body=True)


@topics_group.command("clear-backlog")
def clear_backlog(ctx: typer.Context, topic: Topic, subscription: Subscription) -> None:
    """Acknowledge everything published so far on the subscription."""
    _call(ctx, "POST", f"{_subscription(topic, subscription)}/skip_all")


@topics_group.command("unload")
def unload(ctx: typer.Context, topic: Topic) -> None:
    """Unload the topic: its clients reconnect, its next use loads it again."""
    _call(ctx, "PUT", f"{_topic(topic)}/unload")


@topics_group.command("last-message-id")
def last_message_id(ctx: typer.Context, topic: Topic) -> None:
    """Print the id of the topic's last stored message."""
    _print_json(_call(ctx, "GET", f"{_topic(topic)}/lastMessageId"))
