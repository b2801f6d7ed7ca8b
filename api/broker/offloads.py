"""Offload of topics' sealed ledgers to the bucket, as the broker drives it (Pulsar's tiered storage).

``TopicOffloads`` is the broker core's one handle on the ledger layer's ``Offloader``
(``ledger.offload``; None when no ``managed_ledger_offload_driver`` is set) and the one place
that reads a topic's offload policies, each per field, topic > namespace > broker setting
(Pulsar's ``OffloadPoliciesImpl.mergeConfiguration``):

* ``offloadThreshold`` (bytes) else ``managed_ledger_offload_threshold_in_bytes``;
* ``offloadDeletionLagMs`` else ``managed_ledger_offload_deletion_lag_ms``.

What it drives, and when:

* ``trigger`` — the admin ``PUT …/offload``: offload the sealed ledgers strictly before a
  message id's ledger (``Offloader.offload_prefix``; ``OffloadAlreadyRunning`` → 409);
  ``status`` reads Pulsar's ``OffloadProcessStatus`` of the last admin offload.
* ``after_seal`` — each roll-over of a topic's ledger (the managed ledger's ``on_sealed``
  hook): ``Offloader.maybe_offload`` with the topic's threshold (negative: nothing).
* ``trim_pass`` — the periodic trim pass: each loaded topic's local copies offloaded longer
  ago than its deletion lag are deleted (``Offloader.delete_local_copies``; a negative lag
  keeps them: Pulsar's documented meaning, where its code deletes at once), then objects
  no ledger references are collected after ``ORPHAN_OBJECT_GRACE_MS``.
* ``begin_stop``, ``shutdown`` — at the broker's stop: before its topics are sealed (their
  seals start no offload), then after.

Without a driver, ``trigger`` answers ``NotAllowedError`` (405) and the rest do nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from api.broker.errors import NotAllowedError
from ledger.job_status import JobStatus
from ledger.offload import Offloader
from ledger.position import Position

if TYPE_CHECKING:
    from api.broker.policies import PolicyStore
    from api.broker.topic import Topic
    from api.broker.topic_name import TopicName
    from api.config import Settings
    from ledger.managed_ledger import ManagedLedger

__all__ = ["EARLIEST", "ORPHAN_OBJECT_GRACE_MS", "TopicOffloads"]

log = logging.getLogger(__name__)

# An object under ledgers/ that no offloaded ledger references is deleted once it is this
# old: far longer than one ledger's upload and verification (a ledger is at most
# managed_ledger_max_size_per_ledger_bytes), so an upload in flight is never taken for one.
ORPHAN_OBJECT_GRACE_MS = 3_600_000
EARLIEST = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}  # Pulsar's MessageId.earliest


class TopicOffloads:
    """Offload of the broker's topics; see the module docstring."""

    def __init__(self, offloader: Offloader | None, policies: PolicyStore, settings: Settings) -> None:
        self.offloader = offloader
        self.policies = policies
        self.settings = settings
        self._stopping = threading.Event()  # the broker's stop seals every topic: no offload then

    @property
    def enabled(self) -> bool:
        return self.offloader is not None

    # -- policies ---------------------------------------------------------------------

    def _policy_or(self, name: TopicName, policy: str, broker_default: int) -> int:
        for scope in (str(name), name.namespace_name):
            value = self.policies.get_policy(scope, policy)
            if value is not None:
                return int(value)
        return broker_default

    def threshold_bytes(self, name: TopicName) -> int:
        """The topic's effective ``offloadThreshold`` (negative: no automatic offload)."""
        return self._policy_or(name, "offloadThreshold", self.settings.managed_ledger_offload_threshold_in_bytes)

    def deletion_lag_ms(self, name: TopicName) -> int:
        """The topic's effective ``offloadDeletionLagMs`` (negative: local copies kept)."""
        return self._policy_or(name, "offloadDeletionLagMs", self.settings.managed_ledger_offload_deletion_lag_ms)

    # -- admin ------------------------------------------------------------------------

    def _require(self) -> Offloader:
        if self.offloader is None:
            raise NotAllowedError("offload is not configured on this broker (--managed-ledger-offload-driver)")
        return self.offloader

    def trigger(self, topic: Topic, ledger_id: int, entry_id: int) -> None:
        """Start offloading ``topic``'s sealed ledgers before ``ledger_id`` (Pulsar's
        ``asyncOffloadPrefix``); its outcome is ``status``. ``OffloadAlreadyRunning`` while
        an admin offload of the topic runs."""
        self._require().offload_prefix(topic.ledger, Position(ledger_id, entry_id))

    def status(self, topic: Topic) -> dict[str, Any]:
        """Pulsar's ``OffloadProcessStatus`` of the topic's last admin offload (NOT_RUN
        since the broker loaded it, as Pulsar keeps it in memory)."""
        if self.offloader is None:
            return {"status": JobStatus.NOT_RUN.value, "lastError": "", "firstUnoffloadedMessage": EARLIEST}
        progress = self.offloader.status(str(topic.name))
        first = EARLIEST
        if progress.status == JobStatus.SUCCESS and progress.first_unoffloaded is not None:
            first = {"ledgerId": progress.first_unoffloaded.ledger_id,
                     "entryId": progress.first_unoffloaded.entry_id, "partitionIndex": -1}
        return {"status": progress.status.value, "lastError": progress.last_error or "",
                "firstUnoffloadedMessage": first}

    # -- what the broker calls ----------------------------------------------------------

    def on_sealed_hook(self, name: TopicName, ledger: Callable[[], ManagedLedger | None],
                       also: Callable[[int, int], None] | None) -> Callable[[int, int], None] | None:
        """The ``on_sealed`` hook of topic ``name``'s managed ledger (``ledger()`` once it is
        open): ``also`` (the key index builds), then ``after_seal``."""
        if self.offloader is None:
            return also

        def on_sealed(ledger_id: int, entries: int) -> None:
            if also is not None:
                also(ledger_id, entries)
            managed = ledger()
            if managed is not None:
                self.after_seal(name, managed)

        return on_sealed

    def after_seal(self, name: TopicName, ledger: ManagedLedger) -> None:
        """After a roll-over: offload what the topic's threshold lets go (in the background)."""
        if self.offloader is None or ledger.closed or self._stopping.is_set():
            return
        threshold = self.threshold_bytes(name)
        if threshold >= 0:
            self.offloader.maybe_offload(ledger, threshold)

    def trim_pass(self, topics: Iterable[Topic], also_live: Callable[[], Iterable[int]] = tuple) -> None:
        """Delete the local copies past each topic's deletion lag, then the orphan objects
        (``also_live()``: ledgers the layers above keep in the bucket, compacted ledgers).
        Runs on a worker thread; a failure is logged and left to the next pass."""
        if self.offloader is None:
            return
        for topic in topics:
            lag_ms = self.deletion_lag_ms(topic.name)
            if lag_ms < 0:
                continue
            try:
                deleted = self.offloader.delete_local_copies(topic.ledger, lag_ms)
            except Exception as error:  # noqa: BLE001 - the next pass tries again
                log.warning("deleting the offloaded local copies of %s: %s", topic.name, error)
                continue
            if deleted:
                log.info("topic %s: local copies of offloaded ledgers %s deleted", topic.name, deleted)
        try:
            collected = self.offloader.collect_orphan_objects(ORPHAN_OBJECT_GRACE_MS, also_live())
        except Exception as error:  # noqa: BLE001 - the next pass tries again
            log.warning("collecting unreferenced objects in the bucket: %s", error)
            return
        if collected:
            log.info("collected unreferenced objects in the bucket: %s", collected)

    def begin_stop(self) -> None:
        """The broker is stopping: the seals of its stop start no offload."""
        self._stopping.set()

    def shutdown(self) -> None:
        """Stop the offloader: running jobs end after their step, queued ones never start."""
        self._stopping.set()
        if self.offloader is not None:
            self.offloader.shutdown()
