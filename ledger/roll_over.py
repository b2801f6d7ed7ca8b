"""The roll-over of a managed ledger, as a pure state machine: events in, actions out.

This module owns *when* a topic's current ledger is rolled over (sealed and replaced by a
new one), what happens to appends meanwhile, and the back-off after a failed roll-over
(Pulsar's ``WaitTimeAfterLedgerCreationFailureMs``) with its rate-limited warning. It does
no I/O and reads no clock: ``ledger.managed_ledger`` feeds it events (each carrying
``now_ms`` and the facts about the current ledger it needs) and carries out the actions
it returns. The ledger list, the counts and the I/O stay with the managed ledger.

There is one mode. A roll-over always runs outside the managed ledger's lock, and the
appends that arrive meanwhile wait in a queue, in order, for the new ledger; the managed
ledger only chooses the thread that runs it (a roll-over thread for the broker, the
appender's own thread otherwise).

Time passing is not an event of its own: every event carries ``now_ms``, and a back-off
that began at ``failed_at_ms`` is over for the first event at or after
``failed_at_ms + retry_ms``. "The current ledger needs a roll" means it failed a write or
is sealed (``CurrentLedger.needs_roll``); "backing off" means it needs one and a roll-over
failed less than ``retry_ms`` ago.

Transition table (``step``; states: *closed*, *rolling* = a roll-over in flight, *idle*):

=======  ==============================================  =======  ===============================================
state    event                                           next     actions
=======  ==============================================  =======  ===============================================
closed   AppendEvent                                     closed   RejectAppend
rolling  AppendEvent                                     rolling  QueueAppend
idle     AppendEvent, backing off                        idle     FailAppend(until_ms)
idle     AppendEvent, needs a roll (back-off over)       rolling  QueueAppend(trigger), StartRollOver(create)
idle     AppendEvent, empty ledgers wait, no back-off    rolling  QueueAppend(trigger), StartRollOver(drop only)
idle     AppendEvent, otherwise                          idle     WriteAppend
idle     WrittenEvent, the ledger reached a limit        rolling  StartRollOver(seal, create)
idle     WrittenEvent, below the limits                  idle     (none)
idle     WriteFencedEvent, a first try                   rolling  QueueAppend(trigger), StartRollOver(seal, create)
idle     WriteFencedEvent, the trigger's retry           idle     FailAppend(the write's error)
rolling  RollOverSucceededEvent                          idle     LogRecovered (after failures), SettleWaiters
rolling  RollOverFailedEvent, ledger not writable        idle     LogWarning (once per interval), SettleWaiters(fail)
rolling  RollOverFailedEvent, only empties kept          idle     LogWarning (once per interval), SettleWaiters
closed   ReadyEvent                                      closed   AdmitProducer
any      ReadyEvent, no roll needed                      same     AdmitProducer
idle     ReadyEvent, backing off                         idle     FailAppend(until_ms)
idle     ReadyEvent, needs a roll (back-off over)        rolling  WaitReady, StartRollOver(seal if failed, create)
rolling  ReadyEvent, needs a roll                        rolling  WaitReady
rolling  CloseEvent                                      rolling  WaitForRollOver (the caller waits, then again)
idle     CloseEvent                                      closed   SealCurrent
idle     CloseEvent(seal=False), a delete                closed   (none)
closed   CloseEvent                                      closed   (none)
idle     RollNowEvent, the current ledger has entries    rolling  StartRollOver(seal, create)
rolling  RollNowEvent, it has entries                    rolling  WaitForRollOver (the caller waits, then again)
any      RollNowEvent, otherwise (or closed)             same     (none)
=======  ==============================================  =======  ===============================================

A failed roll-over starts the back-off (``failed_at_ms``); a successful one ends it. The
warning is logged for the first failure, then at most once per ``warning_interval_ms``,
naming the failures not logged since. ``SettleWaiters`` answers the producers waiting on
``ready_for_appends``, fails the trigger append when the ledger is not writable, and hands
the queued appends back as ``AppendEvent``s (the trigger's with ``retry=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "Action",
    "AdmitProducer",
    "AppendEvent",
    "CloseEvent",
    "CurrentLedger",
    "Event",
    "FailAppend",
    "LogRecovered",
    "LogWarning",
    "QueueAppend",
    "ReadyEvent",
    "RejectAppend",
    "RollNowEvent",
    "RollOverFailedEvent",
    "RollOverLimits",
    "RollOverState",
    "RollOverSucceededEvent",
    "SealCurrent",
    "SettleWaiters",
    "StartRollOver",
    "WaitForRollOver",
    "WaitReady",
    "WriteAppend",
    "WriteFencedEvent",
    "WrittenEvent",
    "ledger_full",
    "step",
]


@dataclass(frozen=True, slots=True)
class RollOverLimits:
    """When a ledger is full and how long a failed roll-over backs off (from
    ``ManagedLedgerConfig``; see there for the reasons behind each default)."""

    max_entries_per_ledger: int
    max_size_per_ledger_bytes: int
    min_rollover_time_ms: int
    retry_ms: int
    warning_interval_ms: int


@dataclass(frozen=True, slots=True)
class RollOverState:
    """Everything the roll-over remembers between events.

    Attributes:
        limits: the fixed limits.
        closed: the managed ledger takes no append any more.
        rolling: a roll-over is in flight; appends wait in the queue.
        failed_at_ms: when the last roll-over failed; None once one succeeds.
        failure: why it failed.
        warned_at_ms: when the last warning was logged; None once a roll-over succeeds.
        unwarned_failures: failed roll-overs since that warning.
    """

    limits: RollOverLimits
    closed: bool = False
    rolling: bool = False
    failed_at_ms: int | None = None
    failure: str = ""
    warned_at_ms: int | None = None
    unwarned_failures: int = 0

    def backoff_until_ms(self) -> int:
        """The end of the back-off (meaningful while ``failed_at_ms`` is set)."""
        assert self.failed_at_ms is not None, "no roll-over failed"
        return self.failed_at_ms + self.limits.retry_ms

    def in_back_off(self, now_ms: int) -> bool:
        """Whether a roll-over failed less than ``retry_ms`` before ``now_ms``."""
        return self.failed_at_ms is not None and now_ms < self.backoff_until_ms()


@dataclass(frozen=True, slots=True)
class CurrentLedger:
    """What an event needs to know of the ledger list.

    Attributes:
        failed: a write to the current ledger failed (it is fenced).
        sealed: the current ledger is sealed.
        empty_ledgers_waiting: sealed, empty ledgers wait to leave the list.
    """

    failed: bool = False
    sealed: bool = False
    empty_ledgers_waiting: bool = False

    @property
    def needs_roll(self) -> bool:
        return self.failed or self.sealed


WRITABLE = CurrentLedger()


# -- events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendEvent:
    """An append arrived (``retry``: the append that asked for the roll-over just ended,
    taken again)."""

    now_ms: int
    current: CurrentLedger = WRITABLE
    retry: bool = False


@dataclass(frozen=True, slots=True)
class WrittenEvent:
    """An append was handed to the current ledger, which now holds ``entries`` entries and
    ``size_bytes`` bytes (durable or not) and is ``age_ms`` old."""

    entries: int
    size_bytes: int
    age_ms: int


@dataclass(frozen=True, slots=True)
class WriteFencedEvent:
    """The current ledger refused an append: an earlier write to it failed."""

    retry: bool = False


@dataclass(frozen=True, slots=True)
class RollOverSucceededEvent:
    """The roll-over in flight ended with a writable current ledger and no empty ledger left."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class RollOverFailedEvent:
    """The roll-over in flight failed: ``writable`` when only dropping empty ledgers did
    (the current ledger takes appends; the empty ones stay listed until a later try)."""

    now_ms: int
    error: str
    writable: bool = False


