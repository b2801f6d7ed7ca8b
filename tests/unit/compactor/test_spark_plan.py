"""The Spark engine's driver side, without Spark (``compactor.spark.engine``): the plan cuts
the pieces into contiguous groups that keep every core busy and stay within the group size,
and the commit takes every group's report exactly once, at its reserved ledger."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")

from compactor.engine import LedgerRange
from compactor.errors import SparkEngineError
from compactor.record import RoundFigures
from compactor.spark.engine import _spark_hash_int, commit_reports, partition_keys, plan_groups
from compactor.spark.rewrite import REPORT_SCHEMA_DDL, GroupReport, GroupSpec


@settings(max_examples=200)
@given(sizes=st.lists(st.integers(1, 50), max_size=40), cores=st.integers(1, 16), group_entries=st.integers(1, 200))
def test_groups_are_contiguous_non_empty_and_as_many_as_cores_or_the_size_needs(
    sizes: list[int], cores: int, group_entries: int,
) -> None:
    pieces, first = [], 0
    for size in sizes:
        pieces.append(LedgerRange(3, first, first + size - 1))
        first += size
    groups = plan_groups(pieces, cores, group_entries)
    assert [piece for group in groups for piece in group] == pieces  # contiguous, in order, all
    assert all(groups) or not pieces
    wanted = max(cores, -(-sum(sizes) // group_entries))
    assert len(groups) == min(len(pieces), wanted)


def test_groups_have_about_equal_entries() -> None:
    pieces = [LedgerRange(1, index * 10, index * 10 + 9) for index in range(12)]
    assert [len(group) for group in plan_groups(pieces, 4)] == [3, 3, 3, 3]
    assert [len(group) for group in plan_groups(pieces, 1, group_entries=40)] == [4, 4, 4]


def test_partition_keys_are_spark_hashes_of_every_partition() -> None:
    # Spark's hash(1), hash(42) as an int column (Murmur3_x86_32, seed 42), as Spark gives them.
    assert (_spark_hash_int(1), _spark_hash_int(42)) == (-559580957, 29417773)
    for groups in (1, 3, 100):
        assert sorted(_spark_hash_int(key) % groups for key in partition_keys(groups)) == list(range(groups))


def _specs(count: int) -> list[GroupSpec]:
    return [GroupSpec(index, (LedgerRange(1, index, index),), 50 + index) for index in range(count)]


def _report(group: int, entries: int, ledger_id: int | None = None) -> GroupReport:
    return GroupReport(group, RoundFigures(50 + group if ledger_id is None else ledger_id, entries, 10 * entries,
                                           entries, entries, 4, 5, 40, 0, 0))


def test_the_commit_lists_the_groups_that_kept_something_in_stream_order() -> None:
    result, unused = commit_reports(_specs(4), [_report(2, 3), _report(0, 1), _report(3, 0), _report(1, 0)])
    assert result.ledger_ids == (50, 52)
    assert unused == [51, 53]
    assert (result.entries_written, result.bytes_written, result.entries_read, result.groups) == (4, 40, 16, 4)


def test_when_every_group_is_empty_one_empty_ledger_is_published() -> None:
    result, unused = commit_reports(_specs(3), [_report(1, 0), _report(0, 0), _report(2, 0)])
    assert result.ledger_ids == (50,)
    assert unused == [51, 52]


@pytest.mark.parametrize(("reports", "message"), [
    ([_report(0, 1)], r"groups \[1\] did not report"),
    ([_report(0, 1), _report(1, 1), _report(1, 1)], "group 1 reported twice"),
    ([_report(0, 1), _report(1, 1, ledger_id=99)], "for no planned group"),
    ([_report(0, 1), _report(1, 1), _report(2, 1)], "for no planned group"),
])
def test_the_commit_refuses_unless_every_group_reported_exactly_once(reports: list[GroupReport], message: str) -> None:
    with pytest.raises(SparkEngineError, match=message) as caught:
        commit_reports(_specs(2), reports)
    assert caught.value.retriable


def test_a_group_report_travels_as_one_report_schema_row_and_back() -> None:
    report = GroupReport(3, RoundFigures(53, 2, 20, 5, 4, 9, 11, 400, 1, 2))
    row = report.row()
    assert len(row) == len(REPORT_SCHEMA_DDL.split(", "))
    assert row[:2] == (3, 53)
    assert GroupReport.from_row(row) == report
