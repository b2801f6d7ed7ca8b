"""In-memory ledger store: the reference backend for tests and agreement checks.

Same contract as every ``LedgerStore`` (see ``ledger.storage.base``); appends are durable
at once, so every future it returns is already resolved. Nothing survives the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ledger.errors import LedgerNotFoundError, LedgerSealedError, PositionOutOfRangeError
from ledger.storage.base import LedgerInfo, LedgerState, completed
from ledger.storage.powers import LedgerFiles

__all__ = ["MemoryLedgerStore"]


@dataclass
class _Ledger:
    metadata: dict[str, str]
    created_at_ms: int
    entries: list[bytes] = field(default_factory=list)
    size_bytes: int = 0
    sealed: bool = False


class MemoryLedgerStore:
    """A ``LedgerStore`` over a dict of lists."""

    def __init__(self) -> None:
        self._ledgers: dict[int, _Ledger] = {}
        self._next_ledger_id = 1
        self._lock = threading.Lock()

    def create(self, metadata: Mapping[str, str] | None = None, *, durable_at_seal: bool = False) -> int:
        with self._lock:
            ledger_id = self._next_ledger_id
            self._next_ledger_id += 1
            self._ledgers[ledger_id] = _Ledger(dict(metadata or {}), int(time.time() * 1000))
            return ledger_id

    def append(self, ledger_id: int, data: bytes) -> Future[int]:
        with self._lock:
            ledger = self._get(ledger_id)
            if ledger.sealed:
                raise LedgerSealedError(f"ledger {ledger_id} is sealed", ledger_id=ledger_id)
            ledger.entries.append(bytes(data))
            ledger.size_bytes += len(data)
            return completed(len(ledger.entries) - 1)

    def last_add_confirmed(self, ledger_id: int) -> int:
        with self._lock:
            return len(self._get(ledger_id).entries) - 1

    def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> Sequence[bytes]:
        with self._lock:
            ledger = self._get(ledger_id)
            _check_range(ledger_id, first_entry_id, last_entry_id, len(ledger.entries) - 1)
            return ledger.entries[first_entry_id : last_entry_id + 1]

    def close(self, ledger_id: int) -> None:
        with self._lock:
            self._get(ledger_id).sealed = True

    def delete(self, ledger_id: int) -> None:
        with self._lock:
            self._ledgers.pop(ledger_id, None)

    def list(self) -> list[int]:
        with self._lock:
            return sorted(self._ledgers)

    def info(self, ledger_id: int) -> LedgerInfo:
        with self._lock:
            ledger = self._get(ledger_id)
            return LedgerInfo(
                ledger_id=ledger_id,
                state=LedgerState.CLOSED if ledger.sealed else LedgerState.OPEN,
                last_add_confirmed=len(ledger.entries) - 1,
                size_bytes=ledger.size_bytes,
                created_at_ms=ledger.created_at_ms,
                metadata=dict(ledger.metadata),
            )

    def file_powers(self) -> LedgerFiles | None:
        """No ledger files: nothing beyond ``LedgerStore``."""
        return None

    def shutdown(self) -> None:
        """Nothing is pending in memory."""

    def _get(self, ledger_id: int) -> _Ledger:
        try:
            return self._ledgers[ledger_id]
        except KeyError:
            raise LedgerNotFoundError(f"no ledger {ledger_id}", ledger_id=ledger_id) from None


def _check_range(ledger_id: int, first: int, last: int, last_add_confirmed: int) -> None:
    """Raise ``PositionOutOfRangeError`` unless ``0 <= first <= last <= last_add_confirmed``."""
    if not 0 <= first <= last <= last_add_confirmed:
        raise PositionOutOfRangeError(
            f"ledger {ledger_id}: read {first}..{last} outside 0..{last_add_confirmed}",
            ledger_id=ledger_id,
        )
