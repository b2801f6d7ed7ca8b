"""Partitioned topics: a parent name with N partitions, each an ordinary topic.

``PartitionedTopics`` owns the ``partitioned_topics`` component of the metadata database
(``ledger.database``): one row per parent (``persistent://t/ns/orders``) with its number of
partitions. Partition *i* is the ordinary topic ``<parent>-partition-<i>`` (Pulsar's
naming; the index has no leading zero, ``-partition-01`` is not a partition); it has its own
ledgers, cursors, compaction horizon and compacted view, so the rest of the broker needs no
change to serve it. The parent itself is never a topic: PARTITIONED_METADATA answers N for
it (0 for every other name) and the client opens each partition itself.

Rules (Pulsar's admin answers, ``pulsar-partitions-schemas-keyshared.md`` §2.3):

* create: N ≥ 1 and at most ``max_partitions`` (``InvalidPartitionCountError``, HTTP 406);
  a name that is itself a partition is refused (``PreconditionFailedError``, 412); an
  existing partitioned or non-partitioned topic of that name is refused
  (``TopicExistsError``, 409). The partitions are recorded as topics in the same
  transaction (cheap: each gets its ledger when it is first opened).
* update: the count only grows (``PartitionCountConflictError``, 409); new partitions are
  recorded; a client sees them at its next metadata poll (60 s).
* delete: refused while a partition has clients (412) or a compaction run (409), checked
  for every partition before any is deleted; the parent's topic-scoped policies go too.
  ``delete`` runs every commit on the metadata writer
  thread (``api.broker.off_loop``): no commit of theirs runs on the event loop.

Compaction, stats and policies of a parent fan out to its partitions (``compact``,
``stats``); ``policy_scopes`` names where a partition's topic policies are looked up (the
partition, then its parent), which is how a policy set on the parent applies to every
partition.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Protocol

from api.broker.errors import (
    BrokerError,
    PreconditionFailedError,
    TopicExistsError,
    TopicNotFoundError,
)
from api.broker.off_loop import write_off_loop
from api.broker.topic_name import TopicName
from ledger.database import Database, load_migrations

if TYPE_CHECKING:
    from api.broker.registry import TopicRegistry
    from compactor.runs.runs import CompactionRuns
    from ledger.metadata import MetadataStore

__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "InvalidPartitionCountError",
    "PartitionCountConflictError",
    "PartitionedTopics",
    "parent_of",
    "partition_index",
    "partition_name",
    "policy_scopes",
]

COMPONENT = "partitioned_topics"
MIGRATIONS = load_migrations("api.broker", COMPONENT)

_PARTITION_SUFFIX = re.compile(r"-partition-(0|[1-9][0-9]*)$")


class _Broker(Protocol):
    @property
    def registry(self) -> TopicRegistry: ...

    @property
    def runs(self) -> CompactionRuns: ...

    async def settle_loads(self, keys: list[str] | None = None) -> None: ...


class Admin(Protocol):
    """What the fan-outs need of the admin core (``api.broker.admin.Admin``; named here so
    that this module does not import it back)."""

    @property
    def metadata(self) -> MetadataStore: ...

    @property
    def broker(self) -> _Broker: ...

    def check_namespace(self, name: TopicName) -> None: ...

    def check_deletable(self, text: str) -> None: ...

    async def delete_topic(self, text: str) -> None: ...

    async def preload(self, text: str) -> None: ...

    def trigger_compaction(self, text: str) -> None: ...

    def compaction_status(self, text: str) -> dict[str, str]: ...

    def stats(self, text: str) -> dict[str, Any]: ...


class InvalidPartitionCountError(BrokerError):
    """A partition count that is not a positive integer within the limit (HTTP 406)."""

    code = "NotAllowedError"


class PartitionCountConflictError(TopicExistsError):
    """An update that does not grow the count (HTTP 409)."""


def partition_index(name: TopicName) -> int | None:
    """The index of ``name`` when it is a partition (``t-partition-3`` → 3), else None."""
    match = _PARTITION_SUFFIX.search(name.local_name)
    return int(match.group(1)) if match is not None and match.start() > 0 else None


def parent_of(name: TopicName) -> TopicName | None:
    """The parent of the partition ``name`` (``t-partition-3`` → ``t``), else None."""
    match = _PARTITION_SUFFIX.search(name.local_name)
    if match is None or match.start() == 0:
        return None
    return TopicName(name.tenant, name.namespace, name.local_name[:match.start()])


def partition_name(parent: TopicName, index: int) -> TopicName:
    """Partition ``index`` of ``parent``: ``<parent>-partition-<index>``."""
    return TopicName(parent.tenant, parent.namespace, f"{parent.local_name}-partition-{index}")


def policy_scopes(topic: str) -> tuple[str, ...]:
    """Where the topic policies of ``topic`` (a full name) are looked up, first match
    wins: the topic itself, then, for a partition, its parent."""
    try:
        parent = parent_of(TopicName.parse(topic))
    except BrokerError:
        return (topic,)
    return (topic,) if parent is None else (topic, str(parent))


class PartitionedTopics:
    """The partitioned topics kept in ``database``; see the module docstring. Every
    change goes through ``admin`` (the broker's admin core) for the partitions' topics."""

    def __init__(self, database: Database, *, max_partitions: int) -> None:
        self.database = database
        self.max_partitions = max_partitions
        database.register(COMPONENT, MIGRATIONS)
        self._counts: dict[str, int] = {
            str(name): int(count) for name, count in database.query("SELECT name, partitions FROM partitioned_topics")}

    # -- reading ------------------------------------------------------------------------

    def partitions(self, name: TopicName) -> int:
        """N for a partitioned parent, 0 for every other name (PARTITIONED_METADATA)."""
        return self._counts.get(str(name), 0)

    def is_parent(self, name: TopicName) -> bool:
        return str(name) in self._counts

    def partition_names(self, name: TopicName) -> list[str]:
        """The full names of the partitions of the parent ``name`` (none when not one)."""
        return [str(partition_name(name, i)) for i in range(self.partitions(name))]

    def in_namespace(self, namespace: str) -> list[str]:
        """The partitioned parents of ``tenant/namespace``, sorted."""
        prefix = f"persistent://{namespace}/"
        # a snapshot first (one C-level copy): the metadata writer thread changes the map
        return sorted(name for name in list(self._counts) if name.startswith(prefix))

    def required(self, text: str) -> TopicName:
        """The parent ``text``; ``TopicNotFoundError`` when it is not partitioned."""
        name = TopicName.parse(text)
        if not self.is_parent(name):
            raise TopicNotFoundError(f"Partitioned topic {name} does not exist")
        return name

    # -- changing -----------------------------------------------------------------------

    def create(self, admin: Admin, text: str, count: object) -> TopicName:
        """Create the partitioned topic ``text`` with ``count`` partitions, and the partitions."""
        name = TopicName.parse(text)
        self._check_count(count)
        assert isinstance(count, int)
        if parent_of(name) is not None:
            raise PreconditionFailedError(
                f"Partitioned topic name {name} is not valid: it contains '-partition-'")
        if self.is_parent(name):
            raise TopicExistsError(f"Partitioned topic {name} already exists")
        if admin.metadata.topic_exists(str(name)):
            raise TopicExistsError(f"Topic {name} already exists as a non-partitioned topic")
        admin.check_namespace(name)
        now_ms = int(time.time() * 1000)
        with self.database.transaction("partitioned_topics.create", topic=str(name)) as db:
            db.execute("INSERT INTO partitioned_topics (name, partitions, created_at_ms) VALUES (?, ?, ?)",
                       (str(name), count, now_ms))
            admin.metadata.record_topics(db, [str(partition_name(name, i)) for i in range(count)], now_ms)
        self._counts[str(name)] = count
        return name

    def update(self, admin: Admin, text: str, count: object) -> None:
        """Grow the parent ``text`` to ``count`` partitions (never shrink)."""
        name = self.required(text)
        self._check_count(count)
        assert isinstance(count, int)
        current = self.partitions(name)
        if count <= current:
            raise PartitionCountConflictError(
                f"Partitioned topic {name} has {current} partitions; the count can only grow, not become {count}")
        with self.database.transaction("partitioned_topics.update", topic=str(name)) as db:
            db.execute("UPDATE partitioned_topics SET partitions = ? WHERE name = ?", (count, str(name)))
            admin.metadata.record_topics(db, [str(partition_name(name, i)) for i in range(current, count)],
                                         int(time.time() * 1000))
        self._counts[str(name)] = count

    async def delete(self, admin: Admin, text: str) -> None:
        """Delete the parent ``text``, every partition and the parent's topic policies, with
        every commit off the event loop: each partition ever opened is
        loaded off the loop and deleted as ``Admin.delete_topic`` deletes a topic,
        the others' rows and the parent's go on the metadata writer thread
        (``api.broker.off_loop``); nothing is deleted when any partition is busy."""
        name = self.required(text)
        broker = admin.broker
        await admin.preload(str(name))  # the partitions holding ledgers, loaded off the loop
        names = self.partition_names(name)
        # A client's load in flight may be creating a first ledger: it ends first; then no
        # partition loads again until the parent is gone (``TopicRegistry.holding``).
        async with broker.registry.holding(names):
            partitions = [p for p in names if admin.metadata.topic_exists(p)]
            for partition in partitions:  # refuse before anything is deleted
                if broker.registry.get(partition) is not None:
                    admin.check_deletable(partition)
            for partition in partitions:
                if broker.registry.get(partition) is None and not admin.metadata.topic_ledgers(partition):
                    await write_off_loop(admin.metadata.delete_topic, partition)  # never opened: only its rows
                else:
                    await admin.delete_topic(partition)
            await write_off_loop(self._delete_parent, name)

    def _delete_parent(self, name: TopicName) -> None:
        with self.database.transaction("partitioned_topics.delete", topic=str(name)) as db:
            db.execute("DELETE FROM partitioned_topics WHERE name = ?", (str(name),))
            db.execute("DELETE FROM policies WHERE scope = ?", (str(name),))
        self._counts.pop(str(name), None)

    def _check_count(self, count: object) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise InvalidPartitionCountError(f"Number of partitions should be more than 0, not {count!r}")
        if count > self.max_partitions:
            raise InvalidPartitionCountError(
                f"Number of partitions {count} is above the limit of {self.max_partitions} "
                "(max_num_partitions_per_partitioned_topic)")

    def create_missing(self, admin: Admin, text: str) -> None:
        """Record every partition of the parent ``text`` that does not exist (deleted alone)."""
        name = self.required(text)
        with self.database.transaction("partitioned_topics.create_missing", topic=str(name)) as db:
            admin.metadata.record_topics(db, self.partition_names(name), int(time.time() * 1000))

    # -- fan-out ------------------------------------------------------------------------

    def _opened(self, admin: Admin, name: TopicName) -> list[str]:
        """The partitions of ``name`` that were ever opened (loaded, or holding ledgers): a
        partition no client ever used holds nothing, and loading it would only create its
        first ledger."""
        return [p for p in self.partition_names(name)
                if admin.broker.registry.get(p) is not None or admin.metadata.topic_ledgers(p)]

    def compact(self, admin: Admin, name: TopicName) -> None:
        """Queue a run of every partition ever opened (each waits for a run slot); a
        partition with a run already in flight keeps it."""
        for partition in self._opened(admin, name):
            if not admin.broker.runs.in_flight(partition):
                admin.trigger_compaction(partition)

    def compaction_status(self, admin: Admin, name: TopicName) -> dict[str, str]:
        """One status for the parent over its opened partitions: RUNNING while any runs,
        else ERROR when any failed (its error, named), else NOT_RUN when any never ran (or
        none was ever opened), else SUCCESS.
        Each partition's own status stays at its own path."""
        each = {p: admin.compaction_status(p) for p in self._opened(admin, name)}
        statuses = [s["status"] for s in each.values()]
        errors = [f"{p}: {s['lastError']}" for p, s in each.items() if s["status"] == "ERROR"]
        for status in ("RUNNING", "ERROR", "NOT_RUN"):
            if status in statuses:
                break
        else:
            status = "SUCCESS" if statuses else "NOT_RUN"
        return {"status": status, "lastError": "; ".join(errors) if status == "ERROR" else ""}

    def stats(self, admin: Admin, name: TopicName, *, per_partition: bool = True) -> dict[str, Any]:
        """Pulsar's partitioned stats: the partitions' counters summed, their
        subscriptions' backlogs summed by name, ``metadata.partitions`` and, when
        ``per_partition``, each partition's own stats."""
        each = {p: admin.stats(p) for p in self._opened(admin, name)}
        subscriptions: dict[str, dict[str, Any]] = {}
        for stats in each.values():
            for sub_name, sub in stats["subscriptions"].items():
                total = subscriptions.setdefault(sub_name, {"msgBacklog": 0, "backlogSize": 0, "type": sub["type"],
                                                            "isDurable": sub["isDurable"], "consumers": []})
                total["msgBacklog"] += sub["msgBacklog"]
                total["backlogSize"] += sub["backlogSize"]
                total["consumers"] += sub["consumers"]
        result: dict[str, Any] = {
            "msgInCounter": sum(s["msgInCounter"] for s in each.values()),
            "storageSize": sum(s["storageSize"] for s in each.values()),
            "offloadedStorageSize": sum(s["offloadedStorageSize"] for s in each.values()),
            "publishers": [],
            "subscriptions": subscriptions,
            "metadata": {"partitions": self.partitions(name)},
        }
        if per_partition:
            result["partitions"] = each
        return result
