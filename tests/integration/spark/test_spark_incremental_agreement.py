"""The Spark engine over views that incremental runs made agrees with compacting the whole
history at once (issue 30, point 4), on Spark ``local[1]``.

A few fixed histories (``tests.unit.compactor.history``, drawn by a derandomized
Hypothesis: the same ones every time) whose compactions alternate between the local
engine's incremental runs, which leave views of several ledgers with dead marks, and the
Spark engine's runs over those views (which merge the marked ledgers, then rewrite): after
every run, the logical view a read-compacted reader gets (message ids included, the
horizon, ``get_last_message_id``, readers sought to its entries) equals that of one
``rewrite=True`` run over the whole history on a fresh copy of the data dir, before and
after a restart, with no ledger left over.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest

pytest.importorskip("pyspark")

from hypothesis import HealthCheck, Phase, given, note, settings

from compactor.runs.runner import Compactor
from compactor.spark import SparkEngine
from tests.unit.compactor.history import Clock, Compact, Policy, Step, config, histories, open_dir
from tests.unit.compactor.test_incremental_agreement import run_history

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FIXED = settings(max_examples=3, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def engine() -> Iterator[SparkEngine]:
    spark_engine = SparkEngine("local[1]", piece_entries=3, group_entries=6)
    spark_engine.session()
    yield spark_engine
    spark_engine.stop()


@FIXED
@given(histories(rounds_min=3, rounds_max=4))
def test_spark_runs_over_incremental_views_agree_with_compacting_the_whole_history_at_once(
    engine: SparkEngine, history: tuple[Policy, list[Step]],
) -> None:
    note(f"history: {history!r}")  # Hypothesis prints the argument blank
    policy, steps = history
    clock = Clock()
    spark_runs = []

    def compactor_of(number: int, step: Compact) -> Compactor:
        spark = number % 2 == 1  # local, spark, local, spark...
        spark_runs.append(spark)
        overrides = {"engine": "spark", "spark_master": "local[1]"} if spark else {"engine": "local"}
        return Compactor(config(policy, merge=step.merge, **overrides), clock=clock, spark_engine=engine)

    with TemporaryDirectory() as directory:
        root = Path(directory)
        opened = open_dir(root / "topic", clock)
        try:
            opened, _ = run_history(opened, clock, policy, steps, root, compactor_of=compactor_of)
        finally:
            opened.close()
    assert any(spark_runs)
