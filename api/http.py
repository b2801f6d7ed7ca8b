"""The admin REST application (Pulsar's admin v2 paths, INTERFACES §3).

``create_app`` builds the FastAPI application from what its routes need: the settings and
the broker service, both owned by ``api.server`` (which also starts and stops the uvicorn
listener, so the application has no lifespan of its own). It adds the health check, the
routers of ``api.routers`` (one per resource) and the error handlers of ``api.errors``
(every failure answers Pulsar's ``{"reason": "…"}``). ``/docs`` and ``/openapi.json``
describe every route.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from api.config import Settings
from api.errors import install_error_handlers
from api.routers import ROUTERS

__all__ = ["HEALTH_PATH", "create_app"]

HEALTH_PATH = "/admin/v2/brokers/health"

DESCRIPTION = """\
Pulsar's admin v2 paths for topics, compaction and compaction policies, served by compactd.

Errors answer Pulsar's body `{"reason": "…"}`, naming the bad value. Topic paths name a
persistent topic as `/admin/v2/persistent/{tenant}/{namespace}/{topic}`.
"""


def create_app(settings: Settings | None = None, *, broker: object | None = None) -> FastAPI:
    """The admin application; ``settings`` and ``broker`` are kept on ``app.state``."""
    app = FastAPI(
        title="compactd admin API",
        summary="Pulsar admin v2 paths served by compactd.",
        description=DESCRIPTION,
        version="0.1.0",
    )
    app.state.settings = settings
    app.state.broker = broker
    install_error_handlers(app)

    @app.get(HEALTH_PATH, response_class=PlainTextResponse, tags=["brokers"],
             summary="Broker health check", responses={200: {"description": "The text `ok`."}})
    async def health() -> str:
        """Answers 200 ``ok`` while the broker serves (Pulsar's ``brokers/health``)."""
        return "ok"

    for router in ROUTERS:
        app.include_router(router)
    return app
