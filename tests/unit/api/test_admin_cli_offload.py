"""``compactd admin topics offload|offload-status`` and the offload policy verbs, against a
recording httpx transport (the requests they send, their output and exit codes), and the
size-threshold rule of ``pulsar-admin topics offload -s`` as a table and a property."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.admin_cli_offload import offload_message_id, parse_signed_duration_ms, parse_signed_size
from tests.unit.api.test_admin_cli import Recorder, _admin

TOPIC_PATH = "/admin/v2/persistent/public/default/t"


@pytest.fixture(autouse=True)
def _no_compactd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("COMPACTD_"):
            monkeypatch.delenv(name)


def _ledgers(*sizes: int) -> list[dict[str, int]]:
    return [{"ledgerId": 10 + index, "entries": 1, "size": size} for index, size in enumerate(sizes)]


@pytest.mark.parametrize(("sizes", "threshold", "expected"), [
    ((100, 100, 100, 10), 150, (12, 0)),    # 10 + 100 = 110 kept; + 100 > 150: 10 and 11 go
    ((100, 100, 100, 10), 110, (12, 0)),    # 110 is not > 110: ledger 12 stays too
    ((100, 100, 100, 10), 109, (13, 0)),    # 110 > 109 at ledger 12: everything before 13 goes
    ((100, 100, 100, 10), 0, (13, 0)),      # the current ledger alone exceeds 0
    ((100, 100, 100, 10), 310, None),       # never exceeded: nothing to offload
    ((100, 100, 100, 0), 0, (13, 0)),       # an empty current ledger: 100 > 0 at 12, so before 13
    ((), 0, None),
])
def test_size_threshold_picks_the_message_id_as_pulsar_admin(
        sizes: tuple[int, ...], threshold: int, expected: tuple[int, int] | None) -> None:
    assert offload_message_id(_ledgers(*sizes), threshold) == expected


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=12), st.integers(0, 5000))
def test_size_threshold_offloads_exactly_what_does_not_fit(sizes: list[int], threshold: int) -> None:
    """The ledgers kept (from the chosen one on) hold at most ``threshold`` bytes (but the
    newest is always kept), and keeping the next older one too would exceed it; None
    exactly when everything fits."""
    ledgers = _ledgers(*sizes)
    chosen = offload_message_id(ledgers, threshold)
    if chosen is None:
        assert sum(sizes) <= threshold
        return
    first_kept = chosen[0] - 10
    assert chosen[1] == 0 and 0 <= first_kept < len(sizes)
    assert sum(sizes[first_kept:]) <= threshold or first_kept == len(sizes) - 1
    assert sum(sizes[first_kept - 1:]) > threshold if first_kept > 0 else sizes[-1] > threshold


@pytest.mark.parametrize(("text", "expected"), [("-1", -1), ("0", 0), ("10M", 10 << 20), ("-2K", -2048)])
def test_signed_sizes(text: str, expected: int) -> None:
    assert parse_signed_size(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("-1", -1), ("4h", 14_400_000), ("0", 0)])
def test_signed_durations(text: str, expected: int) -> None:
    assert parse_signed_duration_ms(text) == expected


def test_offload_with_a_message_id_puts_it() -> None:
    recorder = Recorder()
    result = _admin(recorder, "topics", "offload", "-m", "12:3", "t")
    assert result.exit_code == 0, result.output
    assert recorder.calls == [("PUT", TOPIC_PATH + "/offload", {"ledgerId": 12, "entryId": 3, "partitionIndex": -1})]
    assert "messages before 12:3" in result.stdout


def test_offload_with_a_size_reads_the_internal_stats_first() -> None:
    stats = httpx.Response(200, json={"ledgers": _ledgers(100, 100, 100, 10)})
    recorder = Recorder(stats, httpx.Response(204))
    result = _admin(recorder, "topics", "offload", "--size-threshold", "150", "t")
    assert result.exit_code == 0, result.output
    assert recorder.calls == [("GET", TOPIC_PATH + "/internalStats", None),
                              ("PUT", TOPIC_PATH + "/offload", {"ledgerId": 12, "entryId": 0, "partitionIndex": -1})]


def test_offload_with_a_size_that_holds_everything_sends_nothing() -> None:
    recorder = Recorder(httpx.Response(200, json={"ledgers": _ledgers(100, 10)}))
    result = _admin(recorder, "topics", "offload", "-s", "1M", "t")
    assert result.exit_code == 0, result.output
    assert [call[0] for call in recorder.calls] == ["GET"]
    assert "Nothing to offload" in result.stdout


@pytest.mark.parametrize(("args", "named"), [
    ([], "exactly one"), (["-s", "1M", "-m", "1:0"], "exactly one"),
    (["-s", "ten"], "'ten'"), (["-s", "-1"], "'-1'"), (["-m", "12"], "'12'"), (["-m", "a:b"], "'a:b'"),
])
def test_offload_usage_errors_name_the_value(args: list[str], named: str) -> None:
    recorder = Recorder()
    result = _admin(recorder, "topics", "offload", *args, "t")
    assert result.exit_code == 2
    assert named in result.output
    assert recorder.requests == []


def test_offload_conflict_is_one_line_and_exit_1() -> None:
    recorder = Recorder(httpx.Response(409, json={"reason": "Offload already running"}))
    result = _admin(recorder, "topics", "offload", "-m", "5:0", "t")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: Offload already running (HTTP 409)"


def _status(status: str, last_error: str = "") -> httpx.Response:
    first = {"ledgerId": 7, "entryId": 0, "partitionIndex": -1} if status == "SUCCESS" else \
        {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
    return httpx.Response(200, json={"status": status, "lastError": last_error, "firstUnoffloadedMessage": first})


def test_offload_status_wait_polls_until_it_ends() -> None:
    recorder = Recorder(_status("RUNNING"), _status("RUNNING"), _status("SUCCESS"))
    result = _admin(recorder, "topics", "offload-status", "-w", "--poll-interval", "0.01", "t")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["firstUnoffloadedMessage"]["ledgerId"] == 7
    assert recorder.calls == [("GET", TOPIC_PATH + "/offload", None)] * 3


def test_offload_status_without_wait_asks_once() -> None:
    recorder = Recorder(_status("RUNNING"))
    result = _admin(recorder, "topics", "offload-status", "t")
    assert result.exit_code == 0
    assert len(recorder.requests) == 1


def test_offload_status_error_exits_1_with_the_last_error() -> None:
    recorder = Recorder(_status("ERROR", "Invalid position for offload: 99:0"))
    result = _admin(recorder, "topics", "offload-status", "-w", "t")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: offload failed: Invalid position for offload: 99:0"


@pytest.mark.parametrize(("args", "call"), [
    (["namespaces", "set-offload-threshold", "-s", "10M", "public/default"],
     ("POST", "/admin/v2/namespaces/public/default/offloadThreshold", 10 << 20)),
    (["namespaces", "set-offload-threshold", "--size", "-1", "public/default"],
     ("POST", "/admin/v2/namespaces/public/default/offloadThreshold", -1)),
    (["topics", "set-offload-threshold", "-s", "0", "t"], ("POST", TOPIC_PATH + "/offloadThreshold", 0)),
    (["namespaces", "set-offload-deletion-lag", "-l", "4h", "public/default"],
     ("POST", "/admin/v2/namespaces/public/default/offloadDeletionLagMs", 14_400_000)),
    (["topics", "set-offload-deletion-lag", "--lag", "0", "t"], ("POST", TOPIC_PATH + "/offloadDeletionLagMs", 0)),
    (["namespaces", "get-offload-threshold", "public/default"],
     ("GET", "/admin/v2/namespaces/public/default/offloadThreshold", None)),
    (["topics", "remove-offload-deletion-lag", "t"], ("DELETE", TOPIC_PATH + "/offloadDeletionLagMs", None)),
])
def test_offload_policy_verbs_send_their_request(args: list[str], call: tuple[str, str, object]) -> None:
    recorder = Recorder()
    result = _admin(recorder, *args)
    assert result.exit_code == 0, result.output
    assert recorder.calls == [call]


def test_a_bad_offload_threshold_is_a_usage_error_naming_it() -> None:
    recorder = Recorder()
    result = _admin(recorder, "namespaces", "set-offload-threshold", "-s", "lots", "public/default")
    assert result.exit_code == 2 and "'lots'" in result.output
    assert recorder.requests == []
