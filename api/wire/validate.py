"""What a decoded frame must also satisfy before a handler may act on it.

``api/wire/frames.py`` guarantees a frame's shape (it parses, required fields are there,
one sub-message); this module checks what is *legal protobuf but hostile*, so that no such
value ever reaches broker state. ``frame_problem`` answers the refusal for a frame, or
None; the connection answers it for that command only (ERROR with the request id, the
command's own failed response, SEND_ERROR, or closing a connection-level command) and
creates nothing. The rules:

* **Strings are text.** Every ``string`` field, at every depth, is valid UTF-8. The upb
  runtime does not check proto2 strings: it hands back ``bytes`` instead of ``str``, and
  such a value used as a subscription name became a cursor row that failed every stats
  answer of its topic.
* **Names are names.** Topic names parse (``TopicName.parse``: no control characters, a
  trailing newline included), a namespace is ``tenant/namespace``, and the names the
  broker persists or shows (subscription, producer, consumer) have no control character;
  a subscription name is not empty.
* **Integers fit what they feed.** Sequence ids (``uint64`` on the wire) feed signed
  64-bit state (SQLite INTEGER, int64 columns), so they are below 2**63; so are a seek's
  publish time and a producer's ``topic_epoch`` (the next grant adds one to it). A
  message id's ``ledgerId``/``entryId`` are below 2**63 or the -1 sentinel (2**64 - 1).
* **A SEND's entry decodes** as every reader will decode it: its ``MessageMetadata``
  parses, its producer name is text, its sequence ids fit, and its times
  (``publish_time``, ``event_time``, ``deliver_at_time``, each slot's ``event_time``)
  lie in ``0..TIME_MS_MAX``, its strings (and each slot's key and properties) are
  valid UTF-8 (the real client's ``partition_key()`` raises on others); unless it is encrypted or one chunk of a chunked message
  (neither can be opened alone), its payload decompresses to ``uncompressed_size`` bytes
  and a batch splits into ``num_messages_in_batch`` slots, each slot's sequence id and
  event time fitting too. What makes an entry a chunk is the real client's test
  (``num_chunks_from_msg`` > 1); a chunk carries a ``uuid``, no ``num_messages_in_batch``
  (the client would split its undecoded bytes as a batch), ``0 <= chunk_id <
  num_chunks_from_msg <= CHUNKS_MAX`` and a payload of at most ``total_chunk_msg_size
  <= CHUNKED_MESSAGE_BYTES_MAX`` bytes. How the chunks of one message fit together is
  ``api.wire.chunk_door``'s. A SEND whose checksum failed is not looked at (it is
  refused as damaged already).
"""

from __future__ import annotations

import re
import struct
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtobufMessage

from api.broker.errors import BrokerError, InvalidTopicNameError, NotAllowedError
from api.broker.topic_name import TopicName, parse_namespace
from api.wire.frames import Frame
from message.compression import UNCOMPRESSED_BYTES_MAX
from message.entry import (
    check_slot_count,
    decoded_payload,
    is_batch,
    is_encrypted,
    parse_entry,
    read_slot,
)
from message.errors import MalformedEntryError, UndecodablePayloadError
from message.proto import pulsar_api_pb2 as pb

__all__ = ["CHUNKED_MESSAGE_BYTES_MAX", "CHUNKS_MAX", "SIGNED_64_MAX", "TIME_MS_MAX", "entry_problem",
           "frame_problem"]

