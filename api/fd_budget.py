"""How ``compactd serve`` shares its file descriptors (``RLIMIT_NOFILE``) out.

A process that runs out of descriptors stops accepting on both ports (the admin API
included) and cannot open SQLite or a ledger file. So the descriptors are shared out at
start, from the soft limit:

* ``FD_RESERVE`` stay for the broker itself: its listeners, the SQLite database (and its
  ``-wal``/``-shm``), the data dir lock, the log, the event loop, the key index worker's
  pipes, the files an admin request opens (a backup), and a margin;
* the ledger file cache (``ledger.storage.handles``) gets at most a
  ``1/LEDGER_FILES_SHARE`` of the rest (and never more than ``--max-open-ledger-files``);
* the connections get what is left: the admin port at most ``1/HTTP_SHARE`` of it, the
  Pulsar ports (plain and TLS together) the remainder. A listener at its cap makes room by
  closing its oldest connection that has not yet said anything (a Pulsar connection
  without CONNECT, an HTTP connection without a request), else closes the new one at once:
  a flood of idle connections can never take the descriptors the admin API and the
  ledgers need, and every descriptor it took is given back as its connections go.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = ["FD_RESERVE", "HTTP_SHARE", "LEDGER_FILES_SHARE", "FdBudget", "fd_budget", "nofile_limit"]

FD_RESERVE = 48
LEDGER_FILES_SHARE = 4
HTTP_SHARE = 4
CONNECTIONS_MIN = 4  # each listener takes at least this many connections, whatever the limit


@dataclass(frozen=True, slots=True)
class FdBudget:
    """The descriptors each user may hold (see the module docstring)."""

    limit: int
    ledger_files: int
    pulsar_connections: int
    http_connections: int


def nofile_limit() -> int:
    """The process's soft ``RLIMIT_NOFILE`` (a large stand-in when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def fd_budget(max_open_ledger_files: int, limit: int | None = None) -> FdBudget:
    """Share ``limit`` descriptors (default: ``nofile_limit()``) out; ``max_open_ledger_files``
    bounds the ledger file cache from above."""
    limit = nofile_limit() if limit is None else limit
    spare = max(limit - FD_RESERVE, 0)
    ledger_files = max(1, min(max_open_ledger_files, spare // LEDGER_FILES_SHARE))
    connections = max(spare - ledger_files, 0)
    http = max(CONNECTIONS_MIN, connections // HTTP_SHARE)
    pulsar = max(CONNECTIONS_MIN, connections - http)
    return FdBudget(limit, ledger_files, pulsar, http)
