"""``FaultyLedgerStore``: a wrapper that makes any ``LedgerStore`` fail on cue.

Shipped in the package, like httpx's ``MockTransport``, because crash and fault tests of
every layer above need it. It composes around any backend and changes nothing until a
fault is armed:

* ``fail_on(operation, after=n, error=..., times=k)``: the (n+1)-th call of ``operation``
  from now, and the ``k - 1`` calls after it (``times=None``: every call until ``disarm``),
  raise ``error`` (a ``LedgerIOError`` by default) *instead of* reaching the backend — a
  disk that stays full for a while, then frees.
* ``crash_on(operation, after=n)``: the same, raising ``SimulatedCrash``, a
  ``BaseException`` that ordinary ``except Exception`` handlers do not swallow, so the code
  under test stops exactly there, as a ``kill -9`` would; the test then reopens the backend.

It shows none of its backend's file powers (``file_powers()`` is ``None``): work done on
the ledger files directly (a worker process's round, a key-index build, a backup) would
go round its fault points, so a faulty store is always used through its methods.

Operations are the protocol's method names: ``create``, ``append``, ``read``, ``close``,
``delete``, ``list``, ``info``, ``last_add_confirmed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from ledger.errors import LedgerIOError
from ledger.storage.base import LedgerInfo, LedgerStore
from ledger.storage.powers import LedgerFiles

__all__ = ["FaultyLedgerStore", "SimulatedCrash"]


class SimulatedCrash(BaseException):
    """Raised where a fault test pretends the process died."""


@dataclass
class _Fault:
    remaining: int
    error: BaseException
    times: int | None  # failing calls left; None: until disarmed


class FaultyLedgerStore:
    """Wraps ``inner``; see the module docstring."""

    def __init__(self, inner: LedgerStore) -> None:
        self.inner = inner
        self._faults: dict[str, _Fault] = {}
        self.calls: dict[str, int] = {}

    def fail_on(
        self, operation: str, *, after: int = 0, error: BaseException | None = None, times: int | None = 1
    ) -> None:
        """Arm a fault: after ``after`` more successful calls, ``times`` calls of
        ``operation`` fail (``None``: every call until ``disarm``)."""
        assert times is None or times > 0, "a fault fails at least one call"
        self._faults[operation] = _Fault(after, error or LedgerIOError(f"injected {operation} failure"), times)

    def crash_on(self, operation: str, *, after: int = 0) -> None:
        """Arm a simulated crash at the given call of ``operation``."""
        self.fail_on(operation, after=after, error=SimulatedCrash(f"crash at {operation}"))

    def disarm(self) -> None:
        """Remove every armed fault."""
        self._faults.clear()

    def _enter(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        fault = self._faults.get(operation)
        if fault is None:
            return
        if fault.remaining > 0:
            fault.remaining -= 1
            return
        if fault.times is not None:
            fault.times -= 1
            if fault.times == 0:
                del self._faults[operation]
        raise fault.error

    def create(self, metadata: Mapping[str, str] | None = None, *, durable_at_seal: bool = False) -> int:
        self._enter("create")
        return self.inner.create(metadata, durable_at_seal=durable_at_seal)

    def append(self, ledger_id: int, data: bytes) -> Future[int]:
        self._enter("append")
        return self.inner.append(ledger_id, data)

    def last_add_confirmed(self, ledger_id: int) -> int:
        self._enter("last_add_confirmed")
        return self.inner.last_add_confirmed(ledger_id)

    def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> Sequence[bytes]:
        self._enter("read")
        return self.inner.read(ledger_id, first_entry_id, last_entry_id)

    def close(self, ledger_id: int) -> None:
        self._enter("close")
        self.inner.close(ledger_id)

    def delete(self, ledger_id: int) -> None:
        self._enter("delete")
        self.inner.delete(ledger_id)

    def list(self) -> list[int]:
        self._enter("list")
        return self.inner.list()

    def info(self, ledger_id: int) -> LedgerInfo:
        self._enter("info")
        return self.inner.info(ledger_id)

    def file_powers(self) -> LedgerFiles | None:
        """None, whatever the backend: see the module docstring."""
        return None

    def shutdown(self) -> None:
        self.inner.shutdown()
