"""Admin operations of the broker core, what the REST API and the CLI call.

Everything here works on plain values and raises the broker's typed errors; the REST layer
only parses, calls and shapes (``api/http.py`` maps errors to HTTP codes in one place).

* Topics: create (``TopicExistsError`` when it exists), delete (its ledgers and its
  compacted ledger; refused while clients are attached, as Pulsar refuses without force),
  list per namespace.
* Compaction: ``trigger_compaction`` starts a run in the background (``TopicNotFoundError``,
  ``CompactionInProgressError``); its status — NOT_RUN, RUNNING, SUCCESS, ERROR with
  ``lastError`` — is persisted, so it survives a restart (a run cut short by a stop reads
  ERROR afterwards).
* Policies per topic and per namespace, by name: ``compactionThreshold`` and
  ``deduplicationEnabled`` (Pulsar's) and, beyond Pulsar, ``minCleanableDirtyRatio``,
  ``maxCompactionLagMs`` and ``deleteRetentionMs`` (Kafka's). The caller validates values;
  a change of ``deduplicationEnabled`` applies to the loaded topics at once.
* ``stats`` and ``internal_stats`` in Pulsar's JSON shapes (the fields compactd can fill).
  They never fail on what a topic holds: a cursor name or property key that is not text
  (a broker before wire validation stored what upb gave it for a non-UTF-8 string: bytes)
  is shown with its bad bytes escaped (``sub-\\xff``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from api.broker.dedup import DEDUP_CURSOR
from api.broker.errors import PreconditionFailedError, TopicExistsError, TopicNotFoundError
from api.broker.topic import Topic
from api.broker.topic_name import TopicName
from compactor.errors import CompactionInProgressError
from compactor.topic import COMPACTION_SUBSCRIPTION
from cursor.cursor import ManagedCursor

if TYPE_CHECKING:
    from api.broker.policies import PolicyStore
    from compactor.record import RunFigures
    from ledger.data_dir import DataDir

__all__ = ["POLICY_NAMES", "Admin", "AdminBroker"]

log = logging.getLogger(__name__)

POLICY_NAMES = ("compactionThreshold", "minCleanableDirtyRatio", "maxCompactionLagMs", "deleteRetentionMs",
                "deduplicationEnabled")
INTERRUPTED = "the broker stopped during the run"


def _shown(name: object) -> str:
    """A stored name as stats show it: text as is, bytes decoded with bad bytes escaped."""
    if isinstance(name, bytes):
        return name.decode("utf-8", "backslashreplace")
    return str(name)


def _now_ms() -> int:
    return int(time.time() * 1000)


class AdminBroker(Protocol):
    """What admin operations need of the broker core (``api.broker.service.BrokerService``,
    which holds the ``Admin``: named here so that this module does not import it back)."""

    data_dir: DataDir
    policies: PolicyStore
    topics: dict[str, Topic]

    def get_topic(self, text: str, *, create: bool = True) -> Topic:
        """The loaded topic named ``text``, loading or creating it."""

    def list_topics(self, namespace: str) -> list[str]:
        """Every topic of ``tenant/namespace``."""

    def refresh_deduplication(self) -> None:
        """Apply a changed ``deduplicationEnabled`` policy to every loaded topic."""

    async def compact(self, text: str) -> RunFigures:
        """Run one compaction of the topic, then trim what it covered."""


class Admin:
    """Admin operations over one broker core; call on the broker's event loop."""

    def __init__(self, broker: AdminBroker) -> None:
        self.broker = broker
        self.metadata = broker.data_dir.metadata
        self._runs: dict[str, asyncio.Task[None]] = {}
        self.metadata.interrupted_compactions("ERROR", INTERRUPTED, _now_ms())

    # -- topics ---------------------------------------------------------------------

    def create_topic(self, text: str) -> str:
        name = str(TopicName.parse(text))
        if self.metadata.topic_exists(name):
            raise TopicExistsError(f"Topic {name} already exists")
        self.broker.get_topic(name)
        return name

    def topic(self, text: str) -> Topic:
        """The existing topic ``text`` (loaded if needed); ``TopicNotFoundError`` otherwise."""
        return self.broker.get_topic(text, create=False)

    def delete_topic(self, text: str) -> None:
        topic = self.topic(text)
        if any(s.consumers for s in topic.subscriptions.values()) or topic.producers_connected():
            raise PreconditionFailedError(f"Topic {topic.name} has active producers or consumers")
        queued = self._runs.get(str(topic.name))
        if topic.compacted.running or (queued is not None and not queued.done()):
            raise CompactionInProgressError(str(topic.name))  # running, or waiting for a run slot
        self.broker.topics.pop(str(topic.name), None)
        topic.delete()

    def list_topics(self, namespace: str) -> list[str]:
        return self.broker.list_topics(namespace)

    def delete_subscription(self, text: str, subscription: str) -> None:
        topic = self.topic(text)
        if subscription == DEDUP_CURSOR:
            raise TopicNotFoundError(f"Subscription {subscription} not found")
        if subscription == COMPACTION_SUBSCRIPTION and topic.compacted.running:
            # dropping the view waits for the run (a thread); refuse rather than block the loop
            raise CompactionInProgressError(str(topic.name))
        topic.delete_subscription(subscription)

    # -- compaction -----------------------------------------------------------------

    def trigger_compaction(self, text: str) -> None:
        """Start a run now, in the background; its outcome lands in the status."""
        topic = self.topic(text)
        name = str(topic.name)
        running = self._runs.get(name)
        if topic.compacted.running or (running is not None and not running.done()):
            raise CompactionInProgressError(name)
        self.metadata.set_compaction_status(name, "RUNNING", "", _now_ms())
        self._runs[name] = asyncio.create_task(self._run(name))

    async def _run(self, name: str) -> None:
        try:
            await self.broker.compact(name)
        except Exception as error:  # noqa: BLE001 - the outcome of a background run is its status
            log.warning("compaction of %s failed: %s", name, error)
            self.metadata.set_compaction_status(name, "ERROR", f"{type(error).__name__}: {error}", _now_ms())
        else:
            self.metadata.set_compaction_status(name, "SUCCESS", "", _now_ms())

    def compaction_status(self, text: str) -> dict[str, str]:
        """``{"status": …, "lastError": …}`` as Pulsar's LongRunningProcessStatus."""
        name = str(self.topic(text).name)
        status = self.metadata.compaction_status(name)
        if status is None:
            return {"status": "NOT_RUN", "lastError": ""}
        return {"status": status[0], "lastError": status[1]}

    async def wait_for_runs(self) -> None:
        """Wait for the background runs in flight (tests, shutdown)."""
        await asyncio.gather(*self._runs.values(), return_exceptions=True)

    # -- policies -------------------------------------------------------------------

    def topic_scope(self, text: str) -> str:
        return str(self.topic(text).name)

    @staticmethod
    def namespace_scope(tenant: str, namespace: str) -> str:
        TopicName.parse(f"persistent://{tenant}/{namespace}/x")  # validates both parts
        return f"{tenant}/{namespace}"

    def get_policy(self, scope: str, name: str) -> Any:
        assert name in POLICY_NAMES
        return self.broker.policies.get_policy(scope, name)

    def set_policy(self, scope: str, name: str, value: Any) -> None:
        assert name in POLICY_NAMES
        self.broker.policies.set_policy(scope, name, value)
        if name == "deduplicationEnabled":
            self.broker.refresh_deduplication()

    def remove_policy(self, scope: str, name: str) -> None:
        assert name in POLICY_NAMES
        self.broker.policies.remove_policy(scope, name)
        if name == "deduplicationEnabled":
            self.broker.refresh_deduplication()

    # -- stats ------------------------------------------------------------------------

    def stats(self, text: str) -> dict[str, Any]:
        """Pulsar's topic stats (the fields compactd keeps), with the compaction section."""
        topic = self.topic(text)
        record = topic.compacted.record
        subscriptions = {}
        for name in self._subscription_names(topic):
            cursor = self._cursor(topic, name)
            live = topic.subscriptions.get(name)
            subscriptions[_shown(name)] = {
                "msgBacklog": cursor.backlog_entries(),
                "backlogSize": cursor.estimated_backlog_bytes(),
                "type": live.sub_type.name.capitalize() if live else "Exclusive",
                "isDurable": True,
                "consumers": [{"consumerName": c.name} for c in (live.consumers if live else [])],
            }
        return {
            "msgInCounter": topic.ledger.entries_added_counter,
            "storageSize": topic.ledger.total_size,
            "publishers": [],
            "subscriptions": subscriptions,
            "compaction": {
                "lastCompactionRemovedEventCount": record.last_removed_events,
                "lastCompactionSucceedTimestamp": record.last_success_ms,
                "lastCompactionFailedTimestamp": record.last_failure_ms,
                "lastCompactionDurationTimeInMills": record.last_duration_ms,
            },
        }

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
        compacted = {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False, "underReplicated": False}
        if view is not None:
            compacted.update(ledgerId=view.ledger_id, entries=view.entries,
                             size=ledger.store.info(view.ledger_id).size_bytes)
        return {
            "entriesAddedCounter": ledger.entries_added_counter,
            "numberOfEntries": ledger.number_of_entries,
            "totalSize": ledger.total_size,
            "currentLedgerEntries": ledgers[-1].entries if ledgers else 0,
            "currentLedgerSize": ledgers[-1].size_bytes if ledgers else 0,
            "lastConfirmedEntry": str(ledger.last_confirmed_position()),
            "state": "LedgerOpened",
            "ledgers": [{"ledgerId": r.ledger_id, "entries": r.entries, "size": r.size_bytes, "offloaded": False}
                        for r in ledgers],
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
