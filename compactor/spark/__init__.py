"""compactd on Apache Spark: the ``compactd`` PySpark data source and the Spark engine.

* ``register(spark)`` (``compactor.spark.shipping``): ships compactd's code to the
  session's Python workers and registers its data sources; then
  ``spark.read.format("compactd")`` works where compactd is not installed.
* ``CompactdDataSource`` (``compactor.spark.source``): a topic, or its compacted view, as
  a DataFrame (``spark.read.format("compactd")``).
* ``SparkEngine`` (``compactor.spark.engine``): the whole compaction pipeline on Spark
  (both phases on the executors; the driver plans and commits), the ``spark`` engine of
  ``compactor.runs.runner.Compactor``.

This package is the only one that imports PySpark, and it does so lazily: importing
``compactor.spark`` loads nothing; the names above load their module (and PySpark) on
first access, so a compactd without the ``spark`` extra still imports everything.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compactor.spark.engine import SparkEngine
    from compactor.spark.shipping import register
    from compactor.spark.source import CompactdDataSource

__all__ = ["CompactdDataSource", "SparkEngine", "register"]

_MODULES = {
    "CompactdDataSource": "compactor.spark.source",
    "SparkEngine": "compactor.spark.engine",
    "register": "compactor.spark.shipping",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'compactor.spark' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
