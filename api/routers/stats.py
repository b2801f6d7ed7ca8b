"""Observability: a topic's stats and internal stats (Pulsar's shapes), broker metrics.

``/metrics`` answers what ``api.metrics.render`` makes of the broker: Prometheus text,
including the ``pulsar_compaction_*`` family.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api import metrics
from api.routers.common import TOPIC_PATH, AdminDependency, TopicFromPath, errors
from api.schemas import InternalStats, TopicStats

__all__ = ["router"]

router = APIRouter(tags=["stats"])


@router.get(
    TOPIC_PATH + "/stats", response_model=TopicStats,
    summary="Topic stats",
    responses={200: {"description": "Pulsar's topic stats, with the `compaction` section."}, **errors(404, 412)},
)
async def topic_stats(admin: AdminDependency, topic: TopicFromPath) -> TopicStats:
    """Counters, subscriptions and the last compaction's figures (removed events, success
    and failure timestamps, duration)."""
    return TopicStats.model_validate(admin.stats(topic))


@router.get(
    TOPIC_PATH + "/internalStats", response_model=InternalStats,
    summary="Topic internal stats",
    responses={200: {"description": "Pulsar's internal stats: ledgers, cursors, compacted ledger."},
               **errors(404, 412)},
)
async def internal_stats(admin: AdminDependency, topic: TopicFromPath) -> InternalStats:
    """The managed ledger's ledgers, each cursor's positions and properties, and the
    compacted ledger (`ledgerId`, `entries`, `size` all -1 when there is none)."""
    return InternalStats.model_validate(admin.internal_stats(topic))


@router.get(
    "/metrics", response_class=Response, tags=["metrics"],
    summary="Prometheus metrics",
    responses={200: {"description": "Prometheus text exposition, with the `pulsar_compaction_*` family.",
                     "content": {"text/plain": {"schema": {"type": "string"}}}},
               **errors(503)},
)
async def prometheus_metrics(request: Request, _admin: AdminDependency) -> Response:
    """Broker and compaction metrics for Prometheus to scrape (503 without a broker, like
    every other route)."""
    body, content_type = metrics.render(request.app.state.broker)
    return Response(content=body, media_type=content_type)