@dataclass(frozen=True, slots=True)
class ReadyEvent:
    """A producer asks whether the topic takes appends."""

    now_ms: int
    current: CurrentLedger = WRITABLE


@dataclass(frozen=True, slots=True)
class CloseEvent:
    """The managed ledger is being closed (``seal``) or deleted (not sealed: it goes)."""

    seal: bool = True


@dataclass(frozen=True, slots=True)
class RollNowEvent:
    """A roll-over is asked for now, whatever the limits (``ManagedLedger.roll_over_now``):
    ``has_entries``, the current ledger holds entries (an empty one is not rolled)."""

    has_entries: bool


Event = (RollNowEvent | AppendEvent | WrittenEvent | WriteFencedEvent | RollOverSucceededEvent | RollOverFailedEvent
         | ReadyEvent | CloseEvent)


# -- actions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RejectAppend:
    """Raise: the managed ledger is closed."""


@dataclass(frozen=True, slots=True)
class QueueAppend:
    """Let the append wait for the roll-over in flight; ``trigger``: at the head of the
    queue, as the append that asked for it."""

    trigger: bool = False


@dataclass(frozen=True, slots=True)
class FailAppend:
    """Fail the append (or the producer's readiness) now, touching no file: backing off
    until ``until_ms``, or (None) with the error at hand."""

    until_ms: int | None = None
    failure: str = ""


@dataclass(frozen=True, slots=True)
class WriteAppend:
    """Hand the append to the current ledger."""


@dataclass(frozen=True, slots=True)
class StartRollOver:
    """Run a roll-over, outside the lock: ``seal`` the current ledger (at its last durable
    entry) unless sealed already, ``create`` the next one, then drop the empty ledgers."""

    seal: bool
    create: bool


@dataclass(frozen=True, slots=True)
class LogWarning:
    """Log that a roll-over failed, with the failures not logged since the last warning."""

    error: str
    unlogged: int
    retry_ms: int


@dataclass(frozen=True, slots=True)
class LogRecovered:
    """Log that a roll-over succeeded after failures."""


@dataclass(frozen=True, slots=True)
class SettleWaiters:
    """A roll-over ended: answer the waiting producers (``error``: fail them and the
    trigger append) and take the queued appends again."""

    error: str | None = None


@dataclass(frozen=True, slots=True)
class AdmitProducer:
    """The topic takes appends now."""