SIGNED_64_MAX = (1 << 63) - 1
"""Largest value a wire ``uint64`` may carry into signed 64-bit broker state."""
TIME_MS_MAX = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, the last millisecond Python's ``datetime`` represents; a
stored time (ms since the epoch) above it fails whatever formats or compares it as a date."""
CHUNKS_MAX = 100_000
"""Most chunks of one chunked message: the real client reserves room for each chunk's id
when the first chunk comes (5 MiB chunks of a 64 MiB message are 13)."""
CHUNKED_MESSAGE_BYTES_MAX = UNCOMPRESSED_BYTES_MAX
"""Largest ``total_chunk_msg_size``: the real client allocates that much at the first
chunk, and the broker decodes the whole at the last (``api.wire.chunk_door``)."""
_U64_MAX = (1 << 64) - 1  # the -1 sentinel of a message id
_U32 = struct.Struct(">I")
_T = pb.BaseCommand
_MESSAGE_ID = pb.MessageIdData.DESCRIPTOR.full_name
_SIGNED_FIELDS = {
    (pb.CommandSend.DESCRIPTOR.full_name, "sequence_id"),
    (pb.CommandSend.DESCRIPTOR.full_name, "highest_sequence_id"),
    (pb.CommandSeek.DESCRIPTOR.full_name, "message_publish_time"),
    (pb.CommandProducer.DESCRIPTOR.full_name, "topic_epoch"),
}
"""``uint64`` fields whose value the broker keeps as a signed 64-bit integer."""


def _topic(value: str) -> BrokerError | None:
    try:
        TopicName.parse(value)
    except BrokerError as error:
        return error
    return None


def _namespace(value: str) -> BrokerError | None:
    try:
        parse_namespace(value)
    except BrokerError as error:
        return error
    return None


def _name(what: str, *, allow_empty: bool = True) -> Callable[[str], BrokerError | None]:
    def check(value: str) -> BrokerError | None:
        if not value and not allow_empty:
            return NotAllowedError(f"the {what} must not be empty")
        if any(unicodedata.category(char) == "Cc" for char in value):
            return NotAllowedError(f"invalid {what} {value!r}: control characters are not allowed")
        return None
    return check


_TEXT_CHECKS: dict[tuple[str, str], Callable[[str], BrokerError | None]] = {
    (pb.CommandLookupTopic.DESCRIPTOR.full_name, "topic"): _topic,
    (pb.CommandPartitionedTopicMetadata.DESCRIPTOR.full_name, "topic"): _topic,
    (pb.CommandProducer.DESCRIPTOR.full_name, "topic"): _topic,
    (pb.CommandSubscribe.DESCRIPTOR.full_name, "topic"): _topic,
    (pb.CommandGetTopicsOfNamespace.DESCRIPTOR.full_name, "namespace"): _namespace,
    (pb.CommandSubscribe.DESCRIPTOR.full_name, "subscription"): _name("subscription name", allow_empty=False),
    (pb.CommandSubscribe.DESCRIPTOR.full_name, "consumer_name"): _name("consumer name"),
    (pb.CommandProducer.DESCRIPTOR.full_name, "producer_name"): _name("producer name"),
}
"""Strings that name something, with the check each name must pass."""
_SECRET_FIELDS = frozenset((message.DESCRIPTOR.full_name, "original_auth_data") for message in (
    pb.CommandConnect, pb.CommandPartitionedTopicMetadata, pb.CommandLookupTopic))
"""Strings that carry credentials: an error about one never shows its value."""
_TOPIC_FIELDS = frozenset(key for key, check in _TEXT_CHECKS.items() if check in (_topic, _namespace))


def frame_problem(frame: Frame) -> BrokerError | None:
    """Why ``frame`` must be refused before its handler runs, or None when it may run."""
    command = frame.command
    fast = _FAST_CHECKS.get(command.type)
    if fast is not None:
        problem = fast(command)
    else:
        field = command.DESCRIPTOR.fields_by_number[command.type]
        problem = message_problem(getattr(command, field.name))
    if problem is None and command.type == _T.SEND and frame.entry is not None and frame.checksum_ok:
        problem = entry_problem(frame.entry)
    return problem


# -- the hot commands, checked without walking every field ----------------------------
# ``message_problem`` finds each set value through ``ListFields`` at every depth, which
# costs more than handling an ACK or a FLOW. For the commands every message passes
# through, these apply the same rules to the only fields that can break them (they carry
# no string and no signed field but those named); a command with anything else in it
# (properties, a chunk's first id) goes through ``message_problem``.


def _message_id_problem(message_id: pb.MessageIdData) -> BrokerError | None:
    for name, value in (("ledgerId", message_id.ledgerId), ("entryId", message_id.entryId)):
        if SIGNED_64_MAX < value < _U64_MAX:
            return NotAllowedError(f"message id {name} {value} is out of range")
    return None


def _ack_problem(command: pb.BaseCommand) -> BrokerError | None:
    ack = command.ack
    if len(ack.properties):
        return message_problem(ack)
    for message_id in ack.message_id:
        if message_id.HasField("first_chunk_message_id"):
            return message_problem(ack)
        problem = _message_id_problem(message_id)
        if problem is not None:
            return problem
    return None


def _send_problem(command: pb.BaseCommand) -> BrokerError | None:
    send = command.send
    for name, value in (("sequence_id", send.sequence_id), ("highest_sequence_id", send.highest_sequence_id)):
        if value > SIGNED_64_MAX:
            return NotAllowedError(f"{name} {value} is above {SIGNED_64_MAX}")
    return message_problem(send) if send.HasField("message_id") else None


_FAST_CHECKS: dict[int, Callable[[pb.BaseCommand], BrokerError | None]] = {
    _T.ACK: _ack_problem,
    _T.FLOW: lambda command: None,  # two integers, both unsigned in broker state
    _T.SEND: _send_problem,
    _T.PING: lambda command: None,
    _T.PONG: lambda command: None,
}


def message_problem(message: ProtobufMessage) -> BrokerError | None:
    """The first string, name or integer of ``message`` (at any depth) that breaks the
    rules of the module docstring, as the error to answer; None when all pass."""
    for owner, field, value in _set_values(message):
        key = (owner.DESCRIPTOR.full_name, field.name)
        if field.type == FieldDescriptor.TYPE_STRING:
            problem = _text_problem(key, value)
        elif key in _SIGNED_FIELDS and value > SIGNED_64_MAX:
            problem = NotAllowedError(f"{field.name} {value} is above {SIGNED_64_MAX}")
        elif owner.DESCRIPTOR.full_name == _MESSAGE_ID and field.name in ("ledgerId", "entryId") \
                and SIGNED_64_MAX < value < _U64_MAX:
            problem = NotAllowedError(f"message id {field.name} {value} is out of range")
        else:
            problem = None
        if problem is not None:
            return problem
    return None


def _text_problem(key: tuple[str, str], value: object) -> BrokerError | None:
    if not isinstance(value, str):  # upb: a proto2 string that is not UTF-8 comes as bytes
        error_type = InvalidTopicNameError if key in _TOPIC_FIELDS else NotAllowedError
        shown = "(a secret, not shown)" if key in _SECRET_FIELDS else repr(value)  # api.auth: never logged
        return error_type(f"{key[1]} {shown} is not valid UTF-8")
    check = _TEXT_CHECKS.get(key)
    return check(value) if check is not None else None


def _set_values(message: ProtobufMessage) -> Iterator[tuple[ProtobufMessage, FieldDescriptor, Any]]:
    """Every set scalar of ``message`` and its sub-messages, depth first, with its owner."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else (value,)
        for item in values:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                yield from _set_values(item)
            else:
                yield message, field, item


