"""Pulsar's message format, on its own floor.

``entry`` (an entry's bytes: framing, checksum, metadata, batch slots, chunks, keys and
tombstones; the reference reader), ``encoder`` (writing the same format: entries, batches,
rewritten batches), ``compression`` (the codecs: LZ4, ZLIB, ZSTD, SNAPPY), ``errors``
(``MalformedEntryError``, ``UndecodablePayloadError``) and ``proto`` (compactd's protobuf
description of the Pulsar protocol and its generated code, shared with the wire layer).

This package imports nothing of compactd but ``ledger.errors`` (the root error class), and
neither numpy nor anything of the compactor: the wire layer decodes a frame without loading
the compactor (``tests/unit/message/test_floor.py``). Importing the package loads nothing.
"""
