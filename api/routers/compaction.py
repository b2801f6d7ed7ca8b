"""Compaction of one topic: trigger a run, read the status of the last or current run.

A trigger starts the run in the background and answers at once (204); the run's outcome
is the status, which is persisted, so it survives a broker restart (a run cut short by a
stop reads ERROR).
"""

from __future__ import annotations

from fastapi import APIRouter

from api.routers.common import TOPIC_PATH, AdminDependency, TopicFromPath, errors, no_content
from api.schemas import CompactionStatus

__all__ = ["router"]

router = APIRouter(tags=["compaction"])

COMPACTION_PATH = TOPIC_PATH + "/compaction"


@no_content(router.put, COMPACTION_PATH, "Trigger a compaction",
            errors(404, 412, 409, c409="`Compaction already in progress`."),
            done="The run started; poll its status.")
async def trigger_compaction(admin: AdminDependency, topic: TopicFromPath) -> None:
    """Start a compaction run of the topic in the background (it waits for a free run slot
    when `compaction_max_concurrent_runs` are running)."""
    admin.trigger_compaction(topic)
    await admin.compaction_status_written(topic)


@router.get(
    COMPACTION_PATH, response_model=CompactionStatus,
    summary="Status of the last compaction",
    responses={200: {"description": "NOT_RUN, RUNNING, SUCCESS or ERROR, with the last error."},
               **errors(404, 412)},
)
async def compaction_status(admin: AdminDependency, topic: TopicFromPath) -> CompactionStatus:
    """Pulsar's `LongRunningProcessStatus` of the topic's last or current run."""
    return CompactionStatus.model_validate(admin.compaction_status(topic))
