"""A fault-injecting HTTP reverse proxy for the object-storage tests.

``FaultProxy(upstream)`` listens on 127.0.0.1 (a port the system picks) and forwards each
request to ``upstream`` (the moto S3 server, ``tests.s3_server``) unchanged — same method,
target, headers (the client's ``Host`` and SigV4 signature included) and body. A test points a
``BucketConfig`` at ``proxy.endpoint`` and tells the proxy, from any thread, to misbehave on
the next requests::

    proxy.inject(Fault.STATUS, status=503, method="PUT", times=2)
    proxy.inject(Fault.TRUNCATE, method="GET", path=r"/ledgers/")

Faults (``Fault``): ``STATUS`` answers with an S3 XML error (500 ``InternalError`` or 503
``SlowDown``) without forwarding; ``RESET`` closes the client's connection with a TCP RST
(SO_LINGER 0) without forwarding; ``TIMEOUT`` holds the request unanswered for ``hold_s``
(or until ``stop``/``release``) and then closes the connection; ``TRUNCATE`` forwards, then
sends the upstream's headers (its full ``Content-Length``) and only half of the body before
closing; ``SLOW`` forwards and waits ``delay_s`` before answering. A rule applies to the next
``times`` requests that match its ``method`` (exact) and ``path`` (a regular expression
searched in the request target); the first live rule in injection order wins.
``hits`` records every request and the fault it got (``None``: forwarded untouched).

With ``certfile``/``keyfile`` the proxy speaks HTTPS (``endpoint`` is ``https://…``), so
``BucketConfig.tls_ca_file`` can be tested against a private CA; the upstream stays plain
HTTP. The standard library's ``ThreadingHTTPServer`` and ``http.client`` carry it: one
thread per client connection, HTTP/1.1 keep-alive as the AWS SDK uses it.
"""

from __future__ import annotations

import enum
import http.client
import re
import socket
import ssl
import struct
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

__all__ = ["Fault", "FaultProxy", "Hit"]

HOLD_S_DEFAULT = 60.0  # how long a TIMEOUT holds a request unless released first
_UPSTREAM_TIMEOUT_S = 30.0
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                         "trailer", "upgrade", "expect"})
_S3_ERRORS = {500: ("InternalError", "We encountered an internal error. Please try again."),
              503: ("SlowDown", "Please reduce your request rate.")}


class Fault(enum.Enum):
    STATUS = "status"
    RESET = "reset"
    TIMEOUT = "timeout"
    TRUNCATE = "truncate"
    SLOW = "slow"


@dataclass(frozen=True, slots=True)
class Hit:
    """One request the proxy saw, and the fault it answered it with (None: forwarded)."""

    method: str
    path: str
    fault: Fault | None


@dataclass(slots=True)
class _Rule:
    fault: Fault
    times: int
    method: str | None
    path: re.Pattern[str] | None
    status: int
    delay_s: float
    hold_s: float

    def matches(self, method: str, path: str) -> bool:
        return (self.times > 0 and (self.method is None or self.method == method)
                and (self.path is None or self.path.search(path) is not None))


class FaultProxy:
    """See the module docstring. ``stop()`` (or the context manager) shuts it down."""

    def __init__(self, upstream: str, *, certfile: str | None = None, keyfile: str | None = None) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the upstream must be http://HOST:PORT: {upstream!r}")
        self._upstream = (parts.hostname, parts.port)
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._hits: list[Hit] = []
        self._released = threading.Event()
        context = None
        if certfile is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile, keyfile)
        self._server = _Server(self, context)
        host, port = self._server.server_address[:2]
        self.endpoint = f"{'https' if context else 'http'}://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    # -- the test's side ---------------------------------------------------------------

    def inject(self, fault: Fault, *, times: int = 1, method: str | None = None, path: str | None = None,
               status: int = 503, delay_s: float = 1.0, hold_s: float = HOLD_S_DEFAULT) -> None:
        """Answer the next ``times`` requests matching ``method``/``path`` with ``fault``."""
        if fault is Fault.STATUS and status not in _S3_ERRORS:
            raise ValueError(f"status must be one of {sorted(_S3_ERRORS)}: {status}")
        rule = _Rule(fault, times, method, re.compile(path) if path else None, status, delay_s, hold_s)
        with self._lock:
            self._rules.append(rule)

    def clear(self) -> None:
        """Drop every rule not yet used up, and let held requests go."""
        with self._lock:
            self._rules.clear()
        self.release()

    def release(self) -> None:
        """End every TIMEOUT hold and SLOW wait now (held connections close unanswered);
        later ones hold again."""
        with self._lock:
            released, self._released = self._released, threading.Event()
        released.set()

    @property
    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self._hits)

    def faults(self, fault: Fault) -> list[Hit]:
        """The requests that got ``fault``."""
        return [hit for hit in self.hits if hit.fault is fault]

    @property
    def pending(self) -> int:
        """Fault applications still to come, over every rule."""
        with self._lock:
            return sum(rule.times for rule in self._rules)

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the handler's side ------------------------------------------------------------

    def _take(self, method: str, path: str) -> tuple[_Rule | None, threading.Event]:
        """The rule this request gets (consumed), and the event that releases its wait."""
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, path):
                    rule.times -= 1
                    self._hits.append(Hit(method, path, rule.fault))
                    return rule, self._released
            self._hits.append(Hit(method, path, None))
            return None, self._released

    def _forward(self, method: str, path: str, headers: list[tuple[str, str]],
                 body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self._upstream, timeout=_UPSTREAM_TIMEOUT_S)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                connection.putheader(name, value)
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            response = connection.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            connection.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, proxy: FaultProxy, context: ssl.SSLContext | None) -> None:
        self.proxy = proxy
        self.context = context
        super().__init__(("127.0.0.1", 0), _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.context is None:
            super().finish_request(request, client_address)
            return
        try:  # the handshake runs here, in the connection's thread, not in the accept loop
            secured = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):  # a client that refuses our certificate
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-request: nothing to report


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _proxy(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        rule, released = proxy._take(self.command, self.path)
        fault = rule.fault if rule else None
        if rule is not None and fault is Fault.STATUS:
            self._s3_error(rule.status)
            return
        if fault is Fault.RESET:
            self._reset()
            return
        if rule is not None and fault is Fault.TIMEOUT:
            released.wait(rule.hold_s)
            self._reset()
            return
        headers = [(name, value) for name, value in self.headers.items()
                   if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length"]
        try:
            status, reason, upstream_headers, data = proxy._forward(self.command, self.path, headers, body)
        except OSError:
            self._s3_error(503)
            return
        if rule is not None and fault is Fault.SLOW:
            released.wait(rule.delay_s)
        self.send_response(status, reason)
        length = None
        for name, value in upstream_headers:
            lowered = name.lower()
            if lowered == "content-length":
                length = value
            elif lowered not in _HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", length or "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        if fault is Fault.TRUNCATE:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _s3_error(self, status: int) -> None:
        code, message = _S3_ERRORS[status]
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reset(self) -> None:
        """Close the client's connection with a TCP RST, unanswered."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # no FIN first: the server's shutdown would send one
        except OSError:
            pass
