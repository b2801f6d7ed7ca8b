"""Engine selection and the seam a phase one computed elsewhere goes through (no Spark here).

``choose_engine`` and ``raw_ranges`` are pure; ``PositionPacker.pack_many`` and
``KeyMap.from_latest`` rebuild, from a retained set, the ``PhaseOneResult`` the local phase
two takes: checked against the local phase one over generated streams. Importing compactd
loads no PySpark.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings

from compactor.engine import (
    KEY_MAP_BYTES_PER_KEY,
    LOCAL_ENTRIES_PER_S,
    SPARK_CLUSTER_CORES,
    SPARK_DRIVER_BYTES_PER_KEY,
    SPARK_ENTRIES_PER_S_PER_CORE,
    SPARK_RUN_OVERHEAD_S,
    LedgerRange,
    choose_engine,
    raw_ranges,
    spark_break_even_entries,
    spark_cores,
)
from compactor.local.algorithm import PhaseOneResult, phase_one, phase_two
from compactor.local.chunks import ChunkedMessages
from compactor.local.keymap import KeyMap, KeyMapLimitError, PositionPacker
from ledger.metadata import LedgerRecord
from ledger.position import Position
from tests.strategies import StreamEntry, entries_of, streams

BUDGET = 1000 * KEY_MAP_BYTES_PER_KEY


@pytest.mark.parametrize(("engine", "keys", "available", "driver_bytes", "chosen"), [
    ("local", 10**9, True, 0, "local"),
    ("spark", 1, False, 77, "spark"),
    ("auto", 1000, True, 0, "local"),  # exactly the budget fits one local round
    ("auto", 1001, True, 0, "spark"),  # Spark saves rounds and keeps the broker's memory flat
    ("auto", 1001, False, 0, "local"),  # without PySpark, auto stays local
    # An engine collecting every key to the driver (77 B each, as the former Spark engine
    # did) costs the broker more than the local rounds (24 B each, within the budget):
    # auto stays local, however many keys.
    ("auto", 1001, True, 77, "local"),
    ("auto", 10**9, True, 77, "local"),
    ("auto", 30000, True, 1, "local"),  # even a small cost per key can pass the budget
    ("auto", 2000, True, 1, "spark"),
])
def test_choose_engine(engine: str, keys: int, available: bool, driver_bytes: int, chosen: str) -> None:
    assert choose_engine(engine, estimated_keys=keys, memory_budget_bytes=BUDGET,  # type: ignore[arg-type]
                         spark_available=available, driver_bytes_per_key=driver_bytes) == chosen


def test_auto_picks_the_spark_engine_exactly_when_one_local_round_would_not_do() -> None:
    # The Spark engine keeps every key on the executors (issue 13): nothing per key on the broker.
    assert SPARK_DRIVER_BYTES_PER_KEY == 0
    chosen = {keys: choose_engine("auto", estimated_keys=keys, memory_budget_bytes=BUDGET, spark_available=True)
              for keys in (0, 1000, 1001, 10**6, 10**10)}
    assert chosen == {0: "local", 1000: "local", 1001: "spark", 10**6: "spark", 10**10: "spark"}


def _record(ledger_id: int, entries: int) -> LedgerRecord:
    return LedgerRecord(ledger_id, "t", "data", entries, 0, 0, 1)


def test_raw_ranges_cover_exactly_the_entries_after_the_horizon_up_to_the_stop() -> None:
    ledgers = [_record(3, 5), _record(4, 0), _record(7, 4), _record(9, 6)]
    assert raw_ranges(ledgers, Position(3, 2), Position(9, 1)) == [
        LedgerRange(3, 3, 4), LedgerRange(7, 0, 3), LedgerRange(9, 0, 1)]
    assert raw_ranges(ledgers, Position(3, -1), Position(3, 4)) == [LedgerRange(3, 0, 4)]
    assert raw_ranges(ledgers, Position(3, 4), Position(7, 3)) == [LedgerRange(7, 0, 3)]
    assert raw_ranges(ledgers, Position(9, 5), Position(9, 5)) == []


def _rebuilt(result: PhaseOneResult) -> PhaseOneResult:
    """``result`` as the Spark engine hands it over: hashes and positions only, and the
    chunked messages' completions."""
    result.key_map.merge()
    positions = [result.packer.unpack(int(p)) for p in result.key_map._packed]
    packer = PositionPacker()
    packed = packer.pack_many(
        np.array([p.ledger_id for p in positions], dtype=np.uint64),
        np.array([p.entry_id for p in positions], dtype=np.uint64),
        np.array([p.batch_index for p in positions], dtype=np.int64),
    )
    key_map = KeyMap.from_latest(result.key_map._high.copy(), result.key_map._low.copy(), packed)
    chunks = ChunkedMessages.from_ends(reversed(list(result.chunks.completions())))  # in any order
    assert chunks == result.chunks
    return PhaseOneResult(key_map=key_map, packer=packer, chunks=chunks)


