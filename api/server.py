"""``compactd serve``: one broker process, from start to a clean exit.

``run(settings)`` carries out, in this order:

1. refuse what this build does not serve, and token key or TLS files that do not load
   (``api.auth.tls.preflight``): ``ConfigError``; log one warning when listening beyond
   loopback with authentication off;
2. open the data dir, taking its lock first (``DataDirLockedError`` when another
   process holds it; nothing is touched then), its ledger store reading offloaded
   ledgers from the offload bucket when a driver is set (``api.config.offload_bucket``);
3. collect orphan ledgers a crashed compaction left behind;
4. build the broker service and start its Pulsar listener on ``bind:broker_port``;
5. start the admin REST listener (uvicorn) on ``bind:http_port``;
6. with TLS files, start the ``pulsar+ssl://`` listener on ``broker_port_tls`` and the
   HTTPS admin listener on ``http_port_tls`` (``api.auth.tls``); both admin listeners
   refuse foreign Host headers (``api.auth.rest.HostAllowListMiddleware``);
7. once all accept connections, print the one ready line to stdout::

       compactd ready broker=pulsar://HOST:PORT http=http://HOST:PORT

   with `` broker_tls=pulsar+ssl://HOST:PORT https=https://HOST:PORT`` appended under TLS;

8. wait for SIGTERM or SIGINT, then stop the REST listener, stop the broker (its
   listener, connections, pending appends finished or failed back, managed ledgers
   closed) and close the data dir (synced, lock released), and return 0.

A port of 0 picks a free port; the ready line gives the port that was bound. Expected
start failures (``CompactionServiceError``: bad settings, a locked data dir, a port in
use) are raised for the caller to report in one line; anything else is a bug, logged
with its traceback, and ``run`` returns 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import uvicorn

from api.auth.rest import HostAllowListMiddleware
from api.auth.tls import broker_ssl_context, https_options, preflight, tls_enabled
from api.broker.access import exposure_warning
from api.config import Settings, offload_bucket, require_supported
from api.fd_budget import fd_budget
from api.http import create_app
from api.http_connections import capped_http_protocol
from api.listener import listening_socket, quiet_accept_errors
from api.logs import logging_to_stderr
from compactor.runs.runner import collect_orphans
from ledger.data_dir import DataDir
from ledger.errors import CompactionServiceError
from ledger.storage.base import SyncPolicy

__all__ = ["Broker", "BrokerFactory", "ListenError", "print_ready", "ready_line", "run", "serve"]

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Pending connections the kernel queues on the admin port before uvicorn accepts them.
HTTP_LISTEN_BACKLOG = 128
# uvicorn starts within milliseconds; a start slower than this is a failure, not a wait.
HTTP_START_TIMEOUT_S = 30.0
# In-flight admin requests get this long to finish at shutdown before they are cancelled.
HTTP_GRACEFUL_SHUTDOWN_S = 5
# uvicorn's own shutdown polls every 0.1 s; this bounds it on top of the graceful period.
HTTP_STOP_TIMEOUT_S = HTTP_GRACEFUL_SHUTDOWN_S + 5.0
# How often the HTTP start is polled: uvicorn only exposes a ``started`` flag.
HTTP_START_POLL_S = 0.01
# The broker's stop waits for pending appends (each a group-commit fsync, milliseconds)
# and closes managed ledgers; one that takes this long is stuck, and the process ends
# with exit code 1 after closing the data dir anyway.
BROKER_STOP_TIMEOUT_S = 60.0
# The GIL switch interval while serving. A compaction run computes on a worker thread and
# never blocks, so each time the event loop (or the ledger flusher) wants the GIL it waits
# until the run is forced to drop it: CPython's default 5 ms, several times per send.
# 0.2 ms keeps those waits short (``python -m bench.wire --during-compaction
# --compaction-messages 1000000`` on 2 cores: send p99 during the run 54 ms -> 16 ms,
# p50 4.7 ms -> 0.9 ms, the run's own time unchanged within noise).
GIL_SWITCH_INTERVAL_S = 0.0002


class ListenError(CompactionServiceError):
    """A listener could not bind its address (port in use, address not local, ...)."""


class Broker(Protocol):
    """What ``serve`` needs of the broker (``api.wire.listener.PulsarBroker``: the broker core
    served over the Pulsar protocol)."""

    async def start(self, host: str, port: int) -> int:
        """Listen for Pulsar clients on ``host:port``; return the bound port (port 0: a free one)."""

    async def start_tls(self, host: str, port: int, context: ssl.SSLContext) -> int:
        """Listen for ``pulsar+ssl://`` clients on ``host:port``; return the bound port."""

    async def stop(self) -> None:
        """Close listeners and connections, finish or fail pending appends, close managed ledgers.

        Called once, also when ``start`` failed or was never called.
        """


