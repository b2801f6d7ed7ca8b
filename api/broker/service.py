"""The broker core shared by both doors: topics and compaction runs.

``BrokerService`` holds the topic registry (``registry``: ``api.broker.registry.TopicRegistry``,
the one owner of which topics are loaded, loading, closing and being deleted) and the compactor; it
knows no sockets: the Pulsar listener, its connections and the limits they share are the
wire package's (``api.wire.listener``, whose ``PulsarBroker`` is this core served on a
port), and nothing here imports ``api.wire`` or the HTTP side. It is configured by a typed
``api.config.Settings``; ``compaction_config`` and ``ledger_config`` turn it into the
lower layers' configs (shared with ``compactd compact-topic``). It also names producers
that did not choose a name (``new_producer_name``), which both doors may ask for. It runs
on one asyncio event loop; it moves off the loop compaction runs, trimming, the sweep,
topic loads (``load_topic``: one load per name in flight, shared by its callers, on a
``topic-load`` thread), unloads (``unload_topic``) and (at stop) the topics' seals, all
carried out by the registry; cursor
writes are the cursor store's thread's, admin metadata writes the ``metadata-write``
thread's (``api.broker.off_loop``). The sync ``get_topic`` loads on its caller's thread
(offline callers, tests; on the loop only what was loaded off it first). Runs
belong to one executor, ``runs`` (``compactor.runs.runs.CompactionRuns``: slots —
``compaction_max_concurrent_runs`` —, queue, tasks, persisted status), which the REST
trigger (``request_compaction``), the scheduler (``scheduler_tick``) and ``compact`` (a run
awaited) all go through; the core only builds each run's ``RunJob`` (the topic and its
``deleteRetentionMs``, ``minCompactionLagMs`` and ``compactionMaxBytesPerSecond``: topic
policy, else namespace policy, else the broker default). Lifecycle: ``start_tasks`` starts the periodic work (trimming, the
compaction scheduler, the sweep of replaced compacted ledgers past their grace period) and, with
``compaction_key_index``, queues the sealed ledgers without a key index for the background
builds (``compactor.local.index_builds``: each sealed ledger is indexed in a worker process); ``stop`` ends it, cancels queued runs and waits for the running
ones, then seals every topic's current ledger, which makes (or fails) every pending append
before it returns, and writes every queued cursor state (``cursor.store``: a clean stop
loses no acknowledgement).
With an offload driver (``api.config.offload_bucket``), ``offloads``
(``api.broker.offloads.TopicOffloads``) owns the one ``ledger.offload.Offloader``: each
roll-over (a topic's ``on_sealed`` hook) offloads what the topic's ``offloadThreshold`` lets
go, the periodic trim pass (every ``retention_check_interval_seconds``) deletes local copies
past ``offloadDeletionLagMs`` and unreferenced objects, and ``stop`` shuts it down after
the topics are sealed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import time
from typing import Any

from api.broker.access import AccessControl
from api.broker.admin import Admin
from api.broker.errors import NotAllowedError, TopicNotFoundError
from api.broker.offloads import TopicOffloads
from api.broker.partitions import PartitionedTopics
from api.broker.policies import PolicyStore
from api.broker.registry import TopicRegistry
from api.broker.schemas import SchemaRegistry
from api.broker.seek import find_by_publish_time, publish_time
from api.broker.tenants import Tenants
from api.broker.topic import Topic
from api.broker.topic_name import TopicName
from api.config import Settings, offload_bucket
from compactor.errors import CompactionInProgressError
from compactor.local.index_builds import KeyIndexBuilds, unindexed_ledgers
from compactor.record import RunFigures
from compactor.runs.runner import CompactionConfig, Compactor, sweep_compacted_garbage
from compactor.runs.runs import CompactionRuns, RunJob
from compactor.runs.scheduler import (
    CompactionPolicy,
    Plan,
    TopicCompactionStats,
    effective_threshold,
    plan,
)
from compactor.runs.status import CompactionStatusStore
from compactor.view.manifest import CompactedManifests
from compactor.view.topic import COMPACTED_TOPIC_LEDGER, COMPACTION_SUBSCRIPTION
from cursor.store import CursorStore
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from ledger.offload import Offloader
from ledger.position import Position

__all__ = ["GARBAGE_SWEEP_INTERVAL_S", "BrokerService", "compaction_config", "ledger_config"]

log = logging.getLogger(__name__)

# How often replaced compacted ledgers past their grace period are deleted.
GARBAGE_SWEEP_INTERVAL_S = 15.0


def compaction_config(settings: Settings) -> CompactionConfig:
    """The compactor's settings (broker.conf names in ``CompactionConfig``), shared with
    ``compactd compact-topic`` so that an offline run compacts as the broker would."""
    return CompactionConfig(
        retain_null_key=settings.topic_compaction_retain_null_key,
        phase_one_read_timeout_s=settings.compaction_phase_one_loop_timeout_seconds,
        engine=settings.compaction_engine,
        spark_master=settings.spark_master,
        memory_budget_bytes=settings.compaction_memory_budget_bytes,
        key_index=settings.compaction_key_index,
        incremental=settings.compaction_incremental,
        merge_dead_ratio=settings.compaction_merge_dead_ratio,
        merge_fan_in=settings.compaction_merge_fan_in,
    )


def ledger_config(settings: Settings) -> ManagedLedgerConfig:
    """Every topic's managed-ledger settings (roll-over); retention keeps its defaults."""
    return ManagedLedgerConfig(
        max_entries_per_ledger=settings.managed_ledger_max_entries_per_ledger,
        max_size_per_ledger_bytes=settings.managed_ledger_max_size_per_ledger_bytes,
        roll_over_retry_ms=settings.managed_ledger_roll_over_retry_ms,
    )


