from __future__ import annotations

import zlib

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from message.compression import UNCOMPRESSED_BYTES_MAX, compress, decompress
from message.errors import MalformedEntryError
from message.proto import pulsar_api_pb2 as pb

CODECS = [pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY]
COMPRESSING = [pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY]


@pytest.mark.parametrize("codec", CODECS)
@given(data=st.binary(max_size=4096) | st.builds(lambda n: b"ab" * n, st.integers(0, 5000)))
def test_round_trip(codec: int, data: bytes) -> None:
    assert decompress(codec, compress(codec, data), len(data)) == data


@pytest.mark.parametrize(
    ("codec", "stored", "value"),
    [
        # Hand-built vectors of the raw formats the clients write, independent of the
        # libraries' own compressors.
        (pb.LZ4, b"\x50hello", b"hello"),  # one LZ4 block: token 5 literals, no match
        (pb.SNAPPY, b"\x05\x10hello", b"hello"),  # varint length 5, one 5-byte literal
        (pb.ZLIB, zlib.compress(b"hello"), b"hello"),  # RFC 1950 stream
        (pb.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(b"hello"), b"hello"),
    ],
)
def test_decompresses_the_raw_formats(codec: int, stored: bytes, value: bytes) -> None:
    assert decompress(codec, stored, len(value)) == value


def test_compressed_forms_carry_no_framing() -> None:
    assert not compress(pb.LZ4, b"x" * 100).startswith(b"\x04\x22\x4d\x18")  # no LZ4 frame
    assert compress(pb.SNAPPY, b"x" * 100)[0] == 100  # raw: starts with the varint length
    assert compress(pb.ZLIB, b"x")[0] == 0x78  # zlib header, not raw deflate or gzip
    assert compress(pb.ZSTD, b"x").startswith(b"\x28\xb5\x2f\xfd")


def test_none_returns_the_payload_and_ignores_the_size() -> None:
    assert decompress(pb.NONE, b"abc", 0) == b"abc"


@pytest.mark.parametrize("codec", COMPRESSING)
def test_wrong_size_is_malformed(codec: int) -> None:
    stored = compress(codec, b"hello world")
    for size in (0, 5, 12):
        with pytest.raises(MalformedEntryError):
            decompress(codec, stored, size)


@pytest.mark.parametrize("codec", COMPRESSING)
@pytest.mark.parametrize("garbage", [b"", b"\xff", b"\xff" * 40, b"\x00\x01\x02\x03"])
def test_corrupt_data_is_malformed(codec: int, garbage: bytes) -> None:
    with pytest.raises(MalformedEntryError):
        decompress(codec, garbage, 11)


@pytest.mark.parametrize("codec", COMPRESSING)
def test_truncated_data_is_malformed(codec: int) -> None:
    value = bytes(range(256)) * 8
    stored = compress(codec, value)
    with pytest.raises(MalformedEntryError):
        decompress(codec, stored[: len(stored) // 2], len(value))


def test_zlib_trailing_bytes_are_malformed() -> None:
    with pytest.raises(MalformedEntryError):
        decompress(pb.ZLIB, zlib.compress(b"hello") + b"extra", 5)


@pytest.mark.parametrize("codec", COMPRESSING)
def test_size_limit(codec: int) -> None:
    with pytest.raises(MalformedEntryError, match="outside"):
        decompress(codec, compress(codec, b"x"), UNCOMPRESSED_BYTES_MAX + 1)
    with pytest.raises(MalformedEntryError, match="outside"):
        decompress(codec, compress(codec, b"x"), -1)


def test_unknown_codec() -> None:
    with pytest.raises(MalformedEntryError, match="unknown"):
        decompress(9, b"abc", 3)
    with pytest.raises(ValueError, match="unknown"):
        compress(9, b"abc")


@pytest.mark.parametrize("codec", COMPRESSING)
def test_empty_value(codec: int) -> None:
    assert decompress(codec, compress(codec, b""), 0) == b""


@pytest.mark.parametrize("codec", COMPRESSING)
@given(garbage=st.binary(max_size=64), size=st.integers(0, 4096))
def test_fuzz_raises_only_malformed(codec: int, garbage: bytes, size: int) -> None:
    try:
        result = decompress(codec, garbage, size)
    except MalformedEntryError:
        return
    assert len(result) == size
