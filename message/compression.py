"""The payload codecs of Pulsar messages: NONE, LZ4, ZLIB, ZSTD and SNAPPY.

A producer compresses a whole entry payload at once (for a batch: the whole batch body)
and records the codec and the size before compression in ``MessageMetadata.compression``
and ``MessageMetadata.uncompressed_size``. Each codec's bytes are exactly what the Pulsar
clients (C++ core and Java) write and read:

=========  =============================================================================
Codec      Bytes on the wire and on disk
=========  =============================================================================
NONE (0)   the payload itself
LZ4 (1)    one raw LZ4 *block*: no frame, no size prefix; the size comes from
           ``uncompressed_size``
ZLIB (2)   one zlib stream (RFC 1950: 2-byte header, deflate data, Adler-32)
ZSTD (3)   one zstd frame (with or without the content size in its header)
SNAPPY (4) one raw snappy block (varint length, then elements); no framing format
=========  =============================================================================

``decompress`` checks that the result is exactly ``uncompressed_size`` bytes (the clients'
``UncompressedSizeCorruption``) and never allocates more than ``UNCOMPRESSED_BYTES_MAX``.
Every failure of a codec library is raised as ``MalformedEntryError``, never as the
library's own exception, so callers handle one error type.
"""

from __future__ import annotations

import threading
import zlib

import lz4.block
import snappy
import zstandard

from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

__all__ = ["UNCOMPRESSED_BYTES_MAX", "compress", "decompress"]

UNCOMPRESSED_BYTES_MAX = 64 * 1024 * 1024
"""Largest payload ``decompress`` will produce. The clients' default maximum message size is
5 MB and larger messages are chunked, so a real batch body is far below this; the limit
only stops a corrupt or hostile ``uncompressed_size`` from allocating unbounded memory."""

_ZLIB_LEVEL = 6
"""zlib's own default level, as the Java and C++ clients use it."""

_COMPRESSING_CODECS = frozenset({pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY})

_CODEC_ERRORS: tuple[type[BaseException], ...] = (
    zlib.error,
    zstandard.ZstdError,
    lz4.block.LZ4BlockError,
    snappy.UncompressError,
    ValueError,
    MemoryError,
)
"""What the codec libraries raise on corrupt input; translated to MalformedEntryError."""


_thread_state = threading.local()
"""Per-thread codec objects (``_zstd_decompressor``)."""


def compress(codec: int, data: bytes) -> bytes:
    """Compress ``data`` with ``codec`` (a ``CompressionType`` value) as a producer would.

    Raises ``ValueError`` for a codec number this module does not know: choosing the codec
    is the caller's decision, not something read from an entry.
    """
    if codec == pb.NONE:
        return bytes(data)
    if codec == pb.LZ4:
        return bytes(lz4.block.compress(data, store_size=False))
    if codec == pb.ZLIB:
        return zlib.compress(data, _ZLIB_LEVEL)
    if codec == pb.ZSTD:
        return bytes(zstandard.ZstdCompressor().compress(data))
    if codec == pb.SNAPPY:
        return bytes(snappy.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes, uncompressed_size: int) -> bytes:
    """Undo ``compress``: return exactly ``uncompressed_size`` bytes.

    For NONE the data is returned as is and ``uncompressed_size`` is not checked (the
    clients do not check it either). Raises ``MalformedEntryError`` when the codec is
    unknown, the size is negative or above ``UNCOMPRESSED_BYTES_MAX``, the data is corrupt,
    or it does not decompress to exactly ``uncompressed_size`` bytes.
    """
    if codec == pb.NONE:
        return bytes(data)
    if codec not in _COMPRESSING_CODECS:
        raise MalformedEntryError(f"unknown compression codec {codec}")
    if not 0 <= uncompressed_size <= UNCOMPRESSED_BYTES_MAX:
        raise MalformedEntryError(
            f"uncompressed_size {uncompressed_size} is outside 0..{UNCOMPRESSED_BYTES_MAX}"
        )
    try:
        result = _decompress_codec(codec, data, uncompressed_size)
    except _CODEC_ERRORS as error:
        name = pb.CompressionType.Name(codec)
        raise MalformedEntryError(f"{name} payload does not decompress: {error}") from error
    if len(result) != uncompressed_size:
        raise MalformedEntryError(
            f"{pb.CompressionType.Name(codec)} payload decompressed to {len(result)} bytes,"
            f" metadata says uncompressed_size={uncompressed_size}"
        )
    return result


def _decompress_codec(codec: int, data: bytes, uncompressed_size: int) -> bytes:
    """One codec's decompression, bounded by ``uncompressed_size``; library errors escape."""
    if codec == pb.LZ4:
        return bytes(lz4.block.decompress(data, uncompressed_size=uncompressed_size))
    if codec == pb.ZLIB:
        decompressor = zlib.decompressobj()
        result = decompressor.decompress(data, uncompressed_size)
        if not decompressor.eof or decompressor.unconsumed_tail or decompressor.unused_data:
            raise ValueError("zlib stream is truncated or longer than uncompressed_size")
        return result
    if codec == pb.ZSTD:
        # A frame may declare its content size; refuse a declaration that disagrees before
        # the library allocates it.
        declared = zstandard.frame_content_size(data)
        if declared not in (-1, uncompressed_size):
            raise ValueError(f"zstd frame declares {declared} bytes")
        output_bytes_max = max(uncompressed_size, 1)  # zstandard reads 0 as "no limit"
        result = _zstd_decompressor().decompress(data, max_output_size=output_bytes_max)
        return bytes(result)
    if codec == pb.SNAPPY:
        # A raw snappy block starts with its uncompressed length; check it before allocating.
        declared = _snappy_declared_length(data)
        if declared != uncompressed_size:
            raise ValueError(f"snappy block declares {declared} bytes")
        return bytes(snappy.uncompress(data))
    raise AssertionError(f"decompress checked codec {codec} first")


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's zstd decompressor.

    Creating one costs more than decompressing a small message, and the compaction phases
    decompress every message; an instance must not be used by two threads at once, and
    each ``decompress`` call starts afresh (the library resets the context first, even
    after a failed call).
    """
    decompressor: zstandard.ZstdDecompressor | None = getattr(_thread_state, "zstd", None)
    if decompressor is None:
        decompressor = _thread_state.zstd = zstandard.ZstdDecompressor()
    return decompressor


_SNAPPY_LENGTH_BYTES_MAX = 5
"""A 32-bit length takes at most 5 varint bytes; snappy blocks never declare more."""


def _snappy_declared_length(data: bytes) -> int:
    """The little-endian base-128 varint length that opens a raw snappy block."""
    length = 0
    for index, byte in enumerate(data[:_SNAPPY_LENGTH_BYTES_MAX]):
        length |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            return length
    raise ValueError("snappy block has no valid length prefix")
