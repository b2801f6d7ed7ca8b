"""Before a Spark run over a bucket: every input ledger sealed and in the bucket.

With object storage configured (``LedgerFiles.bucket``) the Spark engine's executors share
nothing with the broker but the bucket (``compactor.spark.engine``): they read the run's
input ledgers, and their key indexes, from there. ``stage_input`` makes that true before
the job is planned:

1. the topic's current ledger is rolled over (``ManagedLedger.roll_over_now``), so that the
   run's raw input, which may end in it, lies in sealed ledgers only (an open ledger is
   never uploaded: it still changes). Decision: a Spark run over a bucket rolls the topic
   as a size or time limit would; the next ledger takes the appends meanwhile;
2. each raw input ledger not yet offloaded is offloaded as any offload is (the ledger and
   its sidecars uploaded, read back for size and CRC32C: ``LedgerFiles.upload_sealed``;
   then recorded offloaded in one metadata transaction: ``ManagedLedger.record_offloaded``), its local
   copy kept: it then follows the deletion lag like any offloaded ledger, and the orphan
   collection leaves its objects;
3. each compacted input ledger (the previous view's) that has no object yet — a view the
   local engine wrote — is uploaded and verified (``LedgerFiles.upload_sealed``); it is
   not a row of the ``ledgers`` table, its manifest keeps it alive (the bucket's copy goes
   with the local file when the view is replaced and swept: ``LedgerStore.delete``).

Transient bucket failures (the bucket's 5xx, timeouts, resets, a copy that read back
wrong) and a busy metadata store are retried with exponential backoff, by the broker's
Offloader's own loop (``ledger.offload.retry_transient``, ``OffloadRetry``); what outlasts
it fails the run.

Every step is idempotent: a run that fails after it leaves ledgers offloaded as an
offload would, which the next run finds done. A run killed at any step leaves each input
ledger recorded offloaded with a verified copy, or whole in the data dir; an object
uploaded but never recorded is an orphan that ``Offloader.collect_orphan_objects``
removes after its grace period.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from compactor.engine import LedgerRange
from ledger.errors import LedgerIOError
from ledger.managed_ledger import ManagedLedger
from ledger.offload import OffloadRetry, retry_transient
from ledger.storage.powers import LedgerFiles

if TYPE_CHECKING:
    from ledger.storage.object_fs import BucketConfig

__all__ = ["stage_input"]

log = logging.getLogger(__name__)

STAGING_RETRY = OffloadRetry()
"""The staging steps' tries and backoff: the broker's offloads' (``ledger.offload``)."""


def stage_input(ledger: ManagedLedger, files: LedgerFiles, bucket: BucketConfig, ranges: Sequence[LedgerRange],
                *, now_ms: int, retry: OffloadRetry = STAGING_RETRY) -> None:
    """Make every ledger of ``ranges`` sealed and present in ``bucket`` (module docstring),
    each bucket step and record tried again on a transient failure as ``retry`` says.
    Raises what an upload or the roll-over raised (the run fails; nothing is published)."""
    ledger.roll_over_now()
    offloaded = {record.ledger_id for record in ledger.metadata.topic_ledgers(ledger.name) if record.offloaded}
    raw = sorted({whole.ledger_id for whole in ranges if not whole.compacted} - offloaded)
    for ledger_id in raw:
        _offload(files, ledger, ledger_id, now_ms, retry)
    compacted = sorted({whole.ledger_id for whole in ranges if whole.compacted})
    missing = retry_transient(f"listing of compacted ledgers {compacted}", lambda: _without_object(bucket, compacted),
                              retry)
    for ledger_id in missing:
        retry_transient(f"upload of compacted ledger {ledger_id}", functools.partial(files.upload_sealed, ledger_id),
                        retry)
    if raw or compacted:
        log.info("%s: spark input staged in %s: offloaded %s, compacted ledgers %s", ledger.name, bucket.to_url(),
                 raw, compacted)


def _offload(files: LedgerFiles, ledger: ManagedLedger, ledger_id: int, now_ms: int, retry: OffloadRetry) -> None:
    """Offload one sealed raw ledger, keeping its local copy: upload and read back
    (``LedgerFiles.upload_sealed``), then record it offloaded (one transaction)."""
    retry_transient(f"upload of ledger {ledger_id}", functools.partial(files.upload_sealed, ledger_id), retry)
    retry_transient(f"record of ledger {ledger_id}", functools.partial(ledger.record_offloaded, ledger_id, now_ms),
                    retry)


def _without_object(bucket: BucketConfig, ledger_ids: list[int]) -> list[int]:
    """Those of ``ledger_ids`` with no ledger object in ``bucket`` (one listing call);
    ``LedgerIOError`` (retriable) when the bucket cannot be asked."""
    import pyarrow.fs as pafs  # here: importing the runner loads no pyarrow

    from ledger.storage.bucket import ledger_object_name

    if not ledger_ids:
        return []
    try:
        infos = bucket.open().get_file_info([f"{bucket.base}/{ledger_object_name(ledger_id)}"
                                             for ledger_id in ledger_ids])
    except OSError as error:
        raise LedgerIOError(f"cannot list {bucket.to_url()}: {error}") from error
    return [ledger_id for ledger_id, info in zip(ledger_ids, infos, strict=True) if info.type == pafs.FileType.NotFound]