BrokerFactory = Callable[[DataDir, Settings], Broker]


def run(settings: Settings, *, broker_factory: BrokerFactory | None = None,
        ready: Callable[[str], None] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; the process's exit code (0 after a clean stop).

    Raises ``CompactionServiceError`` subclasses for expected start failures. While it
    serves, the GIL switch interval is ``GIL_SWITCH_INTERVAL_S`` and logs go to stderr as
    ``log_format`` and ``log_level`` say (``api.logs``); both are restored on return.
    """
    switch_interval_s = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        with logging_to_stderr(settings.log_format, settings.log_level):
            return _run_logged(settings, broker_factory, ready)
    finally:
        sys.setswitchinterval(switch_interval_s)


def _run_logged(settings: Settings, broker_factory: BrokerFactory | None,
                ready: Callable[[str], None] | None) -> int:
    try:
        factory = broker_factory or _default_broker_factory()
        return asyncio.run(serve(settings, broker_factory=factory, ready=ready or print_ready))
    except CompactionServiceError:
        raise
    except KeyboardInterrupt:  # SIGINT before the handlers were installed: nothing was served
        return 0
    except Exception:
        log.exception("compactd stopped on an unexpected error")
        return 1


def _default_broker_factory() -> BrokerFactory:
    # Imported here so that the CLI's other commands do not load the whole broker.
    from api.wire.listener import PulsarBroker

    return PulsarBroker


def print_ready(line: str) -> None:
    """Write the ready line to stdout at once (scripts wait for it)."""
    print(line, flush=True)


def ready_line(host: str, broker_port: int, http_port: int, *, advertised: str | None = None) -> str:
    """``compactd ready broker=pulsar://HOST:PORT http=http://HOST:PORT``, the bound
    addresses, then `` advertised=pulsar://ADVERTISED:PORT`` when an advertised address is
    set (what lookups tell clients)."""
    line = f"compactd ready broker={_url('pulsar', host, broker_port)} http={_url('http', host, http_port)}"
    return line if advertised is None else f"{line} advertised={_url('pulsar', advertised, broker_port)}"


def _url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


async def serve(settings: Settings, *, broker_factory: BrokerFactory,
                ready: Callable[[str], None] = print_ready) -> int:
    """The body of ``run``, on a running loop in the main thread (signal handlers)."""
    require_supported(settings)
    preflight(settings)  # api.auth.tls: the key and TLS files load, before the data dir is touched
    if (warning := exposure_warning(settings)) is not None:
        log.warning("%s", warning)
    quiet_accept_errors(asyncio.get_running_loop())  # both listeners log accept failures once
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(_stop_on_signals(stop))
        budget = fd_budget(settings.max_open_ledger_files)  # ledger files never take the broker's own
        data_dir = DataDir.open(settings.data_dir, sync=SyncPolicy(settings.fsync),  # locked: stops here, unlogged
                                max_open_files=budget.ledger_files, bucket=offload_bucket(settings),
                                read_cache_bytes=settings.managed_ledger_offload_read_cache_bytes)
        stack.callback(data_dir.close)
        log.info("file descriptors: %d; ledger files keep at most %d open, Pulsar connections %d, "
                 "admin connections %d", budget.limit, budget.ledger_files, budget.pulsar_connections,
                 budget.http_connections)
        log.info("compactd starting on data dir %s", data_dir.path, extra={"event": "start", "data_dir": data_dir.path})
        collect_orphans(data_dir)
        broker = broker_factory(data_dir, settings)
        stack.push_async_callback(_stop_broker, broker)
        broker_port = await _start_broker(broker, settings)
        http = await stack.enter_async_context(_http_listener(settings, broker))
        line = ready_line(settings.bind, broker_port, http.port, advertised=settings.advertised_address)
        if tls_enabled(settings):  # api.auth.tls: pulsar+ssl:// and https:// beside them
            broker_tls_port = await _start_broker_tls(broker, settings)
            https = await stack.enter_async_context(_http_listener(settings, broker, tls=True))
            line += (f" broker_tls={_url('pulsar+ssl', settings.bind, broker_tls_port)}"
                     f" https={_url('https', settings.bind, https.port)}")
        ready(line)
        log.info(line, extra={"event": "ready", "broker_port": broker_port, "http_port": http.port})
        await _wait_for_stop(stop, http.task)
        log.info("compactd stopping", extra={"event": "stopping"})
    log.info("compactd stopped", extra={"event": "stop"})
    return 0


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    for signal_number in STOP_SIGNALS:
        loop.add_signal_handler(signal_number, _on_stop_signal, signal_number, stop)
    try:
        yield
    finally:
        for signal_number in STOP_SIGNALS:
            loop.remove_signal_handler(signal_number)


def _on_stop_signal(signal_number: int, stop: asyncio.Event) -> None:
    if not stop.is_set():
        log.info("received %s", signal.Signals(signal_number).name)
    stop.set()


async def _start_broker(broker: Broker, settings: Settings) -> int:
    try:
        return await broker.start(settings.bind, settings.broker_port)
    except OSError as error:
        raise _listen_error("broker", settings.bind, settings.broker_port, error) from None


async def _start_broker_tls(broker: Broker, settings: Settings) -> int:
    try:
        return await broker.start_tls(settings.bind, settings.broker_port_tls, broker_ssl_context(settings))
    except OSError as error:
        raise _listen_error("broker TLS", settings.bind, settings.broker_port_tls, error) from None


async def _stop_broker(broker: Broker) -> None:
    async with asyncio.timeout(BROKER_STOP_TIMEOUT_S):
        await broker.stop()


async def _wait_for_stop(stop: asyncio.Event, http_task: asyncio.Task[None]) -> None:
    """Until a stop signal; the REST listener ending on its own is an error."""
    stop_task = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stop_task, http_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_task.cancel()
    if not stop.is_set():
        http_task.result()  # raises what ended it, if anything did
        raise RuntimeError("the admin REST listener stopped on its own")


class _HttpServer(uvicorn.Server):
    """uvicorn's server without its signal handling: ``serve`` owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _HttpListener:
    """A started admin REST listener: the port it bound and the task serving it."""

    def __init__(self, server: _HttpServer, task: asyncio.Task[None], port: int) -> None:
        self.server = server
        self.task = task
        self.port = port


@contextlib.asynccontextmanager
async def _http_listener(settings: Settings, broker: Broker, *, tls: bool = False) -> AsyncIterator[_HttpListener]:
    """The admin REST listener on ``http_port``, or (``tls``) the HTTPS one on ``http_port_tls``;
    both refuse Host headers that are not this broker's (``api.auth.rest``)."""
    sock = _listen(settings.bind, settings.http_port_tls if tls else settings.http_port)
    app = HostAllowListMiddleware(create_app(settings, broker=broker), settings.bind, settings.http_allowed_hosts)
    config = uvicorn.Config(
        app, log_config=None, log_level="warning",
        access_log=False, lifespan="off", ws="none",
        timeout_graceful_shutdown=HTTP_GRACEFUL_SHUTDOWN_S, backlog=HTTP_LISTEN_BACKLOG,
        **(https_options(settings) if tls else {}),
    )
    config.load()
    config.http_protocol_class = capped_http_protocol(
        config.http_protocol_class, fd_budget(settings.max_open_ledger_files).http_connections,
        config.timeout_keep_alive)
    server = _HttpServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await _until_started(server, task)
        yield _HttpListener(server, task, sock.getsockname()[1])
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, HTTP_STOP_TIMEOUT_S)
        finally:
            sock.close()


async def _until_started(server: _HttpServer, task: asyncio.Task[None]) -> None:
    async with asyncio.timeout(HTTP_START_TIMEOUT_S):
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the admin REST listener ended while starting")
            await asyncio.sleep(HTTP_START_POLL_S)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` for uvicorn (binding here, not in uvicorn, makes
    a port in use an error we report, not uvicorn's ``sys.exit``, and makes port 0 work;
    ``api.listener`` makes running out of descriptors a logged back-off, not a spin)."""
    try:
        return listening_socket(host, port, HTTP_LISTEN_BACKLOG)
    except OSError as error:
        raise _listen_error("admin REST", host, port, error) from None


def _listen_error(listener: str, host: str, port: int, error: OSError) -> ListenError:
    reason = error.strerror or str(error)
    return ListenError(f"cannot listen on {host}:{port} for the {listener} listener: {reason}")
