"""The chunks of one chunked message, checked together before any of them is stored.

``api.wire.validate`` checks each chunk alone (``num_chunks_from_msg`` > 1: a uuid, a
chunk id below the chunk count, a payload within ``total_chunk_msg_size``). The real
client (C++ core) then trusts what the chunks of one ``uuid`` say together: at chunk 0 it
allocates ``total_chunk_msg_size`` bytes and copies every following chunk in without a
bounds check, and at the last chunk it decompresses the whole with ``LZ4_decompress_fast``
or an unchecked snappy sink, which read and write past their buffers on hostile bytes.
``ChunkDoor`` holds, per topic and uuid, what the broker has accepted so far, and refuses
a chunk (SEND_ERROR, nothing stored) unless every reader, whatever subset of the stored
chunks it sees in topic order, can only ever assemble that message:

* every chunk of a uuid carries the same ``total_chunk_msg_size``, chunk count, codec
  and ``uncompressed_size`` as its chunk 0;
* chunks come in order: chunk k follows chunk k - 1; a chunk sent again (a client's
  resend after a reconnect) is the same bytes as the first time;
* their payloads add up to at most ``total_chunk_msg_size``, and at the last chunk the
  whole decodes as ``message.compression.decompress`` decodes any payload (unless it is
  encrypted: the broker cannot open it).

A chunk k > 0 of a uuid this door has not seen (its chunk 0 came before the broker
started, or its record was dropped to stay within ``CHUNKED_MESSAGES_OPEN_MAX`` /
``CHUNK_BUFFER_BUDGET_BYTES``) is refused: the client fails that message and the
stored chunks before it stay an incomplete message, which readers discard. One
``ChunkDoor`` per listener (``api.wire.limits.Connections``), used on the event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

import crc32c

from api.broker.errors import BrokerError, NotAllowedError
from message.compression import decompress
from message.entry import is_encrypted, parse_header
from message.errors import MalformedEntryError

__all__ = ["CHUNKED_MESSAGES_OPEN_MAX", "CHUNK_BUFFER_BUDGET_BYTES", "ChunkDoor", "may_be_chunk"]

CHUNKED_MESSAGES_OPEN_MAX = 4096
"""Chunked messages remembered at once (open or complete), across the listener's topics."""
CHUNK_BUFFER_BUDGET_BYTES = 256 * 1024 * 1024
"""Bytes of incomplete chunked messages held for their final decode, across the listener."""
_CHUNK_COUNT_TAG = b"\xd8\x01"
"""``num_chunks_from_msg`` (field 27, varint) as it opens in serialized MessageMetadata."""


def may_be_chunk(entry: bytes) -> bool:
    """False when ``entry``'s metadata cannot hold ``num_chunks_from_msg`` (cheap, no parse)."""
    size = int.from_bytes(entry[:4], "big")
    return entry.find(_CHUNK_COUNT_TAG, 4, 4 + size) >= 0


@dataclass
class _Message:
    """What was accepted of one chunked message."""

    shape: tuple[int, int, int, int]
    """``(total_chunk_msg_size, num_chunks_from_msg, compression, uncompressed_size)``."""
    chunks: list[tuple[int, int]] = field(default_factory=list)
    """``(length, crc32c)`` of each accepted chunk, by chunk id."""
    body: bytearray | None = field(default_factory=bytearray)
    """The chunks so far, joined; None once the message is complete."""
    stored_bytes: int = 0


class ChunkDoor:
    """The chunked messages of one listener's topics (see the module docstring)."""

    def __init__(self, open_max: int = CHUNKED_MESSAGES_OPEN_MAX,
                 budget_bytes: int = CHUNK_BUFFER_BUDGET_BYTES) -> None:
        self._open_max = open_max
        self._budget_bytes = budget_bytes
        self._held_bytes = 0
        self._messages: OrderedDict[tuple[Hashable, str], _Message] = OrderedDict()

    def problem(self, topic: Hashable, entry: bytes) -> BrokerError | None:
        """Why the chunk in ``entry`` (already passed ``api.wire.validate``) must not be
        stored on ``topic`` (its name, any hashable), or None, in which case it is counted
        as stored."""
        try:
            metadata, header_size, _ = parse_header(entry)
        except MalformedEntryError as error:
            return NotAllowedError(f"the message does not decode: {error}")
        chunk_count = metadata.num_chunks_from_msg
        if chunk_count <= 1:
            return None
        uuid = metadata.uuid if isinstance(metadata.uuid, str) else metadata.uuid.decode("utf-8", "replace")
        chunk_id, payload = metadata.chunk_id, entry[header_size:]
        shape = (metadata.total_chunk_msg_size, chunk_count, metadata.compression, metadata.uncompressed_size)
        key = (topic, uuid)
        message = self._messages.get(key)
        if message is None:
            if chunk_id != 0:
                return NotAllowedError(f"chunk {chunk_id} of message {uuid!r} comes without its chunk 0")
            message = self._remember(key, _Message(shape))
        self._messages.move_to_end(key)
        if shape != message.shape:
            return NotAllowedError(f"chunk {chunk_id} of message {uuid!r} disagrees with its chunk 0 on"
                                   f" (total_chunk_msg_size, num_chunks_from_msg, compression, uncompressed_size):"
                                   f" {shape} != {message.shape}")
        piece = (len(payload), crc32c.crc32c(payload))
        if chunk_id < len(message.chunks):
            if message.chunks[chunk_id] != piece:
                return NotAllowedError(f"chunk {chunk_id} of message {uuid!r} sent again with other bytes")
            return None
        if chunk_id > len(message.chunks) or message.body is None:
            return NotAllowedError(f"chunk {chunk_id} of message {uuid!r} follows chunk {len(message.chunks) - 1}")
        total = shape[0]
        if message.stored_bytes + len(payload) > total:
            return NotAllowedError(f"the chunks of message {uuid!r} exceed its total_chunk_msg_size {total}")
        if chunk_id == chunk_count - 1:
            problem = self._whole_problem(message, payload, encrypted=is_encrypted(metadata))
            if problem is not None:
                return problem
            self._held_bytes -= len(message.body)
            message.body = None
        else:
            message.body += payload
            self._held_bytes += len(payload)
            self._within_budget()
        message.chunks.append(piece)
        message.stored_bytes += len(payload)
        return None

    @staticmethod
    def _whole_problem(message: _Message, last: bytes, *, encrypted: bool) -> BrokerError | None:
        if encrypted:
            return None  # sealed: the broker cannot open it
        assert message.body is not None
        _, _, codec, uncompressed_size = message.shape
        try:
            decompress(codec, bytes(message.body) + last, uncompressed_size)
        except MalformedEntryError as error:
            return NotAllowedError(f"the chunked message does not decode: {error}")
        return None

    def _remember(self, key: tuple[Hashable, str], message: _Message) -> _Message:
        old = self._messages.pop(key, None)
        if old is not None and old.body is not None:
            self._held_bytes -= len(old.body)
        self._messages[key] = message
        while len(self._messages) > self._open_max:
            self._forget_oldest()
        return message

    def _within_budget(self) -> None:
        while self._held_bytes > self._budget_bytes and len(self._messages) > 1:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        _, old = self._messages.popitem(last=False)
        if old.body is not None:
            self._held_bytes -= len(old.body)
