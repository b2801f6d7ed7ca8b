"""``compactd compact-topic``: one compaction of one topic of a stopped broker's data dir.

Pulsar's ``bin/pulsar compact-topic``. ``compact_offline`` does what the broker does for a
triggered run, in this order:

1. refuse a path that holds no compactd data dir (nothing is created there);
2. open the data dir, taking its lock first: a running broker holds it, and the run is
   refused (``DataDirLockedError``) before anything is touched;
3. collect the orphan ledgers a crashed run left behind, and delete the replaced compacted
   ledgers whose grace period is over, as ``compactd serve`` does at start;
4. refuse a topic the metadata does not know (``TopicNotFoundError``): opening a managed
   ledger would create it;
5. load the topic: its managed ledger (the broker's ledger settings) and
   ``CompactedTopic.restore`` (which opens the durable ``__compaction`` cursor);
6. run it once through the broker's run executor (``compactor.runs.runs.CompactionRuns``, one
   slot), with the broker's settings (retain null key, phase-one read timeout) and the
   topic's ``deleteRetentionMs``, ``minCompactionLagMs`` and ``compactionMaxBytesPerSecond``
   policies (else its namespace's, else the broker default): the executor records
   RUNNING, then SUCCESS or ERROR — what ``topics compaction-status`` reads after the
   broker restarts — and trims the ledgers a successful run covered;
7. close the topic and the data dir.

Settings come from the environment and ``COMPACTD_CONFIG`` as for ``compactd serve``
(flags > environment > config file > defaults), so an offline run compacts as the broker
would. The command prints a rich progress bar on stderr when it is a terminal, and exactly
one line of JSON on stdout at the end (``summary``). Errors are one line on stderr:
exit 1 for an operating error (locked data dir, unknown topic, a failed run), exit 2 for a
usage error (a malformed topic name, an unknown engine). ``--engine spark`` runs phase one
on Spark (``--spark-master``, default the ``spark_master`` setting); without PySpark
installed (the ``spark`` extra) or Java, the run fails with exit 1 and a message saying so.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from api.config import ConfigError, Settings, offload_bucket, settings_from_command_line
from compactor.record import RunFigures
from ledger.errors import CompactionServiceError

__all__ = ["ENGINES", "OfflineError", "compact_offline", "compact_topic_command", "summary"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
ENGINES = ("local", "spark")
METADATA_FILE = "metadata.db"  # what makes a directory a compactd data dir (ledger.data_dir)
DELETE_RETENTION_POLICY = "deleteRetentionMs"
PHASE_LABELS = {"phase-one": "phase one", "phase-two": "phase two"}

ProgressCallback = Callable[[str, int, int], None]


class OfflineError(CompactionServiceError):
    """The offline run cannot start: no data dir at the path."""


def summary(topic: str, figures: RunFigures, view_ledger_ids: Sequence[int] = ()) -> dict[str, Any]:
    """The one-line JSON summary of a successful run.

    ``ledgerId`` is the first ledger of the topic's compacted view after the run (Pulsar's
    ``CompactedTopicLedger``): the one this run published, or, when there was nothing new to
    compact (``compacted`` false), the view that stands (-1: the topic has none);
    ``viewLedgers`` is the whole view, in stream order (``view_ledger_ids``).
    """
    published = figures.ledger_id != -1
    return {
        "topic": topic,
        "status": "SUCCESS",
        "compacted": published,
        "ledgerId": figures.ledger_id if published or not view_ledger_ids else view_ledger_ids[0],
        "viewLedgers": list(view_ledger_ids),
        "removedEvents": figures.removed_events,
        "entriesRead": figures.entries_read,
        "messagesRead": figures.messages_read,
        "entriesWritten": figures.entries_written,
        "bytesWritten": figures.bytes_written,
        "durationMs": int(figures.duration_s * 1000),
    }


def compact_offline(
    settings: Settings, topic: str, *, progress: ProgressCallback | None = None,
) -> tuple[str, RunFigures, tuple[int, ...]]:
    """Run one compaction of ``topic`` in ``settings.data_dir``; (full topic name, figures,
    the ledgers of the compacted view after the run: empty when the topic has none)."""
    from api.broker.errors import TopicNotFoundError
    from api.broker.policies import PolicyStore
    from api.broker.service import compaction_config, ledger_config
    from api.broker.topic_name import TopicName
    from compactor.runs.runner import Compactor, collect_orphans
    from compactor.runs.runs import CompactionRuns, RunJob
    from compactor.runs.status import CompactionStatusStore
    from compactor.view.topic import CompactedTopic
    from cursor.store import CursorStore
    from ledger.data_dir import DataDir
    from ledger.managed_ledger import ManagedLedger
    from ledger.storage.base import SyncPolicy

    name = TopicName.parse(topic)
    full_name = str(name)
    path = settings.data_dir
    if not os.path.isfile(os.path.join(path, METADATA_FILE)):
        raise OfflineError(f"no compactd data dir at {os.path.abspath(path)} (no {METADATA_FILE})")
    data_dir = DataDir.open(path, sync=SyncPolicy(settings.fsync), max_open_files=settings.max_open_ledger_files,
                            bucket=offload_bucket(settings),  # its offloaded ledgers are read from there
                            read_cache_bytes=settings.managed_ledger_offload_read_cache_bytes)
    try:
        collect_orphans(data_dir)
        metadata, cursors = data_dir.metadata, CursorStore(data_dir.database)
        policies, statuses = PolicyStore(data_dir.database), CompactionStatusStore(data_dir.database)
        if not metadata.topic_exists(full_name):
            raise TopicNotFoundError(f"topic {full_name} not found in data dir {data_dir.path}")
        ledger = ManagedLedger.open(full_name, data_dir.ledgers, metadata, ledger_config(settings))
        try:
            def policy(policy_name: str, default: int) -> int:
                for scope in (full_name, name.namespace_name):
                    value = policies.get_policy(scope, policy_name)
                    if value is not None:
                        return int(value)
                return default

            compacted = CompactedTopic.restore(ledger, cursors, create_cursor=True,
                                               grace_period_s=settings.compacted_ledger_grace_period_s)
            job = RunJob(compacted, policy(DELETE_RETENTION_POLICY, 0), progress,
                         min_compaction_lag_ms=policy("minCompactionLagMs", settings.compaction_min_lag_ms),
                         max_bytes_per_second=policy("compactionMaxBytesPerSecond",
                                                     settings.compaction_max_bytes_per_second))
            compactor = Compactor(compaction_config(settings))  # in this process: no broker to keep responsive
            try:
                figures = asyncio.run(CompactionRuns(compactor, statuses, max_concurrent_runs=1).run(job))
            finally:
                compactor.close()
            view = compacted.view
        finally:
            ledger.close()
    finally:
        data_dir.close()
    return full_name, figures, () if view is None else tuple(view.ledger_ids)


@contextmanager
def _progress_bar(console: Console) -> Iterator[ProgressCallback | None]:
    """A progress callback drawing one bar per phase on ``console``; None off a terminal."""
    if not console.is_terminal:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("entries"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(PHASE_LABELS.get(phase, phase), total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


def _fail(message: object, code: int) -> NoReturn:
    typer.echo(f"compactd: {message}", err=True)
    raise typer.Exit(code)


def compact_topic_command(
    data_dir: Annotated[str, typer.Option("--data-dir", metavar="PATH",
                                          help="Data dir of a stopped compactd broker.")],
    topic: Annotated[str, typer.Option("--topic", metavar="TOPIC",
                                       help="persistent://tenant/namespace/topic, or its short form.")],
    engine: Annotated[str, typer.Option("--engine", metavar="{local,spark}",
                                        help="Compaction engine.")] = "local",
    spark_master: Annotated[str | None, typer.Option(
        "--spark-master", metavar="URL", show_default=False,
        help="Spark master URL of the spark engine.")] = None,
) -> None:
    """Compact one topic of a stopped broker's data dir (Pulsar's compact-topic).

    Shows a progress bar on a terminal and prints one line of JSON at the end:
    topic, status, compacted (false: nothing new to compact), ledgerId (the compacted view's
    first ledger, the standing one when nothing was compacted), viewLedgers, removedEvents,
    entriesRead, messagesRead, entriesWritten, bytesWritten, durationMs. Settings (retain null key, phase-one timeout, ledger sizes)
    come from the environment and COMPACTD_CONFIG, as for compactd serve.
    """
    from api.broker.errors import InvalidTopicNameError, NotAllowedError

    if engine not in ENGINES:
        _fail(f"--engine: {engine!r} is not one of local, spark", EXIT_USAGE)
    flags: dict[str, object] = {"data_dir": data_dir, "compaction_engine": engine}
    if spark_master is not None:
        flags["spark_master"] = spark_master
    try:
        settings = settings_from_command_line(flags, os.environ)
    except ConfigError as error:
        _fail(error, EXIT_USAGE)
    try:
        with _progress_bar(Console(stderr=True)) as progress:
            full_name, figures, view_ledger_ids = compact_offline(settings, topic, progress=progress)
    except (InvalidTopicNameError, NotAllowedError) as error:
        _fail(error, EXIT_USAGE)
    except CompactionServiceError as error:
        _fail(error, EXIT_FAILURE)
    typer.echo(json.dumps(summary(full_name, figures, view_ledger_ids)))