@settings(max_examples=100)
@given(stream=streams())
def test_a_rebuilt_retained_set_gives_phase_two_the_same_survivors(stream: list[StreamEntry]) -> None:
    entries = entries_of(stream)
    result = phase_one(entries)
    expected = list(phase_two(entries, result))
    assert list(phase_two(entries, _rebuilt(result))) == expected


def test_pack_many_packs_as_pack_does_and_refuses_what_does_not_fit() -> None:
    positions = [Position(9, 3, -1), Position(2, 0, 4), Position(9, 1, 0)]
    reference = PositionPacker()
    expected = [reference.pack(p) for p in sorted(positions)]
    packer = PositionPacker()
    packed = packer.pack_many(np.array([9, 2, 9], dtype=np.uint64), np.array([3, 0, 1], dtype=np.uint64),
                              np.array([-1, 4, 0], dtype=np.int64))
    assert sorted(packed.tolist()) == expected
    assert [packer.unpack(int(p)) for p in packed] == positions
    with pytest.raises(KeyMapLimitError):
        PositionPacker().pack_many(np.array([1], dtype=np.uint64), np.array([1 << 30], dtype=np.uint64),
                                   np.array([0], dtype=np.int64))
    with pytest.raises(KeyMapLimitError):
        PositionPacker().pack_many(np.array([1], dtype=np.uint64), np.array([0], dtype=np.uint64),
                                   np.array([1 << 14], dtype=np.int64))


def test_importing_compactd_loads_no_pyspark() -> None:
    code = ("import sys, compactor, compactor.spark, compactor.engine, compactor.runs.runner, "
            "api.broker.service, api.offline, api.cli\n"
            "assert 'pyspark' not in sys.modules, 'pyspark was imported'\n"
            "assert 'pyarrow' not in sys.modules, 'pyarrow was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_spark_partitions_cut_ranges_so_that_every_core_gets_work() -> None:
    from compactor.spark.engine import (
        PARTITION_ENTRIES_MAX,
        PARTITION_ENTRIES_MIN,
        piece_entries,
        split_ranges,
    )

    one_ledger = (LedgerRange(4, 0, 4999),)
    assert piece_entries(one_ledger, cores=2) == 1250  # 4 partitions for 2 cores
    assert piece_entries((LedgerRange(4, 0, 99),), cores=8) == PARTITION_ENTRIES_MIN
    assert piece_entries((LedgerRange(4, 0, 10**6),), cores=2) == PARTITION_ENTRIES_MAX
    ranges = (LedgerRange(1, 0, 9, compacted=True), LedgerRange(4, 3, 12))
    assert split_ranges(ranges, 4) == [
        LedgerRange(1, 0, 3, True), LedgerRange(1, 4, 7, True), LedgerRange(1, 8, 9, True),
        LedgerRange(4, 3, 6), LedgerRange(4, 7, 10), LedgerRange(4, 11, 12)]


def test_spark_cores_of_a_master_url() -> None:
    assert [spark_cores(master) for master in ("local", "local[1]", "local[4]", "local[16,3]", " local[2] ")] == \
        [1, 1, 4, 16, 2]
    assert spark_cores("local[*]") == (os.cpu_count() or 1)
    assert spark_cores("spark://host:7077") == SPARK_CLUSTER_CORES


def test_auto_goes_to_spark_where_the_cluster_is_measured_faster_and_stays_local_below() -> None:
    roomy = 10**15  # one local round always does: only speed decides
    for master in ("local[1]", "local[2]", "local[4]", "local[16]", "spark://host:7077"):
        cores = spark_cores(master)
        threshold = spark_break_even_entries(cores)

        def chosen(entries: int, master: str = master) -> str:
            return choose_engine("auto", estimated_keys=entries, memory_budget_bytes=roomy, spark_available=True,
                                 spark_master=master)

        if cores * SPARK_ENTRIES_PER_S_PER_CORE <= LOCAL_ENTRIES_PER_S:  # slower however large: never
            assert threshold == math.inf and chosen(10**12) == "local", master
            continue
        # the rule is where the predicted times cross
        at = math.ceil(threshold)
        local_s = at / LOCAL_ENTRIES_PER_S
        spark_s = SPARK_RUN_OVERHEAD_S + at / (cores * SPARK_ENTRIES_PER_S_PER_CORE)
        assert spark_s <= local_s * 1.0001, master
        assert chosen(at) == "spark" and chosen(at - 1 if at > 1 else 0) == "local", master
        assert chosen(10) == "local", master
        assert choose_engine("auto", estimated_keys=at, memory_budget_bytes=roomy, spark_available=False,
                             spark_master=master) == "local"
    # with the measured figures, one core of Spark is slower than the local engine
    assert spark_break_even_entries(1) == math.inf
