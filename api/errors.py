"""Errors into HTTP answers, in one place: every failure answers Pulsar's ``{"reason": "…"}``.

Domain errors (STYLE P4) map to Pulsar's admin status codes::

    InvalidTopicNameError       412  (Pulsar: "Topic name is not valid")
    InvalidPartitionCountError  406  (a partition count of 0 or less, or over the limit)
    TopicNotFoundError          404
    SubscriptionNotFoundError   404
    TopicExistsError            409
    CompactionInProgressError   409  ("Compaction already in progress")
    OffloadAlreadyRunning       409  ("Offload already running")
    ConsumerBusyError           409
    PreconditionFailedError     412  (e.g. deleting a topic with clients attached)
    NotAllowedError             405  (pulsar-admin's NotAllowedException)
    other BrokerError           400
    a retriable error           503  (storage full or busy: the same request may succeed
                                      later; the reason says why)
    other CompactionServiceError 500 (logged; the reason is the error's message)

A request that fails validation answers 412 when a value is well-typed but out of range
(Pulsar: "compactionThreshold must be 0 or more") and 400 otherwise (not JSON, wrong type,
missing); the reason names the field and the value. Starlette's own errors (unknown path,
method not allowed) keep their status with a reason. Anything else is a bug: it is logged
with its traceback and answers 500 with a reason that carries no traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.broker.errors import (
    BrokerError,
    ConsumerBusyError,
    InvalidTopicNameError,
    NotAllowedError,
    PreconditionFailedError,
    StorageUnavailableError,
    SubscriptionNotFoundError,
    TopicExistsError,
    TopicNotFoundError,
)
from api.broker.partitions import InvalidPartitionCountError
from compactor.errors import CompactionInProgressError
from ledger.errors import CompactionServiceError
from ledger.offload import OffloadAlreadyRunning

__all__ = ["STATUS_BY_ERROR", "install_error_handlers", "reason_response", "status_of"]

log = logging.getLogger(__name__)

# Most specific first: the first class an error is an instance of gives its status.
STATUS_BY_ERROR: tuple[tuple[type[CompactionServiceError], int], ...] = (
    (InvalidTopicNameError, 412),
    (InvalidPartitionCountError, 406),
    (TopicNotFoundError, 404),
    (SubscriptionNotFoundError, 404),
    (TopicExistsError, 409),
    (CompactionInProgressError, 409),
    (OffloadAlreadyRunning, 409),
    (ConsumerBusyError, 409),
    (PreconditionFailedError, 412),
    (StorageUnavailableError, 503),
    (NotAllowedError, 405),
    (BrokerError, 400),
)
# Pydantic error types for a value of the right type outside its bounds: Pulsar answers
# those 412 ("value is not valid"); a value of the wrong type is a malformed request, 400.
OUT_OF_RANGE_ERRORS = frozenset({
    "greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number",
})
# A reason quotes at most this much of a bad value, so a huge body never comes back whole.
REASON_VALUE_CHARS_MAX = 200


def status_of(error: CompactionServiceError) -> int:
    """The HTTP status of a domain error (500 for one that is not a refused request)."""
    for error_type, status in STATUS_BY_ERROR:
        if isinstance(error, error_type):
            return status
    return 503 if error.retriable else 500


def reason_response(status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """Pulsar's error answer."""
    return JSONResponse({"reason": reason}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers on ``app`` and wrap it in the catch-all for unexpected errors."""
    app.add_exception_handler(CompactionServiceError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_middleware(CatchAllMiddleware)


async def _domain_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, CompactionServiceError)
    status = status_of(error)
    if status == 503:
        log.warning("admin request refused for now: %s: %s", type(error).__name__, error)
    elif status >= 500:
        log.error("admin request failed: %s: %s", type(error).__name__, error)
    return reason_response(status, str(error) or type(error).__name__)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    details = list(error.errors())
    status = 412 if details and all(d.get("type") in OUT_OF_RANGE_ERRORS for d in details) else 400
    # A bare JSON body (a policy value) is named after the resource it sets: the path's end.
    body_name = request.url.path.rstrip("/").rsplit("/", 1)[-1]
    return reason_response(status, validation_reason(details, body_name=body_name))


def validation_reason(details: Sequence[Any], *, body_name: str = "body") -> str:
    """One clause per failed check: the value given, what it was for, what was wrong."""
    parts = []
    for detail in details:
        # ("body",) is the bare body; ("body", 0) a JSON error in it; ("query", "x") a parameter
        inner = [str(part) for part in detail.get("loc", ())[1:] if not isinstance(part, int)]
        name = ".".join(inner) or body_name
        kind, message = detail.get("type"), detail.get("msg", "invalid")
        if kind == "missing":
            parts.append(f"a value for {name} is required")
        elif kind == "json_invalid":
            parts.append(f"the body for {name} is not valid JSON: {detail.get('ctx', {}).get('error', message)}")
        else:
            parts.append(f"Invalid value {_quote(detail.get('input'))} for {name}: {message}")
    return "; ".join(parts) or "invalid request"


def _quote(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > REASON_VALUE_CHARS_MAX:
        text = text[:REASON_VALUE_CHARS_MAX] + "…"
    return text


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    reason = str(error.detail)
    if error.status_code == 400 and "parsing the body" in reason:  # FastAPI's: not JSON at all
        reason = f"the body of {request.method} {request.url.path} is not valid JSON"
    return reason_response(error.status_code, reason, dict(error.headers or {}))


class CatchAllMiddleware:
    """Answers 500 ``{"reason": …}`` for an exception no handler took, logged with its
    traceback; unlike Starlette's last-resort handler it does not re-raise, so the server
    logs it once and the client never sees a traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception as error:
            log.exception("admin request %s %s failed", scope.get("method"), scope.get("path"))
            if started:  # the answer is under way: nothing better to do than cut it
                raise
            response = reason_response(500, f"Internal error: {type(error).__name__}")
            await response(scope, receive, send)
