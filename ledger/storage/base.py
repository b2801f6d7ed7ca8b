"""The one narrow seam between compactd and where ledger bytes live.

A ledger is an append-only sequence of opaque entries with one writer (BookKeeper's
model). ``LedgerStore`` is the whole contract every backend keeps:

* ``create(metadata)`` allocates a ledger id that is unique and larger than every id this
  store handed out before (ids are never reused, not even after ``delete``), and records
  the custom metadata, which never changes afterwards. With ``durable_at_seal=True`` (for
  a ledger that is of use only sealed, such as a compacted ledger, referenced after its
  seal) appends are taken without a sync: their futures resolve at once, the store writes
  them in large blocks, ``last_add_confirmed`` follows what is written, a write failure
  surfaces as ``LedgerIOError`` from a later append or from ``close``, and only ``close``
  makes them durable.
* ``append(ledger_id, data)`` assigns the next dense ``entry_id`` (0, 1, 2, …) at once and
  returns a future that resolves to that id **only once the entry is durable** under the
  store's sync policy; futures of one ledger resolve in append order. On a write or sync
  failure the future fails with ``LedgerIOError`` and the ledger refuses further appends.
* ``last_add_confirmed(ledger_id)`` is the highest entry id whose append is durable and
  whose predecessors are too; ``-1`` when there is none. Reads never go past it.
* ``read(ledger_id, first_entry_id, last_entry_id)`` returns entries in that inclusive
  range; the range must lie inside ``0..last_add_confirmed``.
* ``close(ledger_id)`` seals the ledger: every pending append is made durable first, then
  the ledger is immutable forever. Closing a sealed ledger is a no-op. A ledger fenced by
  a failed write is sealed at its ``last_add_confirmed`` (BookKeeper's recovery close):
  its failed appends are gone for good. If the seal itself cannot be written, close raises
  ``LedgerIOError`` and may be called again later.
* ``delete(ledger_id)`` removes a ledger; deleting a missing one is a no-op (Pulsar treats
  "no such ledger" as success).
* ``list()`` returns the ids of every ledger, ascending; ``info(ledger_id)`` its state.
* ``file_powers()`` names what the store offers beyond these methods: its
  ``LedgerFiles`` (``ledger.storage.powers``: the directory, reserved ids, adopting a
  ledger written elsewhere, confirmed lengths) when it keeps ledger files others may
  open, else ``None``. It is the one way to ask: nobody probes a store's type or
  attributes.

Wrappers (``FaultyLedgerStore``) compose around any backend; there is no subclass tree.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ledger.storage.powers import LedgerFiles

__all__ = ["LedgerInfo", "LedgerState", "LedgerStore", "SyncPolicy", "completed"]


class LedgerState(enum.Enum):
    """Lifecycle of one ledger: OPEN (appendable) → CLOSED (sealed, immutable)."""

    OPEN = "OPEN"
    CLOSED = "CLOSED"


class SyncPolicy(enum.Enum):
    """When an append counts as durable on a backend that writes files.

    * ``ALWAYS``: every append is fsynced before ``append`` returns.
    * ``GROUP``: a flusher thread syncs everything pending at once (group commit); the
      append's future resolves after that sync.
    * ``NONE``: resolved once written to the OS; for tests and benchmarks only.
    """

    ALWAYS = "always"
    GROUP = "group"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """What a store knows about one ledger.

    Attributes:
        ledger_id: the ledger's id, unique in the store.
        state: OPEN or CLOSED.
        last_add_confirmed: highest durable entry id, ``-1`` when empty.
        size_bytes: total payload bytes of the confirmed entries.
        created_at_ms: creation time, ms since the epoch.
        metadata: custom metadata given at creation (string → string), never changed.
    """

    ledger_id: int
    state: LedgerState
    last_add_confirmed: int
    size_bytes: int
    created_at_ms: int
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def entries(self) -> int:
        """Number of confirmed entries (``last_add_confirmed + 1``)."""
        return self.last_add_confirmed + 1

    @property
    def sealed(self) -> bool:
        """True once the ledger is closed."""
        return self.state is LedgerState.CLOSED


@runtime_checkable
class LedgerStore(Protocol):
    """The ledger storage seam; see the module docstring for each method's contract."""

    def create(self, metadata: Mapping[str, str] | None = None, *, durable_at_seal: bool = False) -> int: ...

    def append(self, ledger_id: int, data: bytes) -> Future[int]: ...

    def last_add_confirmed(self, ledger_id: int) -> int: ...

    def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> Sequence[bytes]: ...

    def close(self, ledger_id: int) -> None: ...

    def delete(self, ledger_id: int) -> None: ...

    def list(self) -> list[int]: ...

    def info(self, ledger_id: int) -> LedgerInfo: ...

    def file_powers(self) -> LedgerFiles | None:
        """The store's ledger-file powers (``ledger.storage.powers``), or ``None``."""
        ...

    def shutdown(self) -> None:
        """Make every pending append durable (or fail it back) and release resources."""
        ...


def completed(value: int) -> Future[int]:
    """A future that is already resolved to ``value``."""
    future: Future[int] = Future()
    future.set_result(value)
    return future
