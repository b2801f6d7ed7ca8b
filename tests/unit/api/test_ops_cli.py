"""Issue 16, point 6, the parts without a broker: ``serve --help`` at 80 columns, the
admin options after the sub-command, message ids, ``--advertised-address`` settings and
URLs, the ready line, and the rate counters of stats (with a fake clock)."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.admin_cli import hoist_admin_options
from api.admin_cli_topics import parse_message_id, subscription_path
from api.broker.advertised import broker_service_url, web_service_url
from api.broker.topic_stats import RATE_WINDOW_S, RateCounter, ThreadSafeRateCounter
from api.config import ConfigError, Settings, flag_name, load_settings, setting_specs
from api.server import ready_line

COLUMNS = 80


def test_serve_help_fits_80_columns_with_every_flag_and_help_text_whole() -> None:
    executable = Path(sys.executable).with_name("compactd")
    if not executable.exists():
        pytest.skip("the compactd console script is not installed")
    env = {**os.environ, "COLUMNS": str(COLUMNS), "TERM": "dumb"}
    result = subprocess.run([str(executable), "serve", "--help"], capture_output=True, text=True,
                            timeout=60, check=False, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= COLUMNS for line in lines), [line for line in lines if len(line) > COLUMNS]
    assert "…" not in result.stdout  # nothing cut short
    flat = " ".join(result.stdout.split())
    for spec in setting_specs():
        assert re.search(rf"(^|\s){re.escape(flag_name(spec.key))}(\s|$)", result.stdout), spec.key
        # wrapped only between words: the help text reads whole once line breaks are spaces
        assert " ".join(spec.help.split()) in flat, spec.key


@pytest.mark.parametrize(("args", "hoisted"), [
    (["topics", "stats", "t", "--admin-url", "http://h:1"], ["--admin-url", "http://h:1", "topics", "stats", "t"]),
    (["topics", "--auth-token=x", "list", "p/d"], ["--auth-token=x", "topics", "list", "p/d"]),
    (["--admin-url", "u", "topics", "unload", "t"], ["--admin-url", "u", "topics", "unload", "t"]),
    (["topics", "peek-messages", "t", "--", "--admin-url", "v"],
     ["topics", "peek-messages", "t", "--", "--admin-url", "v"]),
    (["topics", "stats", "--admin-url"], ["topics", "stats", "--admin-url"]),  # no value: click says so
])
def test_admin_options_after_the_sub_command_move_in_front(args: list[str], hoisted: list[str]) -> None:
    assert hoist_admin_options(args) == hoisted


def test_message_ids_and_subscription_paths_parse_or_name_the_bad_value() -> None:
    assert parse_message_id("12:3") == (12, 3)
    assert parse_message_id(" 12:3:-1:4 ") == (12, 3)
    for bad in ("12", "a:b", "12:3x", ""):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            parse_message_id(bad)
    assert subscription_path("/admin/v2/persistent/p/d/t", "a b/c") == \
        "/admin/v2/persistent/p/d/t/subscription/a%20b%2Fc"
    with pytest.raises(ValueError, match="empty"):
        subscription_path("/admin/v2/persistent/p/d/t", "")


def test_the_advertised_address_replaces_the_host_of_lookup_urls_only() -> None:
    assert broker_service_url(Settings(), "10.0.0.5", 6650) == "pulsar://10.0.0.5:6650"
    advertised = Settings(advertised_address="broker.example.com")
    assert broker_service_url(advertised, "10.0.0.5", 16650) == "pulsar://broker.example.com:16650"
    assert web_service_url(advertised, "10.0.0.5", 8080) == "http://broker.example.com:8080"
    assert broker_service_url(Settings(advertised_address="fd00::1"), "::1", 1) == "pulsar://[fd00::1]:1"
    assert ready_line("0.0.0.0", 1, 2, advertised="b.example.com") == \
        "compactd ready broker=pulsar://0.0.0.0:1 http=http://0.0.0.0:2 advertised=pulsar://b.example.com:1"
    assert ready_line("127.0.0.1", 1, 2) == "compactd ready broker=pulsar://127.0.0.1:1 http=http://127.0.0.1:2"


@pytest.mark.parametrize("bad", ["pulsar://host", "host:6650", "a b", "host/x", "user@host", " "])
def test_a_malformed_advertised_address_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ConfigError, match="COMPACTD_ADVERTISED_ADDRESS") as raised:
        load_settings({}, {"COMPACTD_ADVERTISED_ADDRESS": bad}, None)
    assert repr(bad) in str(raised.value)
    assert load_settings({"advertised_address": "fd00::1"}, {}, None).advertised_address == "fd00::1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_average_the_last_window_and_forget_what_is_older() -> None:
    clock = FakeClock()
    counter = RateCounter(clock)
    assert counter.rates() == (0.0, 0.0)
    counter.record(5, 500)
    assert counter.rates() == (5.0, 500.0)  # younger than a second: divided by one second
    clock.now += RATE_WINDOW_S * 3
    counter.record(30, 300)
    assert counter.rates() == (30 / RATE_WINDOW_S, 300 / RATE_WINDOW_S)  # the first burst left the window
    clock.now += RATE_WINDOW_S
    assert counter.rates() == (0.0, 0.0)
    assert (counter.messages, counter.bytes, counter.average_size()) == (35, 800, 800 / 35)


@given(st.lists(st.tuples(st.floats(0, 3 * RATE_WINDOW_S), st.integers(0, 100), st.integers(0, 10_000)),
                max_size=50))
def test_a_rate_is_what_the_window_holds_over_its_span(events: list[tuple[float, int, int]]) -> None:
    clock = FakeClock()
    counter = RateCounter(clock)
    start = clock.now
    for delay, messages, size in sorted(events):
        clock.now = start + delay
        counter.record(messages, size)
    now = clock.now
    first_second = int(now) - RATE_WINDOW_S + 1
    in_window = [(m, s) for delay, m, s in events if int(start + delay) >= first_second]
    span = min(float(RATE_WINDOW_S), max(1.0, now - start))
    rate, throughput = counter.rates()
    assert rate == pytest.approx(sum(m for m, _ in in_window) / span)
    assert throughput == pytest.approx(sum(s for _, s in in_window) / span)
    assert counter.messages == sum(m for _, m, _ in events)


ROOT = Path(__file__).resolve().parents[3]


class _SystemdUnit(configparser.ConfigParser):
    """An INI reader keeping keys as written (systemd's are case-sensitive)."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def test_the_systemd_unit_raises_the_descriptor_limit() -> None:
    unit = _SystemdUnit(strict=False, interpolation=None)
    unit.read(ROOT / "deploy" / "compactd.service")
    limit = unit["Service"]["LimitNOFILE"]
    assert limit.isdigit() and int(limit) >= 65536, limit  # connections + ledger files + SQLite


def test_the_docs_warn_about_the_table_view_stack_overflow() -> None:
    text = " ".join((ROOT / "docs" / "guide" / "clients.md").read_text().split())
    assert "TableView overflows the stack on topics of about 100 k keys" in text
    assert "ulimit -s" in text


def test_the_thread_safe_counter_loses_no_count_recorded_from_several_threads() -> None:
    counter = ThreadSafeRateCounter()
    threads = [threading.Thread(target=lambda: [counter.record(1, 3) for _ in range(2000)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        counter.rates()  # read while they write
    for thread in threads:
        thread.join()
    assert (counter.messages, counter.bytes) == (8000, 24000)
    assert counter.rates()[0] > 0
