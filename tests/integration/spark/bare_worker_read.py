"""A Spark driver for ``test_spark_shipping``: reads a topic with workers that lack compactd.

Run as ``python bare_worker_read.py DATA_DIR TOPIC``, with ``PYSPARK_PYTHON`` naming an
interpreter that cannot import compactd. It first reads with the data source registered
the plain PySpark way (``spark.dataSource.register``), which must fail on the worker, then
after ``compactor.spark.register(spark)``, then streams the topic (``availableNow``), and
prints one JSON line: the first attempt's error (or null), the rows of the second (key,
key_bytes as hex, value as hex) and the number of rows the stream gave.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

import compactor.spark
from compactor.spark import CompactdDataSource


def main(data_dir: str, topic: str) -> None:
    spark = (SparkSession.builder.master("local[1]").appName("compactd-shipping")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        def read() -> list[tuple[object, ...]]:
            frame = spark.read.format("compactd").option("dataDir", data_dir).option("topic", topic).load()
            return [(row.key, None if row.key_bytes is None else bytes(row.key_bytes).hex(), bytes(row.value).hex())
                    for row in frame.orderBy("ledger_id", "entry_id", "batch_index").collect()]

        spark.dataSource.register(CompactdDataSource)
        try:
            read()
            unshipped = None
        except Exception as error:  # noqa: BLE001 - the worker's ModuleNotFoundError, as a PySpark error
            unshipped = str(error)[-2000:]
        compactor.spark.register(spark)
        rows = read()
        stream = (spark.readStream.format("compactd").option("dataDir", data_dir).option("topic", topic).load()
                  .writeStream.format("memory").queryName("streamed").trigger(availableNow=True).start())
        stream.awaitTermination(120)
        streamed = spark.table("streamed").count()
        print(json.dumps({"unshipped_error": unshipped, "rows": rows, "streamed": streamed}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
