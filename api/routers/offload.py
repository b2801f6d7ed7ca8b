"""Offload of one topic's sealed ledgers to the bucket: trigger one, read its status (Pulsar's paths).

``PUT …/offload`` with a message id (Pulsar's ``MessageIdImpl`` JSON) starts offloading every
sealed ledger strictly before that message's ledger and answers 204 at once; 409 while an
admin offload of the topic runs, 405 when the broker has no offload driver. What goes wrong
later (an invalid position, the bucket failing) is the status: ``ERROR`` with ``lastError``.
``GET …/offload`` answers Pulsar's ``OffloadProcessStatus`` (in memory, as Pulsar's: NOT_RUN
after the topic was loaded).
"""

from __future__ import annotations

from fastapi import APIRouter

from api.routers.common import TOPIC_PATH, AdminDependency, TopicFromPath, errors, no_content
from api.schemas import OffloadProcessStatus, OffloadRequest

__all__ = ["router"]

router = APIRouter(tags=["offload"])

OFFLOAD_PATH = TOPIC_PATH + "/offload"


@no_content(router.put, OFFLOAD_PATH, "Offload the ledgers before a message",
            errors(400, 404, 405, 409, 412, c409="`Offload already running`.",
                   c405="No offload driver is configured, or the topic is a partitioned parent."),
            done="The offload started; poll its status.")
async def trigger_offload(admin: AdminDependency, topic: TopicFromPath, message_id: OffloadRequest) -> None:
    """Offload, oldest first, every sealed ledger of the topic whose id is smaller than
    `ledgerId` (already offloaded and empty ones are skipped; the ledger being written never
    goes), in the background."""
    admin.trigger_offload(topic, message_id.ledgerId, message_id.entryId)


@router.get(
    OFFLOAD_PATH, response_model=OffloadProcessStatus,
    summary="Status of the last offload",
    responses={200: {"description": "NOT_RUN, RUNNING, SUCCESS or ERROR, with the last error and the "
                                    "first message not offloaded."},
               **errors(404, 405, 412)},
)
async def offload_status(admin: AdminDependency, topic: TopicFromPath) -> OffloadProcessStatus:
    """Pulsar's `OffloadProcessStatus` of the topic's last offload triggered here."""
    return OffloadProcessStatus.model_validate(admin.offload_status(topic))