def entry_problem(entry: bytes) -> BrokerError | None:
    """Why a SEND's ``entry`` (metadataSize · metadata · payload) must not be stored, or
    None; see "A SEND's entry decodes" in the module docstring."""
    try:
        parsed = parse_entry(entry)
    except MalformedEntryError as error:
        return NotAllowedError(f"the message does not decode: {error}")
    metadata = parsed.metadata
    problem = _metadata_text_problem(metadata)
    if problem is not None:
        return problem
    for name in ("sequence_id", "highest_sequence_id"):
        if getattr(metadata, name) > SIGNED_64_MAX:
            return NotAllowedError(f"message {name} {getattr(metadata, name)} is above {SIGNED_64_MAX}")
    for name in ("publish_time", "event_time", "deliver_at_time"):
        value = getattr(metadata, name)
        if not 0 <= value <= TIME_MS_MAX:
            return NotAllowedError(f"message {name} {value} is outside 0..{TIME_MS_MAX} (ms)")
    if metadata.num_chunks_from_msg > 1:
        return _chunk_problem(metadata, len(parsed.payload))
    if is_encrypted(metadata):
        return None  # sealed: nothing to open here
    try:
        body = decoded_payload(parsed)
        if is_batch(metadata):
            _check_slots(body, metadata.num_messages_in_batch)
    except MalformedEntryError as error:  # UndecodablePayloadError is one
        return NotAllowedError(f"the message payload does not decode: {error}")
    return None


def _metadata_text_problem(metadata: pb.MessageMetadata) -> BrokerError | None:
    """The first string of ``metadata`` that is not valid UTF-8 (the real client's
    ``partition_key()`` and ``properties()`` raise on one), as the error; None when all are text."""
    for name in ("producer_name", "partition_key", "uuid", "replicated_from", "encryption_algo"):
        value = getattr(metadata, name)
        if not isinstance(value, str):
            return NotAllowedError(f"message {name} {value!r} is not valid UTF-8")
    if len(metadata.properties) or len(metadata.replicate_to) or len(metadata.encryption_keys):
        return message_problem(metadata)
    return None