class BrokerService:
    """One broker over one data dir; see the module docstring."""

    def __init__(self, data_dir: DataDir, settings: Settings) -> None:
        self.data_dir = data_dir
        self.settings = settings
        # Each layer's store on the data dir's one database (``ledger.database``).
        self.cursors = CursorStore(data_dir.database,
                                   mark_delete_rate_limit=settings.managed_ledger_mark_delete_rate_limit)
        self.policies = PolicyStore(data_dir.database)
        self.access = AccessControl.of_broker(settings, data_dir.database)  # api.auth: who may do what
        self.schemas = SchemaRegistry(data_dir.database, self.policies, settings.schema_compatibility_strategy,
                                      max_size_bytes=settings.schema_max_size_bytes)
        self.compaction_statuses = CompactionStatusStore(data_dir.database)
        # Which topics are loaded, loading, closing and being deleted: the registry's alone.
        self.registry = TopicRegistry(self._open_topic)
        # The broker's runs go to worker processes, one per run slot (compactor.local.worker), so
        # that no run holds this interpreter's GIL; compact-topic's stay in its process.
        workers = settings.compaction_max_concurrent_runs if settings.compaction_worker_process else 0
        self.compactor = Compactor(dataclasses.replace(compaction_config(settings), worker_processes=workers))
        self.ledger_config = ledger_config(settings)
        self.runs = CompactionRuns(self.compactor, self.compaction_statuses,
                                   max_concurrent_runs=settings.compaction_max_concurrent_runs)
        # Each sealed raw ledger's key index, built in a worker process (compactor.local.index_builds).
        files = data_dir.ledgers.file_powers()
        self.key_indexes = (KeyIndexBuilds(files.root, files.bucket) if settings.compaction_key_index
                            and files is not None else None)
        self._index_task: asyncio.Task[None] | None = None
        # Pulsar's producer names: cluster, a broker instance id that never repeats on this
        # data dir (persisted), and a counter.
        self._producer_name_prefix = (f"{settings.cluster_name}-"
                                      f"{data_dir.metadata.next_counter('broker_instance_id')}-")
        self._producer_names = itertools.count()
        self._trim_task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        # Tenants and namespaces (``api.broker.tenants``), partitioned parents (``partitions``).
        self.tenants = Tenants(data_dir.database, cluster=settings.cluster_name,
                               topics=data_dir.metadata.list_topics())
        self.partitioned = PartitionedTopics(
            data_dir.database, max_partitions=settings.max_num_partitions_per_partitioned_topic)
        # Offload of sealed ledgers to the bucket (with a driver; the data dir's store reads it).
        offloader = Offloader(data_dir.ledgers, data_dir.metadata) if offload_bucket(settings) is not None else None
        self.offloads = TopicOffloads(offloader, self.policies, settings)
        self.admin = Admin(self)
        self.last_plan = Plan()

    # -- lifecycle ----------------------------------------------------------------------

    def start_tasks(self) -> None:
        """Start the periodic work on the running loop: trimming and the compaction scheduler."""
        self.loop = asyncio.get_running_loop()
        self._trim_task = asyncio.create_task(self._trim_periodically())
        self._sweep_task = asyncio.create_task(self._sweep_periodically())
        interval_s = self.settings.compaction_monitor_interval_seconds
        if interval_s > 0:
            self._scheduler_task = asyncio.create_task(self._schedule_periodically(interval_s))
        if self.key_indexes is not None:
            self._index_task = asyncio.create_task(self._index_sealed_ledgers(self.key_indexes))

    def stop_tasks(self) -> None:
        """Cancel the periodic work (the runs in flight go on; ``stop`` waits for them)."""
        for task in (self._trim_task, self._scheduler_task, self._sweep_task, self._index_task):
            if task is not None:
                task.cancel()

    async def stop(self) -> None:
        """End the periodic work and the runs in flight; seal every topic (pending appends
        finish). A listener closes its connections before it calls this."""
        self.stop_tasks()
        self.offloads.begin_stop()  # the seals below start no offload
        if self.key_indexes is not None:  # first: the seals below queue nothing (the next start indexes them)
            await asyncio.to_thread(self.key_indexes.close)
        await self.runs.stop()
        await self.registry.stop()  # seals and cursor writes off the loop; loads in flight end, then close
        await asyncio.to_thread(self.offloads.shutdown)  # after the seals: their hooks start no job
        try:
            self.cursors.close()  # what is still queued (topics that failed to close) is written
        except Exception as error:  # noqa: BLE001 - the stop goes on; those acks come again
            log.warning("writing the queued cursor states: %s", error)
        self.compactor.close()  # stops the Spark session if the spark engine started one

    async def _index_sealed_ledgers(self, builds: KeyIndexBuilds) -> None:
        """At start: queue every sealed raw ledger that has no key index yet (the last run
        sealed its topics' current ledgers at its stop, or died while indexing)."""
        try:
            missing = await asyncio.to_thread(unindexed_ledgers, self.data_dir.metadata, builds.ledgers_root)
        except Exception as error:  # noqa: BLE001 - the runs parse what has no index
            log.warning("listing the ledgers without a key index: %s", error)
            return
        for ledger_id, entries in missing:
            builds.submit(ledger_id, entries)

    async def _trim_periodically(self) -> None:
        """Trim every loaded topic each interval, on a worker thread: a trim's deletes and
        metadata commit never run on the event loop. With offload, the same pass deletes the
        local copies past the deletion lag and the unreferenced objects (``TopicOffloads``)."""
        while True:
            await asyncio.sleep(self.settings.retention_check_interval_seconds)
            topics = self.registry.loaded_topics()
            for topic in topics:
                try:
                    await asyncio.to_thread(topic.ledger.trim)
                except Exception as error:  # noqa: BLE001 - the next interval tries again
                    log.warning("trimming %s: %s", topic.name, error)
            if self.offloads.enabled:
                await asyncio.to_thread(self.offloads.trim_pass, topics, self._compacted_ledger_ids)

    def _compacted_ledger_ids(self) -> set[int]:
        """Every compacted ledger still in use (views, and replaced ones in their grace
        period) and every ledger a Spark run in flight holds (``compactor.runs.held``): in
        the bucket, they are no orphans (``compactor.runs.runner.collect_orphans``)."""
        live = self.cursors.cursor_property_values(COMPACTION_SUBSCRIPTION, COMPACTED_TOPIC_LEDGER)
        live |= self.compactor.held.ids()
        return live | CompactedManifests(self.data_dir.database).live_ledger_ids(int(time.time() * 1000))

    async def _sweep_periodically(self) -> None:
        """Delete the replaced compacted ledgers whose grace period is over
        (``compactor.view.manifest``), each interval, on a worker thread (the start's sweep is
        ``collect_orphans``'s)."""
        while True:
            await asyncio.sleep(GARBAGE_SWEEP_INTERVAL_S)
            try:
                await asyncio.to_thread(sweep_compacted_garbage, self.data_dir)
            except Exception as error:  # noqa: BLE001 - the next interval tries again
                log.warning("deleting replaced compacted ledgers: %s", error)

    # -- topics -------------------------------------------------------------------------

    def topic_name(self, text: str) -> TopicName:
        """Validate a topic name (raises ``InvalidTopicNameError``/``NotAllowedError``, and
        ``TopicNotFoundError`` when its namespace does not exist)."""
        name = TopicName.parse(text)
        self.tenants.check_namespace(name)
        return name

    def get_topic(self, text: str, *, create: bool = True) -> Topic:
        """The loaded topic named ``text``, loading or creating it on the caller's thread
        (the event loop's callers use ``load_topic``: on the loop, a load or an unload in
        flight is refused with ``NotAllowedError``, never waited for; ``TopicRegistry.get_topic``)."""
        name = TopicName.parse(text)
        return self.registry.get_topic(name, functools.partial(self.check_loadable, create=create),
                                       self.loop or asyncio.get_running_loop())

    async def load_topic(self, text: str, *, create: bool = True) -> Topic:
        """``get_topic`` with the load (its first ledger's and internal cursors' commits, the
        de-duplication replay) on a ``topic-load`` thread, never on the event loop. One load
        per name is in flight, shared by every caller; it starts once an unload of the name
        has ended; it is refused as ``get_topic`` refuses (being deleted, missing, not
        creatable): ``TopicRegistry.load``."""
        return await self.registry.load(TopicName.parse(text), functools.partial(self.check_loadable, create=create))

    async def settle_loads(self, keys: list[str] | None = None) -> None:
        """Wait until the loads in flight of ``keys`` (None: every load in flight) have
        ended and their topics are loaded (a failed load is only forgotten)."""
        await self.registry.settle(keys)

    def check_loadable(self, name: TopicName, *, create: bool) -> None:
        """Refuse loading ``name`` as ``get_topic`` does: being deleted (``NotAllowedError``), missing
        (``TopicNotFoundError`` unless ``create``), not creatable (``check_creatable``)."""
        key = str(name)
        self.registry.check_not_deleting(key)
        exists = self.data_dir.metadata.topic_exists(key)
        if not create and not exists:
            raise TopicNotFoundError(f"Topic {key} not found")
        if create and not exists:
            self.check_creatable(name)

    def _open_topic(self, name: TopicName, loop: asyncio.AbstractEventLoop) -> Topic:
        """The topic ``name``, opened on the caller's thread: its managed ledger (created
        with its first ledger when new) and its ``Topic`` (internal cursors, de-duplication
        replay); nothing else can reach it before it is published."""
        key = str(name)
        opened: list[ManagedLedger] = []  # the hook's ledger, once open (a seal during the open offloads nothing)
        on_sealed = self.offloads.on_sealed_hook(name, lambda: opened[0] if opened else None,
                                                 self.key_indexes.submit if self.key_indexes is not None else None)
        ledger = ManagedLedger.open(key, self.data_dir.ledgers, self.data_dir.metadata, self.ledger_config,
                                    roll_over_in_background=True, on_sealed=on_sealed)
        opened.append(ledger)
        try:
            return Topic(name, ledger, loop, deduplication=self.deduplication_enabled(name), cursors=self.cursors,
                         compacted_grace_period_s=self.settings.compacted_ledger_grace_period_s)
        except BaseException:
            ledger.close()
            raise

    async def unload_topic(self, topic: Topic) -> None:
        """Drop the loaded ``topic`` and close it off the loop (its seal on a worker thread,
        its cursor states by the cursor store's thread), awaited; a load of the name
        meanwhile waits for the close to end, then opens it again (``TopicRegistry.unload``)."""
        await self.registry.unload(topic)

    def check_creatable(self, name: TopicName) -> None:
        """Refuse creating topic ``name`` in a missing namespace (``TopicNotFoundError``)
        or under the name of a partitioned parent (``NotAllowedError``: its partitions are
        the topics)."""
        self.tenants.check_namespace(name)
        if self.partitioned.is_parent(name):
            raise NotAllowedError(f"{name} is a partitioned topic: produce to and consume from its partitions")

    def deduplication_enabled(self, name: TopicName) -> bool:
        """The topic's ``deduplicationEnabled``: topic policy, else namespace policy, else
        the broker's ``broker_deduplication_enabled``."""
        for scope in (str(name), name.namespace_name):
            value = self.policies.get_policy(scope, "deduplicationEnabled")
            if value is not None:
                return bool(value)
        return self.settings.broker_deduplication_enabled

    async def refresh_deduplication(self) -> None:
        """Apply a changed ``deduplicationEnabled`` policy to every loaded topic, each start
        off the loop (``Topic.switch_deduplication``),
        awaited: once it returns, the loaded topics de-duplicate as the policy says."""
        await self.settle_loads()  # a load that read the former policy is switched too
        switches = [topic.switch_deduplication(self.deduplication_enabled(topic.name))
                    for topic in self.registry.loaded_topics()]
        await asyncio.gather(*switches)

    def list_topics(self, namespace: str) -> list[str]:
        """Every topic of ``tenant/namespace``."""
        prefix = f"persistent://{namespace}/"
        return [t for t in self.data_dir.metadata.list_topics() if t.startswith(prefix)]

    def new_producer_name(self) -> str:
        """A name for a producer that did not choose one, unique across restarts of this
        data dir (``standalone-3-0``: cluster, broker instance id, counter)."""
        return f"{self._producer_name_prefix}{next(self._producer_names)}"

    def find_by_publish_time(self, topic: Topic, publish_time_ms: int) -> Position:
        return find_by_publish_time(topic.ledger, publish_time_ms)

    # -- compaction ---------------------------------------------------------------------

    def run_job(self, topic: Topic) -> RunJob:
        """What a run of ``topic`` needs: its compaction state, ``deleteRetentionMs``,
        ``minCompactionLagMs`` and ``compactionMaxBytesPerSecond``."""
        return RunJob(topic.compacted, self.delete_retention_ms(topic),
                      min_compaction_lag_ms=self._policy_or(topic, "minCompactionLagMs",
                                                            self.settings.compaction_min_lag_ms),
                      max_bytes_per_second=self._policy_or(topic, "compactionMaxBytesPerSecond",
                                                           self.settings.compaction_max_bytes_per_second))

    def _policy_or(self, topic: Topic, name: str, broker_default: int) -> int:
        """Policy ``name`` of the topic, else of its namespace, else ``broker_default``."""
        for scope in (str(topic.name), topic.name.namespace_name):
            value = self.policies.get_policy(scope, name)
            if value is not None:
                return int(value)
        return broker_default

    def request_compaction(self, text: str) -> None:
        """Queue a run of the existing topic ``text``; its outcome lands in the status
        (``TopicNotFoundError``, ``CompactionInProgressError``)."""
        self.runs.request(self.run_job(self.get_topic(text, create=False)))

    async def compact(self, text: str) -> RunFigures:
        """Run one compaction of the topic and wait for it (then it trimmed what it covered)."""
        return await self.runs.run(self.run_job(await self.load_topic(text, create=False)))

    # -- the threshold scheduler ----------------------------------------------------------

    async def _schedule_periodically(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.scheduler_tick(int(time.time() * 1000))
            except Exception:  # a failed tick must not stop the scheduler; the next one retries
                log.exception("compaction scheduler tick failed")

    def scheduler_tick(self, now_ms: int) -> Plan:
        """One scheduler decision over the loaded topics (``compactor.runs.scheduler``); starts
        the planned runs through ``runs``, as the REST trigger does."""
        candidates = [(self._scheduler_stats(topic), self._policy(topic)) for topic in self.registry.loaded_topics()]
        running = self.runs.running_count + self.runs.queued_count
        limit = self.settings.compaction_max_concurrent_runs
        self.last_plan = plan(candidates, now_ms=now_ms, running_runs=running, max_concurrent_runs=limit)
        for name in self.last_plan.start:
            try:
                self.request_compaction(name)
            except CompactionInProgressError:
                continue
        return self.last_plan

    def _scheduler_stats(self, topic: Topic) -> TopicCompactionStats:
        horizon = topic.compacted.backlog_from  # opens no cursor: that is a run's (a commit)
        view = topic.compacted.view if topic.compacted.broken is None else None
        compacted_bytes = view.size if view is not None else 0
        oldest = None
        first = topic.ledger.read_entries(topic.ledger.next_valid_position(horizon), 1)
        if first:
            oldest = publish_time(first[0].data)
        return TopicCompactionStats(
            topic=str(topic.name), backlog_bytes=topic.ledger.estimate_backlog_bytes(horizon),
            compacted_bytes=compacted_bytes, oldest_uncompacted_publish_ms=oldest,
            running=self.runs.in_flight(str(topic.name)),
        )

    def delete_retention_ms(self, topic: Topic) -> int:
        """The topic's ``deleteRetentionMs``: topic policy, else namespace policy, else 0."""
        for scope in (str(topic.name), topic.name.namespace_name):
            value = self.policies.get_policy(scope, "deleteRetentionMs")
            if value is not None:
                return int(value)
        return 0

    def _policy(self, topic: Topic) -> CompactionPolicy:
        policies, scope, namespace = self.policies, str(topic.name), topic.name.namespace_name

        def pick(name: str) -> Any:
            value = policies.get_policy(scope, name)
            return value if value is not None else policies.get_policy(namespace, name)

        threshold = effective_threshold(
            policies.get_policy(scope, "compactionThreshold"), policies.get_policy(namespace, "compactionThreshold"),
            self.settings.compaction_threshold_bytes,
        )
        return CompactionPolicy(threshold, pick("minCleanableDirtyRatio"), pick("maxCompactionLagMs"),
                                self._policy_or(topic, "minCompactionLagMs", self.settings.compaction_min_lag_ms))

