"""What dispatch needs to know of a stored entry, from one parse of its metadata.

Dispatch asks two things of every entry it reads: how many messages it holds (the permits
it uses: a batch's ``num_messages_in_batch``, else 1) and, on Shared and Key_Shared, when
it is due (``deliver_at_time``, delayed delivery). ``entry_facts`` answers both from one
parse of the ``MessageMetadata``. Entries as the broker stores them (``metadataSize ·
metadata · payload``, no checksum or broker-entry prefix: SEND accepted only entries whose
metadata parses) take a short path; anything else goes through ``message.entry``'s
full parser. An entry whose metadata does not parse counts as one message, due at once
(its consumer's client reports it), as before.
"""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError

from message.entry import BROKER_ENTRY_MAGIC, CHECKSUM_MAGIC, is_batch, parse_header
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

__all__ = ["entry_facts"]

_U32 = struct.Struct(">I")
_PREFIXES = (CHECKSUM_MAGIC, BROKER_ENTRY_MAGIC)


def entry_facts(data: bytes) -> tuple[int, int | None]:
    """``(messages, deliver_at_ms)`` of a stored entry: its slot count (1 when not a batch
    or not parseable) and its ``deliver_at_time`` (None when it has none)."""
    if len(data) > 4 and data[:2] not in _PREFIXES:
        size: int = _U32.unpack_from(data, 0)[0]
        if 0 < size <= len(data) - 4:
            metadata = pb.MessageMetadata()
            try:
                metadata.ParseFromString(data[4 : 4 + size])
            except (DecodeError, UnicodeDecodeError):
                return 1, None
            if metadata.IsInitialized():
                count = metadata.num_messages_in_batch if is_batch(metadata) else 1
                if count >= 1:
                    return count, metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None
    return _parsed_facts(data)


def _parsed_facts(data: bytes) -> tuple[int, int | None]:
    """``entry_facts`` through the full parser (prefixed or odd entries)."""
    try:
        metadata = parse_header(bytes(data))[0]
    except MalformedEntryError:
        return 1, None
    count = metadata.num_messages_in_batch if is_batch(metadata) else 1
    return count, metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None