def _chunk_problem(metadata: pb.MessageMetadata, payload_bytes: int) -> BrokerError | None:
    """Why one chunk (``num_chunks_from_msg`` > 1) must be refused on its own, or None."""
    chunks, chunk_id, total = metadata.num_chunks_from_msg, metadata.chunk_id, metadata.total_chunk_msg_size
    if is_batch(metadata):
        return NotAllowedError("a chunk of a chunked message cannot be a batch")
    if not metadata.uuid:
        return NotAllowedError("a chunk of a chunked message has no uuid")
    if chunks > CHUNKS_MAX:
        return NotAllowedError(f"num_chunks_from_msg {chunks} is above {CHUNKS_MAX}")
    if not 0 <= chunk_id < chunks:
        return NotAllowedError(f"chunk_id {chunk_id} is outside 0..{chunks - 1}")
    if not payload_bytes <= total <= CHUNKED_MESSAGE_BYTES_MAX:
        return NotAllowedError(f"total_chunk_msg_size {total} is outside {payload_bytes}..{CHUNKED_MESSAGE_BYTES_MAX}"
                               f" (the chunk holds {payload_bytes} bytes)")
    return None


def _check_slots(body: bytes, count: int) -> None:
    """Raise ``UndecodablePayloadError`` unless ``body`` holds ``count`` well-formed slots.

    Every slot of every batch a producer sends passes here, so the walk is kept lean
    (one reused ``SingleMessageMetadata``, parsed from a view of the body, no copies); at
    the first slot that looks wrong it goes over the body again with ``read_slot``,
    which says exactly what is wrong (the same rules, the same errors)."""
    check_slot_count(body, count)
    if not _slots_fit(body, count):
        single = pb.SingleMessageMetadata()
        position = 0
        for batch_index in range(count):
            position = read_slot(body, position, batch_index, single)
            if not _slot_values_fit(single):
                raise UndecodablePayloadError(
                    f"slot {batch_index}: sequence_id {single.sequence_id} or event_time {single.event_time}"
                    f" is out of range, or a key or property is not valid UTF-8")


def _slot_values_fit(single: pb.SingleMessageMetadata) -> bool:
    """A slot's integers fit what they feed and its strings are text (see the module docstring)."""
    if single.sequence_id > SIGNED_64_MAX or single.event_time > TIME_MS_MAX:
        return False
    if not isinstance(single.partition_key, str):
        return False
    return not len(single.properties) or all(
        isinstance(pair.key, str) and isinstance(pair.value, str) for pair in single.properties)


def _slots_fit(body: bytes, count: int) -> bool:
    """True when ``body`` holds ``count`` slots whose metadata parse, are initialised and
    whose payloads fit (``read_slot``'s rules); False at the first doubt."""
    position, left = 0, count
    if count >= _ALIKE_SLOTS_MIN:
        for _ in range(_ALIKE_RUNS_MAX):
            run, stride = _alike_run(body, position, left)
            if not run:
                break
            position, left = position + run * stride, left - run
            if not left:
                return True
    return _walked_slots_fit(body, left, position)


def _walked_slots_fit(body: bytes, count: int, position: int = 0) -> bool:
    """``_slots_fit`` slot by slot from ``position``: each slot's metadata parsed from a
    view of the body."""
    single = pb.SingleMessageMetadata()
    parse, initialized, unpack = single.ParseFromString, single.IsInitialized, _U32.unpack_from
    view, size = memoryview(body), len(body)
    try:
        for _ in range(count):
            start = position + 4
            if start > size:
                return False
            end = start + unpack(body, position)[0]
            if end > size:
                return False
            parse(view[start:end])  # type: ignore[arg-type]  # upb reads any buffer
            payload_size: int = single.payload_size
            if not initialized() or payload_size < 0 or not _slot_values_fit(single):
                return False
            position = end + payload_size
            if position > size:
                return False
    except (DecodeError, UnicodeDecodeError):
        return False
    finally:
        view.release()
    return True


# -- batches whose slots are laid out alike ---------------------------------------------
# A producer that sends values of one size writes every slot of a batch with the same
# bytes but for its sequence id (and event time): ``u32 size · SingleMessageMetadata ·
# payload`` at a fixed stride. Then the slots need not be walked one by one: the first
# slot is parsed as ``read_slot`` parses it, and the bytes every other slot must share
# with it are compared column by column (byte j of every slot, ``body[j::stride]``) in C.
# Where a sequence id's varint grows a byte (at 128, 16,384, ...) the layout changes: a
# new run starts there. Any other layout (values of different sizes, keys, properties)
# is walked.

