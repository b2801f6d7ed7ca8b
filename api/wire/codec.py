"""Translations between protocol messages and core values.

* Message ids: ``MessageIdData`` carries ``ledgerId``/``entryId`` as uint64, so -1 (the
  earliest sentinel, an empty topic's entry id) travels as 2**64 - 1; the client reads it
  back as int64. ``batch_index`` and ``partition`` are written only when not -1, as the
  client itself writes them.
* ``request_id_of``: the request id of any command that has one, or None.
"""

from __future__ import annotations

from typing import cast

from ledger.position import Position
from message.proto import pulsar_api_pb2 as pb

__all__ = [
    "CONNECTION_COMMANDS", "U64_MAX", "fill_message_id", "from_message_id", "request_id_of", "server_error",
    "to_message_id",
]

U64_MAX = (1 << 64) - 1
_T = pb.BaseCommand

CONNECTION_COMMANDS = frozenset({
    _T.CONNECTED, _T.SEND_RECEIPT, _T.SEND_ERROR, _T.MESSAGE, _T.SUCCESS, _T.ERROR,
    _T.PRODUCER_SUCCESS, _T.PARTITIONED_METADATA_RESPONSE, _T.LOOKUP_RESPONSE,
    _T.GET_LAST_MESSAGE_ID_RESPONSE, _T.ACTIVE_CONSUMER_CHANGE, _T.REACHED_END_OF_TOPIC,
})
"""Commands only a broker sends: a client sending one is broken, and is disconnected."""


def server_error(code: str) -> pb.ServerError:
    """The ``ServerError`` value named ``code`` (a name from our error classes)."""
    return cast("pb.ServerError", pb.ServerError.Value(code))


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def to_message_id(position: Position) -> pb.MessageIdData:
    """The wire form of ``position``."""
    message_id = pb.MessageIdData()
    fill_message_id(message_id, position)
    return message_id


def fill_message_id(message_id: pb.MessageIdData, position: Position) -> None:
    """Write the wire form of ``position`` into an empty ``message_id`` (in place: a
    field of a command being built)."""
    message_id.ledgerId = position.ledger_id & U64_MAX
    message_id.entryId = position.entry_id & U64_MAX
    if position.batch_index >= 0:
        message_id.batch_index = position.batch_index
    if position.partition >= 0:
        message_id.partition = position.partition


def from_message_id(message_id: pb.MessageIdData) -> Position:
    """The position a client's ``MessageIdData`` names (batch index -1 when absent)."""
    batch_index = message_id.batch_index if message_id.HasField("batch_index") else -1
    return Position(_signed(message_id.ledgerId), _signed(message_id.entryId), batch_index)


def request_id_of(command: pb.BaseCommand) -> int | None:
    """The request id carried by ``command``'s sub-message, or None."""
    field = command.DESCRIPTOR.fields_by_number.get(command.type)
    if field is None or not command.HasField(field.name):
        return None
    body = getattr(command, field.name)
    if "request_id" not in body.DESCRIPTOR.fields_by_name or not body.HasField("request_id"):
        return None
    return int(body.request_id)
