"""The metadata writer: admin writes of the metadata database, off the event loop.

Policies, tenants and namespaces, grants, schemas and partitioned parents are written by
the admin application and the wire (a producer's schema), both on the broker's event loop,
where a commit (``synchronous=FULL``: an fsync) would stall every connection. They go to
one process-wide thread, ``metadata-write``, through ``write_off_loop``; the caller answers
once the call returns, so an answered write is durable. One thread, so each store's
check-then-commit (a tenant that must not exist yet, a schema version to register once)
runs whole before the next write starts, as it did on the loop; the stores' in-memory
caches (``Tenants``, ``PartitionedTopics``) are changed on that thread after the commit,
by single dict or set operations the loop reads atomically.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["WRITER_THREAD", "submit_off_loop", "write_off_loop"]

WRITER_THREAD = "metadata-write"

P = ParamSpec("P")
R = TypeVar("R")

_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WRITER_THREAD)


async def write_off_loop(write: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``write(*args, **kwargs)`` on the metadata writer thread; its result or its error."""
    return await asyncio.get_running_loop().run_in_executor(_writer, functools.partial(write, *args, **kwargs))


def submit_off_loop(write: Callable[[], R]) -> Future[R]:
    """``write()`` queued on the metadata writer thread; the future of its result."""
    return _writer.submit(write)
