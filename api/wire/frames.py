"""Pulsar binary-protocol framing: bytes on a connection to and from ``BaseCommand``.

Every frame on a Pulsar connection is one protobuf ``BaseCommand``, optionally followed by
a message. All integers are big-endian unsigned 32-bit::

    frame          = u32:totalSize body                 totalSize = len(body)
    body           = u32:cmdSize BaseCommand(cmdSize bytes) [payload-part]
    payload-part   = [broker-entry] [checksum] entry    SEND and MESSAGE only, mandatory
    broker-entry   = 0x0e02 u32:size BrokerEntryMetadata(size bytes)   skipped, not parsed
    checksum       = 0x0e01 u32:crc32c                  CRC-32C (Castagnoli, seed 0) of entry
    entry          = u32:metadataSize MessageMetadata(metadataSize bytes) payload

``entry`` is what the broker stores verbatim and replays in MESSAGE frames; the layout
inside it is ``message/entry.py``'s, and parsing it is compaction's job, not this
module's. The codec only checks the entry's outer shape: at least 4 bytes, and a
metadataSize of 1 or more that fits in what follows it (an empty MessageMetadata cannot
carry its required fields). The magics are unambiguous because a metadataSize starting
with 0x0e01 or 0x0e02 would exceed any frame this codec accepts.

**BaseCommand rules** (the Java broker and the C++ client check the same): the bytes parse,
every ``required`` field is present at every depth, ``type`` is a value this build knows,
and exactly one sub-message is set, the one whose field number equals ``type`` (an empty
PING still carries an empty ``ping``). SEND and MESSAGE must carry a payload-part; every
other command must end exactly where its BaseCommand ends (totalSize = 4 + cmdSize).

**Size rule.** A frame is measured whole, its 4-byte totalSize included (as Netty's length
decoder does in Pulsar's broker): ``4 + totalSize <= max_frame_bytes``. The default
``FRAME_BYTES_MAX`` is ``MESSAGE_BYTES_MAX`` (``message.entry``: 5 MiB, Pulsar's default maxMessageSize) plus
``FRAME_PADDING_BYTES`` (10 KiB, Pulsar's MESSAGE_SIZE_FRAME_PADDING) for the length
fields, the command and the checksum. The broker advertises ``MESSAGE_BYTES_MAX``, not
``FRAME_BYTES_MAX``, as CONNECTED.max_message_size: clients hold an entry
(metadata + payload) to that limit, and the padding keeps the whole frame within ours.

**Errors.** ``FrameError`` means the byte stream cannot be trusted any further and the
connection must close: garbage, an oversized or undersized length prefix, a cmdSize that
overruns its frame, a BaseCommand that breaks the rules above, a payload-part too short for
its checksum or metadataSize. A *checksum mismatch* is not a FrameError: the frame
boundaries are intact, so the frame is returned with ``checksum_ok=False`` and the
connection answers SEND_ERROR(ChecksumError) and carries on. The entry of such a frame is
not shape-checked (its bytes are known to be damaged), and must not be stored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c
from google.protobuf.message import Message as ProtobufMessage
from google.protobuf.unknown_fields import UnknownFieldSet

from ledger.errors import CompactionServiceError
from message.entry import BROKER_ENTRY_MAGIC, CHECKSUM_MAGIC, MESSAGE_BYTES_MAX, parse_proto
from message.proto import pulsar_api_pb2 as pb

__all__ = [
    "FRAME_BYTES_MAX",
    "FRAME_PADDING_BYTES",
    "MESSAGE_BYTES_MAX",
    "PAYLOAD_COMMAND_TYPES",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "encode_command",
    "encode_message",
    "encode_payload_command",
    "make_command",
]

FRAME_PADDING_BYTES: Final = 10 * 1024
"""Room in a frame beyond the entry: length fields, BaseCommand, checksum (Pulsar's
MESSAGE_SIZE_FRAME_PADDING)."""
FRAME_BYTES_MAX: Final = MESSAGE_BYTES_MAX + FRAME_PADDING_BYTES
"""Default largest frame, counted with its 4-byte totalSize prefix."""
PAYLOAD_COMMAND_TYPES: Final = frozenset({pb.BaseCommand.SEND, pb.BaseCommand.MESSAGE})
"""Command types followed by a payload-part (and only those)."""

_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">II")  # totalSize, cmdSize
_MAGIC_BLOCK_BYTES = 6  # a 2-byte magic and a u32
_FRAME_BYTES_LIMIT = int.from_bytes(CHECKSUM_MAGIC + b"\x00\x00", "big")
"""``max_frame_bytes`` stays below this so that no metadataSize can look like a magic."""
_COMPACT_AFTER_BYTES = 64 * 1024
_TYPE_FIELD = pb.BaseCommand.DESCRIPTOR.fields_by_name["type"]
_TYPE_NAMES = {number: name for name, number in pb.BaseCommand.Type.items()}
_SUB_MESSAGE_FIELDS = {
    field.number: field for field in pb.BaseCommand.DESCRIPTOR.fields if field.message_type
}
_FIELD_BY_MESSAGE = {
    field.message_type.full_name: field
    for field in _SUB_MESSAGE_FIELDS.values()
    if field.message_type is not None
}
assert len(_FIELD_BY_MESSAGE) == len(_SUB_MESSAGE_FIELDS), "a sub-message type is reused"
assert set(_SUB_MESSAGE_FIELDS) == set(_TYPE_NAMES), "every type has its own sub-message"


class FrameError(CompactionServiceError):
    """The peer sent bytes that are not a valid Pulsar frame; close the connection."""


@dataclass(frozen=True)
class Frame:
    """One decoded frame. Never mutate ``command``. Compares by value; not hashable."""

    command: pb.BaseCommand
    """The command, valid by the rules in the module docstring."""
    entry: bytes | None = None
    """SEND/MESSAGE only: ``metadataSize · MessageMetadata · payload``, after any
    broker-entry block and checksum; None for every other command."""
    checksum_ok: bool = True
    """False when the frame carried a 0x0e01 checksum that does not match ``entry``."""

    @property
    def type(self) -> pb.BaseCommand.Type:
        """Shorthand for ``command.type``."""
        return self.command.type


def make_command(body: ProtobufMessage) -> pb.BaseCommand:
    """A BaseCommand holding ``body`` (copied), its ``type`` inferred from the body's class.

    ``make_command(pb.CommandSuccess(request_id=1))`` is a SUCCESS command.
    """
    field = _FIELD_BY_MESSAGE.get(body.DESCRIPTOR.full_name)
    if field is None:
        raise TypeError(f"{body.DESCRIPTOR.full_name} is not a BaseCommand sub-message")
    command = pb.BaseCommand(type=_TYPE_NAMES[field.number])
    getattr(command, field.name).CopyFrom(body)
    return command


def encode_command(command: pb.BaseCommand) -> bytes:
    """The frame of a command without payload (anything but SEND and MESSAGE).

    Raises ``ValueError`` for a command that breaks the BaseCommand rules and protobuf's
    ``EncodeError`` when a required field is missing: both are bugs on our side.
    """
    _check_outgoing(command, payload=False)
    command_bytes = command.SerializeToString()
    return _HEADER.pack(4 + len(command_bytes), len(command_bytes)) + command_bytes


def encode_payload_command(
    command: pb.BaseCommand, entry: bytes, *, with_checksum: bool = True
) -> bytes:
    """The frame of a SEND or MESSAGE carrying ``entry`` (metadataSize · metadata · payload).

    ``with_checksum`` adds the 0x0e01 CRC32C of ``entry``; MESSAGE frames from the broker
    always carry it. The size is not checked here: the broker only replays entries it
    accepted under the same limit. Raises as ``encode_command`` does, and ``ValueError``
    when ``entry`` does not have the shape the decoder requires.
    """
    _check_outgoing(command, payload=True)
    entry = bytes(entry)
    problem = _entry_shape_problem(entry)
    if problem is not None:
        raise ValueError(problem)
    command_bytes = command.SerializeToString()
    checksum = CHECKSUM_MAGIC + _U32.pack(crc32c.crc32c(entry)) if with_checksum else b""
    total = 4 + len(command_bytes) + len(checksum) + len(entry)
    return b"".join((_HEADER.pack(total, len(command_bytes)), command_bytes, checksum, entry))


def encode_message(command: pb.BaseCommand, entry: bytes) -> bytes:
    """``encode_payload_command(command, entry)`` for a MESSAGE the broker built itself
    (``pb.BaseCommand(type=MESSAGE)`` with its ``message`` filled in place), the frame
    every dispatched entry becomes: it checks the type and that ``message`` is set, not
    the whole command's sub-messages (the rule holds by construction, and listing every
    field cost as much as the rest of the frame). Raises as ``encode_payload_command``."""
    if command.type != pb.BaseCommand.MESSAGE or not command.HasField("message"):
        raise ValueError("encode_message takes a MESSAGE command carrying its message")
    if type(entry) is not bytes:
        entry = bytes(entry)
    problem = _entry_shape_problem(entry)
    if problem is not None:
        raise ValueError(problem)
    command_bytes = command.SerializeToString()
    total = 4 + len(command_bytes) + _MAGIC_BLOCK_BYTES + len(entry)
    return b"".join((_HEADER.pack(total, len(command_bytes)), command_bytes, CHECKSUM_MAGIC,
                     _U32.pack(crc32c.crc32c(entry)), entry))


class FrameDecoder:
    """Incremental decoder for one connection's inbound byte stream.

    ``feed`` the bytes as they arrive; it returns every frame they complete and keeps the
    rest buffered. After a ``FrameError`` the decoder refuses further input (the stream
    has lost its framing); frames completed earlier in the failing call are dropped with
    it, since the connection closes anyway.
    """

    def __init__(self, max_frame_bytes: int = FRAME_BYTES_MAX) -> None:
        if not 8 < max_frame_bytes < _FRAME_BYTES_LIMIT:
            raise ValueError(
                f"max_frame_bytes {max_frame_bytes} outside 9..{_FRAME_BYTES_LIMIT - 1}"
            )
        self.max_frame_bytes: Final = max_frame_bytes
        self._buffer = bytearray()
        self._offset = 0  # bytes of _buffer already decoded
        self._failure: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame (non-zero at EOF: truncated)."""
        return len(self._buffer) - self._offset

    def release(self) -> None:
        """Drop what is buffered and refuse further input: the connection is gone.

        The buffer may hold megabytes of a partial frame, and a closed connection's
        protocol object can outlive it until the cyclic garbage collector runs; releasing
        here gives the memory back at once.
        """
        self._failure = FrameError("the connection is closed")
        self._buffer = bytearray()
        self._offset = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Append ``data``; return the frames now complete, in order.

        Raises ``FrameError`` as soon as the buffered bytes cannot be the start of a valid
        frame, without waiting for the rest of an oversized frame to arrive.
        """
        if self._failure is not None:
            raise FrameError(f"decoder already failed: {self._failure}")
        self._buffer += data
        try:
            frames = self._decode_available()
        except FrameError as error:
            self._failure = error
            self._buffer = bytearray()
            self._offset = 0
            raise
        if self._offset == len(self._buffer):
            self._buffer.clear()
            self._offset = 0
        elif self._offset >= _COMPACT_AFTER_BYTES:
            # Each byte moves at most once: bytes before it only complete in this call.
            del self._buffer[: self._offset]
            self._offset = 0
        return frames

    def _decode_available(self) -> list[Frame]:
        frames: list[Frame] = []
        buffer = self._buffer
        while True:
            start = self._offset
            available = len(buffer) - start
            if available < 4:
                return frames
            total_size: int = _U32.unpack_from(buffer, start)[0]
            if 4 + total_size > self.max_frame_bytes:
                raise FrameError(
                    f"frame of {4 + total_size} bytes exceeds the limit of {self.max_frame_bytes}"
                )
            if total_size < 4:
                raise FrameError(f"totalSize {total_size} cannot hold a cmdSize")
            if available < 8:
                return frames
            command_size: int = _U32.unpack_from(buffer, start + 4)[0]
            if command_size > total_size - 4:
                raise FrameError(
                    f"cmdSize {command_size} overruns a frame of totalSize {total_size}"
                )
            end = start + 4 + total_size
            if len(buffer) < end:
                return frames
            frames.append(_decode_frame(buffer, start + 8, command_size, end))
            self._offset = end


def _decode_frame(buffer: bytearray, command_start: int, command_size: int, end: int) -> Frame:
    """The complete frame whose BaseCommand starts at ``command_start`` in ``buffer``."""
    command_end = command_start + command_size
    command = _parse_command(bytes(buffer[command_start:command_end]))
    rest = end - command_end
    if command.type not in PAYLOAD_COMMAND_TYPES:
        if rest:
            raise FrameError(f"{_type_name(command.type)} is followed by {rest} stray bytes")
        return Frame(command)
    position = command_end
    if buffer[position : position + 2] == BROKER_ENTRY_MAGIC:
        position = _after_broker_entry(buffer, position, end)
    expected_checksum: int | None = None
    if buffer[position : position + 2] == CHECKSUM_MAGIC:
        if end - position < _MAGIC_BLOCK_BYTES:
            raise FrameError(f"{_type_name(command.type)} ends inside its checksum")
        expected_checksum = _U32.unpack_from(buffer, position + 2)[0]
        position += _MAGIC_BLOCK_BYTES
    with memoryview(buffer) as view:
        entry = view[position:end].tobytes()  # one copy (a bytearray slice would be a second)
    if expected_checksum is not None and crc32c.crc32c(entry) != expected_checksum:
        return Frame(command, entry, checksum_ok=False)
    problem = _entry_shape_problem(entry)
    if problem is not None:
        raise FrameError(f"{_type_name(command.type)}: {problem}")
    return Frame(command, entry)


def _after_broker_entry(buffer: bytearray, position: int, end: int) -> int:
    """Position after the 0x0e02 broker-entry block at ``position``."""
    if end - position < _MAGIC_BLOCK_BYTES:
        raise FrameError("frame ends inside its broker entry metadata header")
    size: int = _U32.unpack_from(buffer, position + 2)[0]
    after = position + _MAGIC_BLOCK_BYTES + size
    if after > end:
        raise FrameError(f"broker entry metadata of {size} bytes overruns its frame")
    return after


def _entry_shape_problem(entry: bytes) -> str | None:
    """Why ``entry`` is not ``metadataSize · metadata · payload``, or None when it is."""
    if len(entry) < 4:
        return f"payload of {len(entry)} bytes is too short for a metadataSize"
    metadata_size: int = _U32.unpack_from(entry, 0)[0]
    if metadata_size == 0:
        return "metadataSize is 0"
    if 4 + metadata_size > len(entry):
        return f"metadataSize {metadata_size} overruns a payload of {len(entry)} bytes"
    return None


def _parse_command(raw: bytes) -> pb.BaseCommand:
    """Parse and validate one BaseCommand, raising FrameError for anything off."""
    command = parse_proto(pb.BaseCommand, raw, FrameError, "BaseCommand")
    if not command.HasField("type"):
        unknown = _unknown_type_value(command)
        if unknown is not None:
            raise FrameError(f"unknown command type {unknown}")
    if not command.IsInitialized():
        missing = ", ".join(command.FindInitializationErrors())  # type: ignore[attr-defined]
        raise FrameError(f"BaseCommand lacks required fields: {missing}")
    problem = _sub_message_problem(command)
    if problem is not None:
        raise FrameError(problem)
    return command


def _unknown_type_value(command: pb.BaseCommand) -> int | None:
    """proto2 files an unknown enum value as an unknown field; the last one would win.

    Only a varint counts: field 1 with another wire type is a malformed field, not a type.
    """
    unknown = UnknownFieldSet(command)
    values = [
        field.data
        for field in (unknown[index] for index in range(len(unknown)))
        if field.field_number == _TYPE_FIELD.number and isinstance(field.data, int)
    ]
    return values[-1] if values else None


def _sub_message_problem(command: pb.BaseCommand) -> str | None:
    """Why the set sub-messages do not match ``type``, or None when exactly it is set."""
    name = _type_name(command.type)
    present = [field.number for field, _ in command.ListFields() if field.message_type]
    if present == [command.type]:
        return None
    expected = _SUB_MESSAGE_FIELDS[command.type].name
    if not present:
        return f"{name} command lacks its {expected} field"
    found = ", ".join(_SUB_MESSAGE_FIELDS[number].name for number in present)
    return f"{name} command must carry exactly its {expected} field, carries: {found}"


def _check_outgoing(command: pb.BaseCommand, *, payload: bool) -> None:
    if not command.HasField("type"):
        raise ValueError("BaseCommand has no type")
    problem = _sub_message_problem(command)
    if problem is not None:
        raise ValueError(problem)
    if (command.type in PAYLOAD_COMMAND_TYPES) != payload:
        name = _type_name(command.type)
        use = "encode_payload_command" if not payload else "encode_command"
        raise ValueError(f"{name} frames are written with {use}")


def _type_name(value: int) -> str:
    return _TYPE_NAMES.get(value, str(value))
