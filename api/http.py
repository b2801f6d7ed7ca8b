"""The admin REST application (Pulsar's admin v2 paths, INTERFACES §3).

``create_app`` builds the FastAPI application from what its routes need: the settings and
the broker service, both owned by ``api.server`` (which also starts and stops the uvicorn
listener, so the application has no lifespan of its own). For now it answers only the
health check; the REST routers are added here, one per resource, as they land.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from api.config import Settings

__all__ = ["HEALTH_PATH", "create_app"]

HEALTH_PATH = "/admin/v2/brokers/health"


def create_app(settings: Settings | None = None, *, broker: object | None = None) -> FastAPI:
    """The admin application; ``settings`` and ``broker`` are kept on ``app.state``."""
    app = FastAPI(
        title="compactd admin API",
        summary="Pulsar admin v2 paths served by compactd.",
        version="0.1.0",
    )
    app.state.settings = settings
    app.state.broker = broker

    @app.get(HEALTH_PATH, response_class=PlainTextResponse, tags=["brokers"],
             summary="Broker health check", responses={200: {"description": "The text `ok`."}})
    async def health() -> str:
        """Answers 200 ``ok`` while the broker serves (Pulsar's ``brokers/health``)."""
        return "ok"

    return app