_ALIKE_SLOTS_MIN = 8
"""Fewer slots are walked: the column check costs about as much as walking a few."""
_ALIKE_RUNS_MAX = 4
"""Runs of alike slots looked for in one batch before the rest is walked."""
_ALIKE_HEAD_BYTES_MAX = 64
"""Slots whose size field and metadata are longer than this are walked."""
_VARYING_FIELDS = {5: 6, 8: 9}
"""``SingleMessageMetadata`` fields that may differ from slot to slot, all ``uint64``
varints (event_time, sequence_id): any varint value of a given length parses as every
other. Each with the longest varint that may vary, in bytes: any 9-byte value is below
2**63 (``SIGNED_64_MAX``), any 6-byte one below 2**42 ms (year 2109, below
``TIME_MS_MAX``); a longer one must be the same in every slot (its value is checked once)."""
_HIGH_BYTE = re.compile(b"[\x80-\xff]")
_LOW_BYTE = re.compile(b"[\x00-\x7f]")
_MORE, _LAST = 1, 2  # a varint byte that has a successor / that ends the varint


def _alike_slots_fit(body: bytes, count: int) -> bool:
    """True when the ``count`` slots at the start of ``body`` are one run of alike slots
    (see ``_alike_run``): ``read_slot`` accepts every one of them."""
    return _alike_run(body, 0, count)[0] == count


def _alike_run(body: bytes, start: int, count: int) -> tuple[int, int]:
    """``(slots, stride)``: how many of the ``count`` slots from ``start`` have the layout
    of the first of them, each of which ``read_slot`` accepts: the same size field, the
    same metadata bytes but inside the values of ``_VARYING_FIELDS`` (whose varints keep
    their length), hence the same ``payload_size``, at a stride of ``4 + size +
    payload_size``; ``(0, 0)`` when the first is not such a slot (walk it)."""
    size = len(body)
    if start + 4 > size:
        return 0, 0
    head = 4 + _U32.unpack_from(body, start)[0]
    if head > min(size - start, _ALIKE_HEAD_BYTES_MAX):
        return 0, 0
    single = pb.SingleMessageMetadata()
    try:
        single.ParseFromString(body[start + 4 : start + head])
    except (DecodeError, UnicodeDecodeError):
        return 0, 0
    payload_size: int = single.payload_size
    if not single.IsInitialized() or payload_size < 0 or not _slot_values_fit(single):
        return 0, 0
    stride = head + payload_size
    kinds = _varying_bytes(body, start + 4, start + head)
    slots = min(count, (size - start) // stride)
    if kinds is None or not slots:
        return 0, 0
    span = (slots - 1) * stride + 1
    for offset in range(start, start + head):
        column = body[offset : offset + span : stride]
        kind = kinds.get(offset)
        if kind is None:
            slots -= len(column.lstrip(column[:1]))  # column[0] is the first slot's byte
        else:
            bad = (_HIGH_BYTE if kind == _LAST else _LOW_BYTE).search(column)
            slots = slots if bad is None else min(slots, bad.start())
        span = (slots - 1) * stride + 1
    return slots, stride


def _varying_bytes(body: bytes, start: int, end: int) -> dict[int, int] | None:
    """The offsets of ``body[start:end]`` (one ``SingleMessageMetadata`` that parses) that
    are bytes of a ``_VARYING_FIELDS`` varint, each ``_MORE`` or ``_LAST``; None for a
    layout this does not follow (a tag of more than one byte, a group)."""
    kinds: dict[int, int] = {}
    position = start
    while position < end:
        tag = body[position]
        if tag >= 0x80:
            return None
        position += 1
        wire_type = tag & 7
        if wire_type in (0, 2):
            varint_end = position
            while varint_end < end and body[varint_end] >= 0x80:
                varint_end += 1
            if varint_end >= end:
                return None
            varint_end += 1
            if wire_type == 0:
                if varint_end - position <= _VARYING_FIELDS.get(tag >> 3, 0):
                    kinds.update(dict.fromkeys(range(position, varint_end - 1), _MORE))
                    kinds[varint_end - 1] = _LAST
                position = varint_end
            else:
                length = 0
                for shift, byte in enumerate(body[position:varint_end]):
                    length |= (byte & 0x7F) << (7 * shift)
                position = varint_end + length
        elif wire_type in (1, 5):
            position += 8 if wire_type == 1 else 4
        else:
            return None
    return kinds if position == end else None
