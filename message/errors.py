"""The message format's errors, under the root that ``ledger.errors`` defines.

::

    CompactionServiceError (ledger.errors)   root of every error compactd raises on purpose
    └── MessageFormatError                   bytes that are not Pulsar's message format
        └── MalformedEntryError (ValueError) entry bytes that are not a valid Pulsar message
            └── UndecodablePayloadError      metadata parsed, but the payload (batch body or
                                             compressed value) cannot be decoded

The split matters to compaction: an entry whose metadata cannot be parsed has no key and
no batch count, while an ``UndecodablePayloadError`` entry still has both, and Pulsar's
compactor keeps such a batch whole instead of failing the run. Errors carry the entry's
position as attributes when the caller knows it (``ledger_id``, ``entry_id``); the codec
itself works on bytes and leaves them ``None``. ``compactor.errors`` re-exports the two
entry errors, so ``except compactor.errors.MalformedEntryError`` catches these very classes.
"""

from __future__ import annotations

from ledger.errors import CompactionServiceError

__all__ = ["MalformedEntryError", "MessageFormatError", "UndecodablePayloadError"]


class MessageFormatError(CompactionServiceError):
    """Bytes that do not follow Pulsar's message format."""


class MalformedEntryError(MessageFormatError, ValueError):
    """Entry bytes do not form a Pulsar message: bad framing, checksum or metadata.

    Never retriable: the same bytes fail the same way.
    """

    def __init__(
        self, message: str, *, ledger_id: int | None = None, entry_id: int | None = None
    ) -> None:
        super().__init__(message)
        self.ledger_id = ledger_id
        self.entry_id = entry_id


class UndecodablePayloadError(MalformedEntryError):
    """The metadata is valid but the payload cannot be decompressed or split into slots."""
