"""A Spark driver for ``test_spark_register``: what ``compactor.spark.register`` does for a
user whose workers would otherwise start the wrong interpreter.

Run as ``python register_driver.py DATA_DIR TOPIC LACKING_PYTHON``, with no
``PYSPARK_PYTHON`` set and a ``python3`` on ``PATH`` that cannot import compactd's
dependencies. It prints one JSON line with three outcomes, each in a fresh local session:

* ``lacking``: ``PYSPARK_PYTHON=LACKING_PYTHON`` (an interpreter without ``crc32c``): the
  type and text of what ``register`` raises (null if it raises nothing);
* ``unregistered``: no interpreter chosen, the source registered the plain PySpark way:
  whether a read fails (the ``python3`` on ``PATH`` is what Spark would start);
* ``registered``: no interpreter chosen, ``compactor.spark.register``: the rows a read gives
  with the default options (the open ledger's confirmed entries included).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pyspark.sql import SparkSession

import compactor.spark
from compactor.spark import CompactdDataSource


def _session() -> Any:
    return (SparkSession.builder.master("local[1]").appName("compactd-register")
            .config("spark.ui.enabled", "false").getOrCreate())


def _read(spark: Any, data_dir: str, topic: str) -> int:
    return int(spark.read.format("compactd").option("dataDir", data_dir).option("topic", topic).load().count())


def main(data_dir: str, topic: str, lacking_python: str) -> None:
    outcome: dict[str, Any] = {}
    os.environ["PYSPARK_PYTHON"] = lacking_python
    spark = _session()
    try:
        compactor.spark.register(spark)
        outcome["lacking"] = None
    except Exception as error:  # noqa: BLE001 - what the user sees is the point
        outcome["lacking"] = {"type": type(error).__name__, "text": str(error)}
    finally:
        spark.stop()
    del os.environ["PYSPARK_PYTHON"]

    spark = _session()
    try:
        spark.dataSource.register(CompactdDataSource)
        try:
            _read(spark, data_dir, topic)
            outcome["unregistered"] = "read"
        except Exception:  # noqa: BLE001 - the worker's python3 lacks the dependencies
            outcome["unregistered"] = "failed"
        compactor.spark.register(spark)
        outcome["registered"] = _read(spark, data_dir, topic)
    finally:
        spark.stop()
    print(json.dumps(outcome))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
