"""The Pulsar binary protocol on the wire: framing of commands and payloads.

``frames`` turns a connection's bytes into validated ``BaseCommand`` frames and back; the
byte layout and the size rule are written out at the top of ``api/wire/frames.py``.
"""

from api.wire.frames import (
    FRAME_BYTES_MAX,
    FRAME_PADDING_BYTES,
    MESSAGE_BYTES_MAX,
    PAYLOAD_COMMAND_TYPES,
    Frame,
    FrameDecoder,
    FrameError,
    encode_command,
    encode_payload_command,
    make_command,
)

__all__ = [
    "FRAME_BYTES_MAX",
    "FRAME_PADDING_BYTES",
    "MESSAGE_BYTES_MAX",
    "PAYLOAD_COMMAND_TYPES",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "encode_command",
    "encode_payload_command",
    "make_command",
]
