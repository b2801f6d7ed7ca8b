"""Admin operations of the broker core, what the REST API and the CLI call.

Everything here works on plain values and raises the broker's typed errors; the REST layer
only parses, calls and shapes (``api/http.py`` maps errors to HTTP codes in one place).
Operations that commit (create, delete, policies) are coroutines: what they commit runs on a
worker thread, awaited; the REST layer also calls ``preload`` (a topic loaded off the loop
before an operation on it).

* Topics: create (``TopicExistsError`` when it exists), delete (its ledgers and its
  compacted ledger; refused while clients are attached, as Pulsar refuses without force),
  list per namespace.
* Compaction: ``trigger_compaction`` queues a run on the broker's run executor
  (``compactor.runs.runs.CompactionRuns``; ``TopicNotFoundError``, ``CompactionInProgressError``);
  the executor persists its status — NOT_RUN, RUNNING, SUCCESS, ERROR with ``lastError``
  — so it survives a restart (a run cut short by a stop reads ERROR afterwards), and is the
  one answer to "is a run in flight?" that topic and ``__compaction`` deletion ask.
* Policies per topic and per namespace, by name: ``compactionThreshold`` and
  ``deduplicationEnabled`` (Pulsar's) and, beyond Pulsar, ``minCleanableDirtyRatio``,
  ``maxCompactionLagMs``, ``deleteRetentionMs``, ``minCompactionLagMs`` and
  ``compactionMaxBytesPerSecond`` (Kafka's). The caller validates values;
  a change of ``deduplicationEnabled`` applies to the loaded topics at once.
* Offload: ``trigger_offload`` and ``offload_status`` (Pulsar's ``PUT``/``GET …/offload``),
  carried out by ``api.broker.offloads.TopicOffloads``; the two offload policies
  ``offloadThreshold`` and ``offloadDeletionLagMs`` are Pulsar's.
* ``stats`` and ``internal_stats`` in Pulsar's JSON shapes (the fields compactd can fill).
  They never fail on what a topic holds: a cursor name or property key that is not text
  (a broker before wire validation stored what upb gave it for a non-UTF-8 string: bytes)
  is shown with its bad bytes escaped (``sub-\\xff``).
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from api.broker.admin_topics import TopicOperations
from api.broker.dedup import DEDUP_CURSOR
from api.broker.errors import (
    NotAllowedError,
    PreconditionFailedError,
    TopicExistsError,
    TopicNotFoundError,
)
from api.broker.off_loop import write_off_loop
from api.broker.topic import Topic
from api.broker.topic_name import TopicName
from compactor.view.topic import COMPACTION_SUBSCRIPTION
from cursor.cursor import ManagedCursor
from ledger.errors import CompactionServiceError

if TYPE_CHECKING:
    from api.broker.offloads import TopicOffloads
    from api.broker.partitions import PartitionedTopics
    from api.broker.policies import PolicyStore
    from api.broker.registry import TopicRegistry
    from api.broker.tenants import Tenants
    from compactor.runs.runs import CompactionRuns
    from ledger.data_dir import DataDir

__all__ = ["POLICY_NAMES", "Admin", "AdminBroker"]

log = logging.getLogger(__name__)

POLICY_NAMES = ("compactionThreshold", "minCleanableDirtyRatio", "maxCompactionLagMs", "deleteRetentionMs",
                "deduplicationEnabled", "minCompactionLagMs", "compactionMaxBytesPerSecond", "offloadThreshold",
                "offloadDeletionLagMs")


def _shown(name: object) -> str:
    """A stored name as stats show it: text as is, bytes decoded with bad bytes escaped."""
    if isinstance(name, bytes):
        return name.decode("utf-8", "backslashreplace")
    return str(name)


class AdminBroker(Protocol):
    """What admin operations need of the broker core (``api.broker.service.BrokerService``,
    which holds the ``Admin``: named here so that this module does not import it back)."""

    data_dir: DataDir
    policies: PolicyStore
    registry: TopicRegistry  # which topics are loaded, loading, closing, deleted: its alone
    runs: CompactionRuns
    tenants: Tenants
    partitioned: PartitionedTopics
    offloads: TopicOffloads

    def get_topic(self, text: str, *, create: bool = True) -> Topic:
        """The loaded topic named ``text``, loading or creating it."""

    async def settle_loads(self, keys: list[str] | None = None) -> None:
        """Wait for the loads in flight of ``keys`` (None: all) to end and be published."""

    async def load_topic(self, text: str, *, create: bool = True) -> Topic:
        """``get_topic`` with the load off the event loop."""

    async def unload_topic(self, topic: Topic) -> None:
        """Drop ``topic`` from ``topics`` and close it off the event loop."""

    def list_topics(self, namespace: str) -> list[str]:
        """Every topic of ``tenant/namespace``."""

    async def refresh_deduplication(self) -> None:
        """Apply a changed ``deduplicationEnabled`` policy to every loaded topic (each start
        off the loop), awaited."""

    def request_compaction(self, text: str) -> None:
        """Queue a run of the existing topic ``text`` on ``runs``."""


class Admin:
    """Admin operations over one broker core; call on the broker's event loop."""

    def __init__(self, broker: AdminBroker) -> None:
        self.broker = broker
        self.metadata = broker.data_dir.metadata

    # -- topics ---------------------------------------------------------------------

    async def create_topic(self, text: str) -> str:
        """Create the topic ``text`` (``TopicExistsError`` when it exists, as a topic or a
        partitioned parent) with its first load (its first ledger, internal cursors) off the
        loop; a creation in flight of the same name is an existing topic."""
        name = str(TopicName.parse(text))
        if self.broker.registry.is_loading(name) and not self.metadata.topic_exists(name):
            raise TopicExistsError(f"Topic {name} already exists")
        if self.broker.partitioned.is_parent(TopicName.parse(name)):
            raise TopicExistsError(f"Topic {name} already exists as a partitioned topic")
        if self.metadata.topic_exists(name):
            raise TopicExistsError(f"Topic {name} already exists")
        await self.broker.load_topic(name)
        return name

    def topic(self, text: str) -> Topic:
        """The existing topic ``text`` (loaded if needed); ``TopicNotFoundError`` otherwise."""
        return self.broker.get_topic(text, create=False)

    async def preload(self, text: str) -> None:
        """Load the existing topic ``text`` off the loop when it is not loaded (of a
        partitioned parent: its partitions ever opened), so that the operation that follows
        finds it loaded; a refusal is left to that operation, which meets it again."""
        try:
            name = TopicName.parse(text)
        except CompactionServiceError:
            return
        names = ([str(name)] if not self.broker.partitioned.is_parent(name) else
                 [p for p in self.broker.partitioned.partition_names(name) if self.metadata.topic_ledgers(p)])
        for each in names:
            if self.broker.registry.get(each) is None and self.metadata.topic_exists(each):
                with contextlib.suppress(CompactionServiceError):
                    await self.broker.load_topic(each, create=False)

    def check_namespace(self, name: TopicName) -> None:
        """``TopicNotFoundError`` (404) unless the namespace of ``name`` exists."""
        self.broker.tenants.check_namespace(name)

    def check_deletable(self, text: str) -> None:
        """Refuse deleting the topic while clients are attached (412) or a run is in flight (409)."""
        topic = self.topic(text)
        if any(s.consumers for s in topic.subscriptions.values()) or topic.producers_connected():
            raise PreconditionFailedError(f"Topic {topic.name} has active producers or consumers")
        self.broker.runs.check_delete(str(topic.name))

    async def delete_topic(self, text: str) -> None:
        """Delete the topic ``text``, refused while clients are attached (412) or a run is in
        flight (409), with the deletion itself (its transaction — the topic's ledgers,
        cursors and every other row of it — and its files) on a worker thread, once a
        de-duplication start in flight has ended; while it runs, loading the topic is
        refused (``TopicRegistry.delete``)."""
        topic = self.topic(text)
        if any(s.consumers for s in topic.subscriptions.values()) or topic.producers_connected():
            raise PreconditionFailedError(f"Topic {topic.name} has active producers or consumers")
        self.broker.runs.check_delete(str(topic.name))  # refused while running or waiting for a slot
        await self.broker.registry.delete(topic)

    def list_topics(self, namespace: str) -> list[str]:
        return self.broker.list_topics(namespace)

    def delete_subscription(self, text: str, subscription: str) -> Future[None]:
        """Delete ``subscription``; a future of the moment its deletion is durable."""
        topic = self.topic(text)
        if subscription == DEDUP_CURSOR:
            raise TopicNotFoundError(f"Subscription {subscription} not found")
        if subscription == COMPACTION_SUBSCRIPTION:
            self.broker.runs.check_delete(str(topic.name), view_only=True)  # refused while running
        return topic.delete_subscription(subscription)

    # -- compaction -----------------------------------------------------------------

    def trigger_compaction(self, text: str) -> None:
        """Queue a run now, in the background; its outcome lands in the status. On a
        partitioned parent, a run of every partition (``PartitionedTopics.compact``)."""
        name = TopicName.parse(text)
        if self.broker.partitioned.is_parent(name):
            self.broker.partitioned.compact(self, name)
            return
        self.broker.request_compaction(str(self.topic(text).name))

    async def compaction_status_written(self, text: str) -> None:
        """Wait until the statuses a trigger of ``text`` led to are written (a trigger
        answers once its RUNNING would survive a restart; a partitioned parent's: its
        partitions')."""
        name = TopicName.parse(text)
        if not self.broker.partitioned.is_parent(name):
            await self.broker.runs.written(str(name))
            return
        for partition in self.broker.partitioned.partition_names(name):
            await self.broker.runs.written(partition)

    def compaction_status(self, text: str) -> dict[str, str]:
        """``{"status": …, "lastError": …}`` as Pulsar's LongRunningProcessStatus (of a
        partitioned parent: its partitions' statuses summed up, ``PartitionedTopics``)."""
        name = TopicName.parse(text)
        if self.broker.partitioned.is_parent(name):
            return self.broker.partitioned.compaction_status(self, name)
        status, last_error = self.broker.runs.status(str(self.topic(text).name))
        return {"status": status, "lastError": last_error}

    # -- offload --------------------------------------------------------------------

    def trigger_offload(self, text: str, ledger_id: int, entry_id: int) -> None:
        """Start offloading the topic's sealed ledgers before ``ledger_id`` in the
        background (``api.broker.offloads``): ``OffloadAlreadyRunning`` (409) while an admin
        offload of it runs, ``NotAllowedError`` (405) without a driver or on a partitioned
        parent (offload each partition)."""
        if self.broker.partitioned.is_parent(TopicName.parse(text)):
            raise NotAllowedError(f"{TopicName.parse(text)} is a partitioned topic: offload each of its partitions")
        self.broker.offloads.trigger(self.topic(text), ledger_id, entry_id)

    def offload_status(self, text: str) -> dict[str, Any]:
        """Pulsar's ``OffloadProcessStatus`` of the topic's last admin offload."""
        if self.broker.partitioned.is_parent(TopicName.parse(text)):
            raise NotAllowedError(f"{TopicName.parse(text)} is a partitioned topic: ask each of its partitions")
        return self.broker.offloads.status(self.topic(text))

    async def wait_for_runs(self) -> None:
        """Wait until no run is queued or running (tests)."""
        await self.broker.runs.wait_idle()

    # -- policies -------------------------------------------------------------------

    def topic_scope(self, text: str) -> str:
        name = TopicName.parse(text)
        if self.broker.partitioned.is_parent(name):  # its policies apply to its partitions
            return str(name)
        return str(self.topic(text).name)

    @staticmethod
    def namespace_scope(tenant: str, namespace: str) -> str:
        TopicName.parse(f"persistent://{tenant}/{namespace}/x")  # validates both parts
        return f"{tenant}/{namespace}"

    def get_policy(self, scope: str, name: str) -> Any:
        assert name in POLICY_NAMES
        return self.broker.policies.get_policy(scope, name)

    async def set_policy(self, scope: str, name: str, value: Any) -> None:
        """Set policy ``name`` of ``scope``, its commit on the metadata writer thread
        (``api.broker.off_loop``); a ``deduplicationEnabled`` applies to the loaded topics
        (their starts off the loop) before this returns."""
        assert name in POLICY_NAMES
        await write_off_loop(self.broker.policies.set_policy, scope, name, value)
        if name == "deduplicationEnabled":
            await self.broker.refresh_deduplication()

    async def remove_policy(self, scope: str, name: str) -> None:
        """Remove policy ``name`` of ``scope`` (it falls back), as ``set_policy`` sets it."""
        assert name in POLICY_NAMES
        await write_off_loop(self.broker.policies.remove_policy, scope, name)
        if name == "deduplicationEnabled":
            await self.broker.refresh_deduplication()

    # -- stats ------------------------------------------------------------------------

    def stats(self, text: str) -> dict[str, Any]:
        """Pulsar's topic stats (the fields compactd keeps), with the compaction section:
        ``api.broker.admin_topics.TopicOperations.stats``."""
        return TopicOperations(self).stats(text)

    def internal_stats(self, text: str) -> dict[str, Any]:
        """Pulsar's internal stats: ledgers, cursors with properties, the compacted ledger."""
        topic = self.topic(text)
        ledger = topic.ledger
        ledgers = ledger.ledger_list()
        cursors = {}
        for name in self._subscription_names(topic, internal=True):
            cursor = self._cursor(topic, name)
            cursors[_shown(name)] = {
                "markDeletePosition": str(cursor.mark_delete_position),
                "readPosition": str(cursor.read_position),
                "individuallyDeletedMessages": cursor.acked_ranges.to_pulsar_string(),
                "messagesConsumedCounter": cursor.messages_consumed_counter,
                "cursorLedger": -1,
                "state": "Open",
                "properties": {_shown(key): value for key, value in cursor.properties.items()},
            }
        view = topic.compacted.view
        compacted: dict[str, Any] = {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False,
                                     "underReplicated": False}
        if view is not None:
            compacted.update(ledgerId=view.ledger_id, entries=view.entries, size=view.size, ledgers=[
                {"ledgerId": ledger_id, "entries": entries, "size": size,
                 "deadMessages": marks.dead_messages if (marks := view.marks_of(ledger_id)) is not None else 0}
                for (ledger_id, entries), size in zip(view.live_segments, view.sizes, strict=True)])
        return {
            "entriesAddedCounter": ledger.entries_added_counter,
            "numberOfEntries": ledger.number_of_entries,
            "totalSize": ledger.total_size,
            "currentLedgerEntries": ledgers[-1].entries if ledgers else 0,
            "currentLedgerSize": ledgers[-1].size_bytes if ledgers else 0,
            "lastConfirmedEntry": str(ledger.last_confirmed_position()),
            "state": "LedgerOpened",
            "ledgers": [{"ledgerId": r.ledger_id, "entries": r.entries, "size": r.size_bytes,
                         "offloaded": r.offloaded} for r in ledgers],
            "cursors": cursors,
            "compactedLedger": compacted,
        }

    def _subscription_names(self, topic: Topic, *, internal: bool = False) -> list[str]:
        names = set(topic.cursors.list(str(topic.name)))
        names |= {name for name, s in topic.subscriptions.items() if s.cursor.durable}
        if not internal:
            names.discard(DEDUP_CURSOR)
        return sorted(names, key=_shown)

    @staticmethod
    def _cursor(topic: Topic, name: str) -> ManagedCursor:
        live = topic.subscriptions.get(name)
        return live.cursor if live is not None else ManagedCursor.open_durable(topic.ledger, name, store=topic.cursors)
