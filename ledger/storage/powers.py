"""``LedgerFiles``: what a store that keeps its ledgers as files offers beyond ``LedgerStore``.

The layers above reach past the nine-method seam only for work done on the files
themselves, outside the store's process or beside it:

* ``root``: the directory of the ledger files; a worker process, a Spark executor or a
  key-index build opens it read-only (``FileLedgerStore(root, read_only=True)``) and a
  backup links its files.
* ``reserve_ids(count)``: ledger ids allocated durably without creating their files, for
  ledgers written whole elsewhere (``ledger.storage.sealed_writer``).
* ``adopt_sealed(ledger_id, entry_offsets, entry_lengths)``: load such a ledger from the
  layout its writer recorded instead of scanning it; False when it cannot (it is then
  scanned on first use, as any).
* ``confirmed_length(ledger_id)``: ``(entries, bytes)``, the durable entries and the file
  prefix that holds them (a backup copies that prefix).
* ``delete(ledger_id)``: the store's own ``LedgerStore.delete``; a reserved id whose
  ledger is never published is removed through it. It removes the bucket's copies too.
* ``bucket``: the ``BucketConfig`` sealed ledgers are offloaded to, or None.
* ``open_sealed(ledger_id)``: a ``SealedFile`` (``ledger.storage.sealed_file``) over the
  local file, else over the bucket's object through the store's block cache; None when
  the ledger is open or nowhere. Callers read sealed ledgers directly through it, never
  by building a path under ``root``.
* ``open_sidecar(ledger_id, suffix)``: the sidecar (``ledger.storage.sidecars``) as a
  random-access ``pyarrow.NativeFile`` (``pyarrow.parquet`` reads it), local else the
  bucket's; None when neither exists.
* ``upload_sealed(ledger_id)``: copy a sealed ledger and its sidecars to the bucket and
  read each copy back; ``(size, crc32c)`` of the ledger when all match the local files,
  ``ObjectMismatchError`` otherwise.
* ``upload_sidecar(ledger_id, suffix, local_path)``: copy (and read back) a sidecar built
  for a ledger that lives only in the bucket.
* ``drop_local(ledger_id)``: remove the local file and sidecars only (the bucket copy
  then serves every read); False when there was no local file.

A store answers ``LedgerStore.file_powers()`` once, with its ``LedgerFiles`` or ``None``:
``FileLedgerStore`` is its own; ``MemoryLedgerStore`` has none; ``FaultyLedgerStore``
shows none either, so that every operation of a fault test passes its fault points (work
done on the files directly would go round them). Callers never probe a store's type or
attributes (``tests/unit/test_static.py`` checks it outside ``ledger/``).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from ledger.storage.object_fs import BucketConfig
    from ledger.storage.sealed_file import SealedFile

__all__ = ["LedgerFiles"]


class LedgerFiles(Protocol):
    """A file-backed store's powers beyond ``LedgerStore``; see the module docstring."""

    @property
    def root(self) -> str:
        """The absolute path of the directory holding the ledger files."""
        ...

    def reserve_ids(self, count: int) -> list[int]: ...

    def adopt_sealed(self, ledger_id: int, entry_offsets: array[int], entry_lengths: array[int]) -> bool: ...

    def confirmed_length(self, ledger_id: int) -> tuple[int, int]: ...

    def delete(self, ledger_id: int) -> None: ...

    @property
    def bucket(self) -> BucketConfig | None:
        """Where sealed ledgers are offloaded, or None (no bucket)."""
        ...

    def open_sealed(self, ledger_id: int) -> SealedFile | None: ...

    def open_sidecar(self, ledger_id: int, suffix: str) -> pa.NativeFile | None: ...

    def upload_sealed(self, ledger_id: int) -> tuple[int, int]: ...

    def upload_sidecar(self, ledger_id: int, suffix: str, local_path: str) -> None: ...

    def drop_local(self, ledger_id: int) -> bool: ...
