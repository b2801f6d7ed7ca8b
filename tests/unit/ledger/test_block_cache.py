"""``ledger.storage.byte_source``: a ranged read through the block cache returns exactly the
object's bytes at any offset and length, across block boundaries, and the cache never
holds more than its bound."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.storage.byte_source import BlockCache, ObjectSource

DATA = bytes((index * 7 + index // 251) % 256 for index in range(10_000))
BLOCK_BYTES = 512


@settings(max_examples=60, deadline=None)
@given(reads=st.lists(st.tuples(st.integers(0, len(DATA) + 100), st.integers(0, 3_000)), min_size=1, max_size=12),
       capacity_blocks=st.integers(0, 6))
def test_a_read_through_the_cache_is_the_objects_bytes_and_the_cache_stays_bounded(
    tmp_path_factory: object, reads: list[tuple[int, int]], capacity_blocks: int,
) -> None:
    path = Path(tmp_path_factory.mktemp("object")) / "object"  # type: ignore[attr-defined]
    path.write_bytes(DATA)
    cache = BlockCache(capacity_blocks * BLOCK_BYTES, block_bytes=BLOCK_BYTES)
    source = ObjectSource(pafs.LocalFileSystem().open_input_file(str(path)), str(path), len(DATA), cache)
    try:
        for offset, length in reads:
            assert source.pread(offset, length) == DATA[offset : offset + length]
            assert cache.used_bytes <= cache.capacity_bytes
        offset, length = reads[-1]
        stop = min(offset + length, len(DATA))
        spanned = (stop - 1) // BLOCK_BYTES - offset // BLOCK_BYTES + 1 if stop > offset else 0
        if 0 < spanned <= capacity_blocks:  # a read that fits the cache is served from it again
            misses = cache.misses
            assert source.pread(offset, length) == DATA[offset:stop]
            assert cache.misses == misses
    finally:
        source.close()
