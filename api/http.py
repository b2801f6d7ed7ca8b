"""The admin REST application (Pulsar's admin v2 paths, INTERFACES §3).

``create_app`` builds the FastAPI application from what its routes need: the settings and
the broker service, both owned by ``api.server`` (which also starts and stops the uvicorn
listener, so the application has no lifespan of its own). It adds the health check, the
routers of ``api.routers`` (one per resource) and the error handlers of ``api.errors``
(every failure answers Pulsar's ``{"reason": "…"}``). ``/docs`` and ``/openapi.json``
describe every route; ``/docs`` (Swagger UI) and ``/redoc`` load their scripts, styles and
icon from this application (``fastapi-offline`` ships them), so they work without internet.

With authentication on, ``api.auth.rest.AccessMiddleware`` guards every route but the
health check (Bearer tokens; with authorization on, admin routes are super-user only and
the routes that declare a topic grant take a role holding it).

Request bodies are bounded before they are read (``BodyLimitMiddleware``): a declared
``Content-Length`` above ``http_max_request_body_bytes`` answers 413 without reading a
byte, and a body without one (chunked) is counted as it streams in and answers 413 as
soon as it goes over, so no body ever grows the broker beyond the limit. A schema upload
(POST of ``SCHEMA_UPLOAD_PATH``) may be larger, ``schema_upload_body_bytes``: room for any
definition up to ``schema_max_size_bytes`` however JSON escapes it, so both ports take the
same largest schema (the registry then refuses one over it, 400 naming both sizes).
"""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth.rest import AccessMiddleware
from api.broker.access import AccessControl
from api.config import Settings
from api.errors import install_error_handlers, reason_response
from api.routers import ROUTERS

__all__ = [
    "HEALTH_PATH",
    "JSON_ESCAPE_BYTES_MAX",
    "MAX_REQUEST_BODY_BYTES",
    "SCHEMA_UPLOAD_PATH",
    "BodyLimitMiddleware",
    "create_app",
    "schema_upload_body_bytes",
]

HEALTH_PATH = "/admin/v2/brokers/health"
MAX_REQUEST_BODY_BYTES = Settings().http_max_request_body_bytes
"""The limit of an application built without settings (tests)."""
JSON_ESCAPE_BYTES_MAX = 6
"""Most bytes one byte of text takes in a JSON string (``\\u0000``)."""
SCHEMA_UPLOAD_PATH = re.compile(r"/admin/v2/schemas/[^/]+/[^/]+/[^/]+/schema/?")


def schema_upload_body_bytes(settings: Settings) -> int:
    """The body limit of a schema upload: any definition up to ``schema_max_size_bytes``,
    escaped, plus the ordinary limit for the rest of the body."""
    return settings.http_max_request_body_bytes + JSON_ESCAPE_BYTES_MAX * settings.schema_max_size_bytes

DESCRIPTION = """\
Pulsar's admin v2 paths for topics, compaction and compaction policies, served by compactd.

Errors answer Pulsar's body `{"reason": "…"}`, naming the bad value. Topic paths name a
persistent topic as `/admin/v2/persistent/{tenant}/{namespace}/{topic}`.
"""


def create_app(settings: Settings | None = None, *, broker: object | None = None) -> FastAPI:
    """The admin application; ``settings`` and ``broker`` are kept on ``app.state``."""
    app = FastAPIOffline(  # /docs and /redoc with their assets served from here, not a CDN
        title="compactd admin API",
        summary="Pulsar admin v2 paths served by compactd.",
        description=DESCRIPTION,
        version="0.1.0",
        swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from validator.swagger.io
    )
    app.state.settings = settings
    app.state.broker = broker
    install_error_handlers(app)
    chosen = settings if settings is not None else Settings()
    app.add_middleware(BodyLimitMiddleware, max_bytes=chosen.http_max_request_body_bytes,  # outermost
                       schema_upload_bytes=schema_upload_body_bytes(chosen))
    access = getattr(broker, "access", None)
    if not isinstance(access, AccessControl) and settings is not None:
        access = AccessControl(settings, None)
    if isinstance(access, AccessControl) and access.authentication_enabled:
        routes = [route for router in ROUTERS for route in router.routes]  # in the order they are included
        app.add_middleware(AccessMiddleware, access=access, routes=routes)  # api.auth.rest: every route but health

    @app.get(HEALTH_PATH, response_class=PlainTextResponse, tags=["brokers"],
             summary="Broker health check", responses={200: {"description": "The text `ok`."}})
    async def health() -> str:
        """Answers 200 ``ok`` while the broker serves (Pulsar's ``brokers/health``)."""
        return "ok"

    for router in ROUTERS:
        app.include_router(router)
    return app


class BodyLimitMiddleware:
    """Answers 413 ``{"reason": …}`` for a request body over ``max_bytes``, before reading
    it when its ``Content-Length`` says so, else as soon as the streamed chunks go over; a
    schema upload's limit is ``schema_upload_bytes`` (None: ``max_bytes``)."""

    def __init__(self, app: ASGIApp, max_bytes: int, schema_upload_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.schema_upload_bytes = max_bytes if schema_upload_bytes is None else schema_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        if scope.get("method") == "POST" and SCHEMA_UPLOAD_PATH.fullmatch(scope.get("path", "")):
            limit = self.schema_upload_bytes
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            reason = self._reason(declared.decode("latin-1"), limit)
            await reason_response(413, reason, {"Connection": "close"})(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, self._reason(f"more than {received}", limit),
                                        headers={"Connection": "close"})
            return message

        await self.app(scope, counted, send)

    @staticmethod
    def _reason(size: str, limit: int) -> str:
        return f"the request body of {size} bytes exceeds the limit of {limit} bytes"
