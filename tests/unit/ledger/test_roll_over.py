"""The roll-over state machine (``ledger.roll_over``): one test per row of the transition
table in its docstring, on the pure ``step`` (no ledger, no clock, no thread), plus the
back-off's end and the warning's rate limit over a sequence of events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.roll_over import (
    AdmitProducer,
    AppendEvent,
    CloseEvent,
    CurrentLedger,
    FailAppend,
    LogRecovered,
    LogWarning,
    QueueAppend,
    ReadyEvent,
    RejectAppend,
    RollNowEvent,
    RollOverFailedEvent,
    RollOverLimits,
    RollOverState,
    RollOverSucceededEvent,
    SealCurrent,
    SettleWaiters,
    StartRollOver,
    WaitForRollOver,
    WaitReady,
    WriteAppend,
    WriteFencedEvent,
    WrittenEvent,
    ledger_full,
    step,
)

LIMITS = RollOverLimits(max_entries_per_ledger=3, max_size_per_ledger_bytes=100, min_rollover_time_ms=50,
                        retry_ms=1_000, warning_interval_ms=10_000)
IDLE = RollOverState(LIMITS)
ROLLING = replace(IDLE, rolling=True)
CLOSED = replace(IDLE, closed=True)
NOW = 5_000
FAILED = CurrentLedger(failed=True)
SEALED = CurrentLedger(sealed=True)
EMPTIES = CurrentLedger(empty_ledgers_waiting=True)
BACKING_OFF = replace(IDLE, failed_at_ms=NOW - 10, failure="disk full")  # 990 ms of back-off left


# -- AppendEvent --------------------------------------------------------------------------


def test_closed_append_is_rejected() -> None:
    assert step(CLOSED, AppendEvent(NOW)) == (CLOSED, (RejectAppend(),))


def test_rolling_append_waits_in_the_queue() -> None:
    assert step(ROLLING, AppendEvent(NOW, FAILED)) == (ROLLING, (QueueAppend(),))


@pytest.mark.parametrize("current", [FAILED, SEALED])
def test_idle_append_backing_off_fails_at_once_until_the_back_off_ends(current: CurrentLedger) -> None:
    state, actions = step(BACKING_OFF, AppendEvent(NOW, current))
    assert state == BACKING_OFF
    assert actions == (FailAppend(until_ms=NOW - 10 + LIMITS.retry_ms, failure="disk full"),)


@pytest.mark.parametrize(("current", "seal"), [(FAILED, True), (SEALED, False),
                                               (CurrentLedger(failed=True, sealed=True), False)])
def test_idle_append_needing_a_roll_starts_one_with_it_as_trigger(current: CurrentLedger, seal: bool) -> None:
    for state in (IDLE, replace(BACKING_OFF, failed_at_ms=NOW - LIMITS.retry_ms)):  # time passed: back-off over
        after, actions = step(state, AppendEvent(NOW, current))
        assert after == replace(state, rolling=True)
        assert actions == (QueueAppend(trigger=True), StartRollOver(seal=seal, create=True))


def test_idle_append_with_empty_ledgers_waiting_starts_a_roll_over_that_only_drops_them() -> None:
    after, actions = step(IDLE, AppendEvent(NOW, EMPTIES))
    assert after.rolling
    assert actions == (QueueAppend(trigger=True), StartRollOver(seal=False, create=False))
    # during a back-off (of a failed drop) the empty ledgers wait: the append is written
    assert step(BACKING_OFF, AppendEvent(NOW, EMPTIES)) == (BACKING_OFF, (WriteAppend(),))


def test_idle_append_to_a_writable_ledger_is_written() -> None:
    assert step(IDLE, AppendEvent(NOW)) == (IDLE, (WriteAppend(),))
    assert step(BACKING_OFF, AppendEvent(NOW)) == (BACKING_OFF, (WriteAppend(),))


# -- WrittenEvent -------------------------------------------------------------------------


@pytest.mark.parametrize(("entries", "size_bytes"), [(3, 1), (1, 100), (4, 200)])
def test_written_reaching_a_limit_starts_a_roll_over(entries: int, size_bytes: int) -> None:
    after, actions = step(IDLE, WrittenEvent(entries, size_bytes, age_ms=LIMITS.min_rollover_time_ms))
    assert after == ROLLING
    assert actions == (StartRollOver(seal=True, create=True),)


@pytest.mark.parametrize(("entries", "size_bytes", "age_ms"), [(2, 99, 10_000), (3, 100, 49)])
def test_written_below_the_limits_or_too_young_does_nothing(entries: int, size_bytes: int, age_ms: int) -> None:
    assert step(IDLE, WrittenEvent(entries, size_bytes, age_ms)) == (IDLE, ())
    assert not ledger_full(LIMITS, entries=entries, size_bytes=size_bytes, age_ms=age_ms)


# -- WriteFencedEvent ---------------------------------------------------------------------


def test_write_fenced_on_a_first_try_rolls_past_the_ledger_with_the_append_first() -> None:
    assert step(IDLE, WriteFencedEvent()) == (
        ROLLING, (QueueAppend(trigger=True), StartRollOver(seal=True, create=True)))


def test_write_fenced_on_the_triggers_retry_fails_the_append() -> None:
    assert step(IDLE, WriteFencedEvent(retry=True)) == (IDLE, (FailAppend(),))


# -- the end of a roll-over -----------------------------------------------------------------


def test_roll_over_succeeded_settles_the_waiters() -> None:
    assert step(ROLLING, RollOverSucceededEvent(NOW)) == (IDLE, (SettleWaiters(),))


def test_roll_over_succeeded_after_failures_ends_the_back_off_and_logs_it() -> None:
    failing = replace(ROLLING, failed_at_ms=NOW - 2_000, failure="x", warned_at_ms=NOW - 2_000, unwarned_failures=4)
    assert step(failing, RollOverSucceededEvent(NOW)) == (IDLE, (LogRecovered(), SettleWaiters()))


def test_roll_over_failed_starts_the_back_off_warns_and_fails_the_waiters() -> None:
    after, actions = step(ROLLING, RollOverFailedEvent(NOW, "disk full"))
    assert after == replace(IDLE, failed_at_ms=NOW, failure="disk full", warned_at_ms=NOW)
    assert actions == (LogWarning("disk full", unlogged=0, retry_ms=LIMITS.retry_ms), SettleWaiters("disk full"))


def test_roll_over_failed_within_the_warning_interval_only_counts_the_failure() -> None:
    warned = replace(ROLLING, warned_at_ms=NOW - LIMITS.warning_interval_ms + 1, unwarned_failures=2)
    after, actions = step(warned, RollOverFailedEvent(NOW, "disk full"))
    assert actions == (SettleWaiters("disk full"),)
    assert (after.unwarned_failures, after.warned_at_ms, after.failed_at_ms) == (3, warned.warned_at_ms, NOW)


def test_roll_over_failed_after_the_warning_interval_warns_with_the_count() -> None:
    warned = replace(ROLLING, warned_at_ms=NOW - LIMITS.warning_interval_ms, unwarned_failures=2)
    after, actions = step(warned, RollOverFailedEvent(NOW, "disk full"))
    assert actions[0] == LogWarning("disk full", unlogged=2, retry_ms=LIMITS.retry_ms)
    assert (after.unwarned_failures, after.warned_at_ms) == (0, NOW)


def test_roll_over_failed_dropping_empties_only_backs_off_but_settles_the_waiters_well() -> None:
    after, actions = step(ROLLING, RollOverFailedEvent(NOW, "metadata full", writable=True))
    assert after.failed_at_ms == NOW and not after.rolling
    assert actions[-1] == SettleWaiters()


# -- ReadyEvent ---------------------------------------------------------------------------


def test_ready_when_closed_or_writable_admits() -> None:
    assert step(CLOSED, ReadyEvent(NOW, FAILED)) == (CLOSED, (AdmitProducer(),))
    for state in (IDLE, ROLLING, BACKING_OFF):
        assert step(state, ReadyEvent(NOW)) == (state, (AdmitProducer(),))


def test_ready_backing_off_fails_at_once() -> None:
    assert step(BACKING_OFF, ReadyEvent(NOW, SEALED)) == (
        BACKING_OFF, (FailAppend(until_ms=NOW - 10 + LIMITS.retry_ms, failure="disk full"),))


@pytest.mark.parametrize(("current", "seal"), [(FAILED, True), (SEALED, False)])
def test_ready_needing_a_roll_starts_one_and_waits(current: CurrentLedger, seal: bool) -> None:
    assert step(IDLE, ReadyEvent(NOW, current)) == (ROLLING, (WaitReady(), StartRollOver(seal=seal, create=True)))


def test_ready_while_rolling_waits_for_the_roll_over() -> None:
    assert step(ROLLING, ReadyEvent(NOW, FAILED)) == (ROLLING, (WaitReady(),))


# -- CloseEvent ---------------------------------------------------------------------------


def test_close_while_rolling_waits() -> None:
    assert step(ROLLING, CloseEvent()) == (ROLLING, (WaitForRollOver(),))


def test_close_when_idle_seals_and_closes() -> None:
    assert step(IDLE, CloseEvent()) == (CLOSED, (SealCurrent(),))


def test_delete_when_idle_closes_without_a_seal() -> None:
    assert step(IDLE, CloseEvent(seal=False)) == (CLOSED, ())


def test_close_when_closed_does_nothing() -> None:
    assert step(CLOSED, CloseEvent()) == (CLOSED, ())


# -- sequences and the machine's own invariants ---------------------------------------------


def test_a_failed_roll_over_backs_off_then_the_first_append_after_it_tries_again() -> None:
    state, _ = step(IDLE, WrittenEvent(3, 3, age_ms=100))
    state, _ = step(state, RollOverFailedEvent(NOW, "disk full"))
    for now_ms in (NOW, NOW + LIMITS.retry_ms - 1):
        assert step(state, AppendEvent(now_ms, FAILED))[1] == (FailAppend(NOW + LIMITS.retry_ms, "disk full"),)
    state, actions = step(state, AppendEvent(NOW + LIMITS.retry_ms, FAILED))
    assert state.rolling and actions[-1] == StartRollOver(seal=True, create=True)
    state, actions = step(state, RollOverSucceededEvent(NOW + LIMITS.retry_ms + 5))
    assert state == IDLE and actions == (LogRecovered(), SettleWaiters())


def test_one_roll_over_at_a_time_and_ends_only_when_one_is_in_flight() -> None:
    with pytest.raises(AssertionError, match="one roll-over at a time"):
        step(ROLLING, WrittenEvent(3, 3, age_ms=100))
    with pytest.raises(AssertionError, match="no roll-over is in flight"):
        step(IDLE, RollOverSucceededEvent(NOW))
    with pytest.raises(AssertionError, match="no roll-over is in flight"):
        step(IDLE, RollOverFailedEvent(NOW, "x"))
    with pytest.raises(AssertionError, match="only when idle"):
        step(ROLLING, WriteFencedEvent())


# -- RollNowEvent (``ManagedLedger.roll_over_now``) -------------------------------------


def test_roll_now_starts_a_roll_over_of_a_ledger_with_entries_whatever_the_limits() -> None:
    assert step(IDLE, RollNowEvent(has_entries=True)) == (ROLLING, (StartRollOver(seal=True, create=True),))


@pytest.mark.parametrize("state", [IDLE, CLOSED, ROLLING])
def test_roll_now_of_an_empty_ledger_or_a_closed_topic_does_nothing(state: RollOverState) -> None:
    assert step(state, RollNowEvent(has_entries=False)) == (state, ())
    if state is CLOSED:
        assert step(state, RollNowEvent(has_entries=True)) == (state, ())


def test_roll_now_during_a_roll_over_waits_for_it_then_asks_again() -> None:
    assert step(ROLLING, RollNowEvent(has_entries=True)) == (ROLLING, (WaitForRollOver(),))
