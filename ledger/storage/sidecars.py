"""Files kept beside a ledger file by the layers above, and their lifecycle.

A sealed ledger never changes, so an upper layer may keep facts derived from it in a file
beside it, named ``<ledger file><suffix>`` (the compactor's key index,
``compactor.local.key_index``: ``.kidx``). The ledger layer does not read them, and imports
nothing of their owners; it only makes sure none outlives its ledger:

* ``FileLedgerStore.delete`` removes a ledger's sidecars with its file (``sidecar_paths``),
  and their copies in the bucket;
* an offload copies them with their ledger (``ledgers/<id:020d><suffix>`` in the bucket,
  ``ledger.storage.bucket``) and ``drop_local`` removes the local ones with the ledger's
  file; a reader then opens them with ``LedgerFiles.open_sidecar`` (local, else the
  bucket's copy), and a sidecar built for a ledger that lives only in the bucket is kept
  there (``LedgerFiles.upload_sidecar``), never beside a ledger file that is gone;
* at start (``ledger.data_dir.DataDir.collect_orphans``) ``remove_stale_sidecars`` deletes
  the temporary files a writer that died left (``TEMP_SIDECAR_SUFFIXES``: a name ending so
  is never complete) and every sidecar whose ledger file no longer exists (a writer that
  finished after its ledger was deleted, or after its local copy was dropped).

A layer that adds a kind of sidecar adds its suffixes here (its tests check they agree).
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["SIDECAR_SUFFIXES", "TEMP_SIDECAR_SUFFIXES", "remove_stale_sidecars", "sidecar_paths"]

SIDECAR_SUFFIXES = (".kidx",)
"""Appended to a ledger file's name: a sidecar of that ledger."""
TEMP_SIDECAR_SUFFIXES = (".kidx-tmp",)
"""The end of a sidecar's temporary file's name (``<sidecar>.<random><suffix>``)."""


def sidecar_paths(ledger_path: str) -> list[str]:
    """Where the sidecars of the ledger stored in ``ledger_path`` would be."""
    return [ledger_path + suffix for suffix in SIDECAR_SUFFIXES]


def remove_stale_sidecars(root: str) -> list[str]:
    """Delete, in the ledger directory ``root``, the temporary sidecar files and the
    sidecars of ledgers whose file is gone; their names, sorted. Call it only while no
    sidecar writer can be running (at start)."""
    names = set(os.listdir(root))
    stale = []
    for name in sorted(names):
        if name.endswith(TEMP_SIDECAR_SUFFIXES):
            stale.append(name)
            continue
        for suffix in SIDECAR_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] not in names:
                stale.append(name)
    removed = []
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, name))
            removed.append(name)
    if removed:
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return removed