@dataclass(frozen=True, slots=True)
class WaitReady:
    """The producer's answer waits for the roll-over in flight."""


@dataclass(frozen=True, slots=True)
class WaitForRollOver:
    """Wait until no roll-over is in flight, then send the event again."""


@dataclass(frozen=True, slots=True)
class SealCurrent:
    """Seal the current ledger after its pending appends."""


Action = (RejectAppend | QueueAppend | FailAppend | WriteAppend | StartRollOver | LogWarning | LogRecovered
          | SettleWaiters | AdmitProducer | WaitReady | WaitForRollOver | SealCurrent)
Step = tuple[RollOverState, tuple[Action, ...]]

_WRITE: tuple[Action, ...] = (WriteAppend(),)
_NOTHING: tuple[Action, ...] = ()


def ledger_full(limits: RollOverLimits, *, entries: int, size_bytes: int, age_ms: int) -> bool:
    """Whether a ledger holding this much, this old, is rolled over after its last append."""
    full = entries >= limits.max_entries_per_ledger or size_bytes >= limits.max_size_per_ledger_bytes
    return full and age_ms >= limits.min_rollover_time_ms


def step(state: RollOverState, event: Event) -> Step:
    """The next state and the actions to carry out, in order (the table above)."""
    if isinstance(event, AppendEvent):
        return _append(state, event)
    if isinstance(event, WrittenEvent):
        if not ledger_full(state.limits, entries=event.entries, size_bytes=event.size_bytes, age_ms=event.age_ms):
            return state, _NOTHING
        return _start(state, StartRollOver(seal=True, create=True))
    if isinstance(event, WriteFencedEvent):
        assert not state.rolling and not state.closed, "a write happens only when idle"
        if event.retry:
            return state, (FailAppend(),)
        return _start(state, QueueAppend(trigger=True), StartRollOver(seal=True, create=True))
    if isinstance(event, RollOverSucceededEvent):
        return _succeeded(state)
    if isinstance(event, RollOverFailedEvent):
        return _failed(state, event)
    if isinstance(event, ReadyEvent):
        return _ready(state, event)
    if isinstance(event, RollNowEvent):
        if state.closed or not event.has_entries:
            return state, _NOTHING
        if state.rolling:
            return state, (WaitForRollOver(),)
        return _start(state, StartRollOver(seal=True, create=True))
    return _close(state, event)


def _start(state: RollOverState, *actions: Action) -> Step:
    assert not state.rolling, "one roll-over at a time"
    return replace(state, rolling=True), actions


def _append(state: RollOverState, event: AppendEvent) -> Step:
    if state.closed:
        return state, (RejectAppend(),)
    if state.rolling:
        return state, (QueueAppend(),)
    current = event.current
    in_back_off = state.in_back_off(event.now_ms)
    if current.needs_roll and in_back_off:
        return state, (FailAppend(state.backoff_until_ms(), state.failure),)
    if current.needs_roll:
        plan = StartRollOver(seal=current.failed and not current.sealed, create=True)
        return _start(state, QueueAppend(trigger=True), plan)
    if current.empty_ledgers_waiting and not in_back_off:
        return _start(state, QueueAppend(trigger=True), StartRollOver(seal=False, create=False))
    return state, _WRITE


def _succeeded(state: RollOverState) -> Step:
    assert state.rolling, "no roll-over is in flight"
    recovered: tuple[Action, ...] = (LogRecovered(),) if state.failed_at_ms is not None else ()
    after = replace(state, rolling=False, failed_at_ms=None, failure="", warned_at_ms=None, unwarned_failures=0)
    return after, (*recovered, SettleWaiters())


def _failed(state: RollOverState, event: RollOverFailedEvent) -> Step:
    assert state.rolling, "no roll-over is in flight"
    settle = SettleWaiters(None if event.writable else event.error)
    after = replace(state, rolling=False, failed_at_ms=event.now_ms, failure=event.error)
    warned = state.warned_at_ms
    if warned is not None and event.now_ms - warned < state.limits.warning_interval_ms:
        return replace(after, unwarned_failures=state.unwarned_failures + 1), (settle,)
    warning = LogWarning(event.error, state.unwarned_failures, state.limits.retry_ms)
    return replace(after, warned_at_ms=event.now_ms, unwarned_failures=0), (warning, settle)


def _ready(state: RollOverState, event: ReadyEvent) -> Step:
    if state.closed or not event.current.needs_roll:
        return state, (AdmitProducer(),)
    if state.rolling:
        return state, (WaitReady(),)
    if state.in_back_off(event.now_ms):
        return state, (FailAppend(state.backoff_until_ms(), state.failure),)
    plan = StartRollOver(seal=event.current.failed and not event.current.sealed, create=True)
    return _start(state, WaitReady(), plan)


def _close(state: RollOverState, event: CloseEvent) -> Step:
    if state.closed:
        return state, _NOTHING
    if state.rolling:
        return state, (WaitForRollOver(),)
    return replace(state, closed=True), ((SealCurrent(),) if event.seal else _NOTHING)
