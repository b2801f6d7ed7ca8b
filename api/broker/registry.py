"""The topic registry: the one owner of which topics exist in memory, load, close and are deleted.

``TopicRegistry`` feeds events to the pure lifecycle machine (``api.broker.topic_state.TopicStates``,
which decides; its docstring holds the transition table) and carries out the actions it
returns:

* **loaded topics**: the ``Topic`` each loaded name serves (``get``, ``loaded_topics``; a
  read-only ``loaded`` view); a topic enters on ``Publish`` and leaves on ``Unpublish``,
  before its close or deletion starts, so nothing attaches to a closing or deleted topic;
* **loads** (``load``): one open per name in flight, on a ``topic-load`` thread, shared by
  every caller (a cancelled caller cancels no one else's); one that waits for an unload to
  end holds no thread meanwhile; ``get_topic`` is the synchronous form for callers that may
  open on their own thread (offline callers, tests; on the loop it never waits);
* **unloads** (``unload``) and **deletes** (``delete``): the topic's close or deletion off the
  loop (a de-duplication start in flight ends first), awaited;
* **a partitioned parent's delete** (``holding``): its partitions' loads in flight end,
  then no partition loads until the parent's delete ends;
* **the stop** (``stop``): the loaded topics and the loads in flight are closed.

Refusals are ``NotAllowedError`` naming the topic and why. Every wait is bounded by an
open, a close or a delete in flight. Call everything on the broker's event loop (but
``get_topic``, which a caller off the loop may call while the loop does not run).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import MappingProxyType
from typing import TYPE_CHECKING

from api.broker.errors import NotAllowedError
from api.broker.topic_name import TopicName
from api.broker.topic_state import (
    Action,
    Close,
    Closed,
    Delete,
    DeleteEnded,
    DeleteRequested,
    Discard,
    Event,
    Forget,
    Join,
    LoadRequested,
    Marked,
    Open,
    Opened,
    OpenFailed,
    Phase,
    Publish,
    Ready,
    Reject,
    RejectReason,
    Released,
    Stopped,
    TopicStates,
    UnloadRequested,
    Unpublish,
)

if TYPE_CHECKING:
    from api.broker.topic import Topic

__all__ = ["LOAD_THREADS", "TopicRegistry"]

log = logging.getLogger(__name__)

LOAD_THREADS = 4
"""Topics opened at once (``topic-load`` threads)."""

Opener = Callable[[TopicName, asyncio.AbstractEventLoop], "Topic"]
Check = Callable[[TopicName], None]


class TopicRegistry:
    """The broker's topics and their lifecycle; see the module docstring."""

    def __init__(self, open_topic: Opener) -> None:
        self._open_topic = open_topic
        self._states = TopicStates()
        self._loaded: dict[str, Topic] = {}
        self._opens: dict[int, Future[Topic]] = {}  # by load id: opens in flight (or waiting for a close)
        self._closes: dict[str, Future[None]] = {}  # closes in flight
        self._load_ids = itertools.count(1)
        self._discards: set[asyncio.Task[None]] = set()  # loads opened after the stop began, closing
        self._pool = ThreadPoolExecutor(max_workers=LOAD_THREADS, thread_name_prefix="topic-load")

    # -- reads --------------------------------------------------------------------------

    def get(self, key: str) -> Topic | None:
        """The loaded topic named ``key`` (its canonical name), or None."""
        return self._loaded.get(key)

    def loaded_topics(self) -> list[Topic]:
        """A snapshot of the loaded topics."""
        return list(self._loaded.values())

    @property
    def loaded(self) -> Mapping[str, Topic]:
        """The loaded topics by name, read-only."""
        return MappingProxyType(self._loaded)

    def phase(self, key: str) -> Phase | None:
        """Where the topic ``key`` is in its life (None: not in memory)."""
        return self._states.phase(key)

    def is_loading(self, key: str) -> bool:
        return self._states.phase(key) in (Phase.LOADING, Phase.REOPENING)

    def loading_topics(self) -> list[str]:
        """The names with a load in flight (or waiting for their close to end)."""
        return self._states.topics(Phase.LOADING) + self._states.topics(Phase.REOPENING)

    def deleting(self, key: str) -> bool:
        """The topic is being deleted (or held by its partitioned parent's delete)."""
        return self._states.phase(key) is Phase.DELETING or self._states.marked(key)

    def check_not_deleting(self, key: str) -> None:
        """``NotAllowedError`` while the topic is being deleted (or held by its parent's delete)."""
        if self.deleting(key):
            raise NotAllowedError(f"Topic {key} is being deleted")

    # -- loads --------------------------------------------------------------------------

    async def load(self, name: TopicName, check: Check) -> Topic:
        """The loaded topic ``name``, opened off the loop when it is not loaded (``check``
        refuses first, unless a load is in flight already)."""
        key = str(name)
        loop = asyncio.get_running_loop()
        while (topic := self._loaded.get(key)) is None:
            if not self.is_loading(key):
                check(name)
            actions = self._handle(LoadRequested(key, next(self._load_ids)))
            if any(isinstance(action, Ready) for action in actions):  # pragma: no cover - loaded is published
                continue
            load_id = self._states.load_id(key)
            assert load_id is not None, actions
            load = self._opens.setdefault(load_id, Future())
            for action in actions:
                if isinstance(action, Open):
                    self._submit(name, action.load_id, loop)
            await asyncio.shield(asyncio.wrap_future(load))  # a cancelled caller cancels no one else's load
            self._open_ended(key, load_id, load)  # (ended on the loop already, as this resumed)
        return topic

    def get_topic(self, name: TopicName, check: Check, loop: asyncio.AbstractEventLoop) -> Topic:
        """``load`` on the caller's thread: a load or unload in flight is refused on the
        loop (waiting there would hold the loop that ends it); a caller off the loop waits
        for a load in flight."""
        key = str(name)
        while (topic := self._loaded.get(key)) is None:
            if not self.is_loading(key):
                check(name)
            load_id = next(self._load_ids)
            try:
                actions = self._handle(LoadRequested(key, load_id, wait=False))
            except NotAllowedError:
                current = self._states.load_id(key)
                pending = self._opens.get(current) if current is not None else None
                if _on_an_event_loop() or pending is None or self._states.phase(key) is not Phase.LOADING:
                    raise
                with contextlib.suppress(Exception):
                    pending.result()  # a sync caller off the loop racing a load
                self._open_ended(key, current, pending)  # type: ignore[arg-type]
                continue
            if any(isinstance(action, Open) for action in actions):
                load: Future[Topic] = Future()
                try:
                    load.set_result(self._open_topic(name, loop))
                except Exception as error:  # noqa: BLE001 - the load's error is its caller's, raised below
                    load.set_exception(error)
                self._opens[load_id] = load
                self._open_ended(key, load_id, load)
                if load.exception() is not None:
                    raise load.exception()  # type: ignore[misc]
        return topic

    async def settle(self, keys: Iterable[str] | None = None) -> None:
        """Wait until the loads in flight of ``keys`` (None: every load in flight) have ended
        and their topics are loaded (a failed load is only forgotten)."""
        for key in list(keys) if keys is not None else self.loading_topics():
            load_id = self._states.load_id(key)
            load = self._opens.get(load_id) if load_id is not None and self.is_loading(key) else None
            if load is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.wrap_future(load))
                self._open_ended(key, load_id, load)  # type: ignore[arg-type]

    def _submit(self, name: TopicName, load_id: int, loop: asyncio.AbstractEventLoop) -> None:
        """Open ``name`` on a ``topic-load`` thread as load ``load_id``; the loop learns its end."""
        key = str(name)
        load = self._opens[load_id]

        def ended(_: object) -> None:
            try:
                loop.call_soon_threadsafe(self._open_ended, key, load_id, load)
            except RuntimeError:  # the loop is closed: nobody can use the topic
                log.debug("topic %s loaded after the loop closed", key)

        load.add_done_callback(ended)
        try:
            opened = self._pool.submit(self._open_topic, name, loop)
        except RuntimeError as error:  # the pool is shut down: the broker stops
            load.set_exception(error)
            return
        opened.add_done_callback(functools.partial(_settle, load))

    def _open_ended(self, key: str, load_id: int, load: Future[Topic]) -> None:
        """On the loop: the end of open ``load_id`` is an event (once)."""
        if not load.done() or self._opens.get(load_id) is not load:
            return
        del self._opens[load_id]
        self._handle(Opened(key, load_id) if load.exception() is None else OpenFailed(key, load_id),
                     opened=load)

    # -- unloads, deletes ---------------------------------------------------------------

    async def unload(self, topic: Topic) -> None:
        """Drop the loaded ``topic`` and close it off the loop, awaited (a load of the name
        meanwhile waits for the close, then opens it again); a close in flight of it is
        waited for; a topic no longer loaded is left as it is."""
        key = str(topic.name)
        if self._loaded.get(key) is not topic:
            closing = self._closes.get(key)
            if closing is not None:
                await asyncio.shield(asyncio.wrap_future(closing))
            return
        for action in self._handle(UnloadRequested(key)):
            if isinstance(action, Close):
                await self._close(key, topic)

    async def delete(self, topic: Topic) -> None:
        """Drop the loaded ``topic`` and delete it (its ledgers, cursors, rows and files) off
        the loop once a de-duplication start in flight has ended, awaited; meanwhile its
        loads are refused. The caller checked its clients and runs."""
        key = str(topic.name)
        if self._loaded.get(key) is not topic:
            raise NotAllowedError(f"Topic {key} is not loaded; try again")
        for action in self._handle(DeleteRequested(key)):
            if isinstance(action, Delete):
                try:
                    await topic.deduplication_settled()  # its cursor, created off the loop, before the delete
                    await asyncio.to_thread(topic.delete)
                finally:
                    self._handle(DeleteEnded(key))

    @contextlib.asynccontextmanager
    async def holding(self, keys: list[str]) -> AsyncIterator[None]:
        """While the block runs (a partitioned parent's delete), none of ``keys`` loads: their
        loads in flight end first (one may be creating a partition's first ledger)."""
        while True:
            await self.settle(keys)
            try:
                self._handle(Marked(tuple(keys)))
                break
            except NotAllowedError:  # a load started meanwhile: wait for it too
                continue
        try:
            yield
        finally:
            self._handle(Released(tuple(keys)))

    async def _close(self, key: str, topic: Topic) -> None:
        """Close the unpublished ``topic`` off the loop (a failed close leaves its seal to
        the next open's recovery); then ``Closed``."""
        closed: Future[None] = Future()
        self._closes[key] = closed
        try:
            await topic.close_off_loop()
        finally:
            if self._closes.get(key) is closed:
                del self._closes[key]
            closed.set_result(None)
            self._handle(Closed(key))

    # -- the stop -----------------------------------------------------------------------

    async def stop(self) -> None:
        """Close every loaded topic and every load in flight (once opened); loads are refused
        from now on (a close that fails is logged: the data dir syncs the rest)."""
        loaded = dict(self._loaded)
        closing = [(loaded[action.topic], action.topic) for action in self._handle(Stopped())
                   if isinstance(action, Close)]
        for load_id, load in list(self._opens.items()):
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(load)
            key = next((k for k in self.loading_topics() if self._states.load_id(k) == load_id), None)
            if key is not None:
                self._open_ended(key, load_id, load)
        for topic, key in closing:
            try:
                await self._close(key, topic)
            except Exception as error:  # noqa: BLE001 - keep closing the others
                log.warning("closing %s: %s", key, error)
        await asyncio.gather(*self._discards)
        self._pool.shutdown(wait=False)

    # -- the executor -------------------------------------------------------------------

    def _handle(self, event: Event, *, opened: Future[Topic] | None = None) -> list[Action]:
        """Feed ``event`` to the machine and carry out what needs no waiting; ``Reject``
        raises. The actions are returned for the caller to carry out the rest (``Open``,
        ``Close``, ``Delete``)."""
        actions = self._states.handle(event)
        for action in actions:
            match action:
                case Reject():
                    if action.reason is RejectReason.NOT_LOADED:
                        raise NotAllowedError(f"Topic {action.topic} is not loaded")
                    if action.reason is RejectReason.STOPPING:
                        raise NotAllowedError(f"Topic {action.topic} cannot load: {action.reason.value}")
                    suffix = "" if action.reason is RejectReason.DELETING else "; try again"
                    raise NotAllowedError(f"Topic {action.topic} is {action.reason.value}{suffix}")
                case Publish():
                    assert opened is not None
                    self._loaded[action.topic] = opened.result()
                case Unpublish():
                    self._loaded.pop(action.topic, None)
                case Discard():
                    assert opened is not None
                    task = asyncio.ensure_future(self._discard(action.topic, opened.result()))
                    self._discards.add(task)
                    task.add_done_callback(self._discards.discard)
                case Forget() if isinstance(event, Closed):  # a load waiting for the close, at the stop
                    waiting = self._opens.pop(action.load_id, None)
                    if waiting is not None and not waiting.done():
                        waiting.set_exception(NotAllowedError(f"Topic {action.topic} cannot load: "
                                                              f"{RejectReason.STOPPING.value}"))
                case Open() if isinstance(event, Closed):
                    self._submit(TopicName.parse(action.topic), action.load_id, asyncio.get_running_loop())
                case Ready() | Join() | Forget() | Open() | Close() | Delete():
                    pass  # the caller's (Forget: the load's error is its callers')
        return actions

    async def _discard(self, key: str, topic: Topic) -> None:
        try:
            await self._close(key, topic)
        except Exception as error:  # noqa: BLE001 - the stop goes on
            log.warning("closing %s: %s", key, error)


def _on_an_event_loop() -> bool:
    """The calling thread runs an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _settle(target: Future[Topic], source: Future[Topic]) -> None:
    """Give ``target`` the outcome of ``source``."""
    if source.cancelled():
        target.set_exception(RuntimeError("the topic's load was cancelled"))
        return
    error = source.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())
