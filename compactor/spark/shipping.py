"""``register(spark)``: compactd's data source on a SparkSession, and its code on the executors.

A PySpark data source runs in Python workers started by Spark (on the driver to plan a
read, on the executors to read), with the interpreter of ``spark.pyspark.python`` /
``PYSPARK_PYTHON`` — not the driver's. Those workers must import ``compactor.spark.source``
and what it imports, so ``register`` ships compactd's own packages (``ledger``,
``message``, ``cursor``, ``compactor``: the code a read needs, never ``api``) as one zip through
``SparkContext.addPyFile``: every later task and planning worker has the zip on its
``sys.path``, whether or not compactd is installed where it runs.

The zip is built once per process from the packages this driver imports, named by a hash
of its content (``compactd-<hash>.zip`` in a temporary directory), and added to a
SparkContext once; a copy also goes where PySpark's streaming source runner looks for its
includes (``_mirror_for_streaming``). Only compactd is shipped: the workers' interpreter must still have its
third-party dependencies (PyArrow, NumPy, protobuf, crc32c, cramjam, lz4: the ``spark``
extra's set).

``register`` also makes the common set-ups work as written: on a ``local`` master whose
user chose no worker interpreter (neither ``PYSPARK_PYTHON`` nor ``spark.pyspark.python``),
it points the session's Python workers at the driver's own interpreter (a ``python3`` on
``PATH`` is often one without compactd's dependencies, a venv that is not activated); and
it runs one small job that imports on a worker what a read needs (``WORKER_MODULES``), so
that a worker lacking one fails ``register`` at once with ``SparkWorkerImportError``, one
line naming the module and the fix, instead of a Java stack around a Python traceback at
the first read.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import sys
import tempfile
import threading
import zipfile
from typing import Any

from compactor.errors import SparkEngineError

__all__ = ["SHIPPED_PACKAGES", "WORKER_MODULES", "SparkWorkerImportError", "code_zip", "probe_worker", "register",
           "ship_code"]

SHIPPED_PACKAGES = ("ledger", "message", "cursor", "compactor")
STREAMING_FILES_DIR = "streaming_job"  # the job artifact id of PySpark's streaming source runner
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # a fixed timestamp: the same code gives the same zip
# What a worker imports to read a topic: the spark extra's third-party modules, then compactd's
# own modules of a read (from the shipped zip), which import the rest.
WORKER_MODULES = ("pyarrow", "numpy", "google.protobuf", "crc32c", "lz4.block", "snappy", "zstandard",
                  "compactor.spark.rows", "compactor.spark.rewrite")
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")
_lock = threading.Lock()
_built: str | None = None


def _package_files() -> list[tuple[str, str]]:
    """(path in the zip, path on disk) of every file of the shipped packages, sorted."""
    import importlib

    files = []
    for name in SHIPPED_PACKAGES:
        package = importlib.import_module(name)
        root = os.path.dirname(os.path.abspath(package.__file__ or ""))
        for directory, subdirectories, names in os.walk(root):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            for file_name in names:
                if file_name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(directory, file_name)
                files.append((os.path.join(name, os.path.relpath(path, root)), path))
    return sorted(files)


def code_zip() -> str:
    """The path of the zip of ``SHIPPED_PACKAGES`` (built on first call; see the module docstring)."""
    global _built
    with _lock:
        if _built is not None and os.path.exists(_built):
            return _built
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, path in _package_files():
                info = zipfile.ZipInfo(name, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                with open(path, "rb") as source:
                    archive.writestr(info, source.read())
        data = buffer.getvalue()
        directory = os.path.join(tempfile.gettempdir(), f"compactd-spark-{os.getuid()}")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"compactd-{hashlib.sha256(data).hexdigest()[:16]}.zip")
        if not os.path.exists(path):
            partial = f"{path}.{os.getpid()}.part"
            with open(partial, "wb") as target:
                target.write(data)
            os.replace(partial, path)  # a concurrent builder writes the same bytes
        _built = path
        return path


def ship_code(spark: Any) -> str:
    """Add compactd's zip to ``spark``'s SparkContext (once); the zip's path."""
    path = code_zip()
    context = spark.sparkContext
    name = os.path.basename(path)
    if not any(os.path.basename(added) == name for added in context.listFiles):
        context.addPyFile(path)
    _mirror_for_streaming(path)
    return path


def _mirror_for_streaming(path: str) -> None:
    """Copy the zip where PySpark 4's streaming source runner (a driver-side Python worker
    planning each micro-batch) looks for its includes: ``STREAMING_FILES_DIR`` under the
    driver's SparkFiles root, which ``addPyFile`` does not fill (seen on PySpark 4.3)."""
    from pyspark.core.files import SparkFiles

    directory = os.path.join(SparkFiles.getRootDirectory(), STREAMING_FILES_DIR)
    target = os.path.join(directory, os.path.basename(path))
    if os.path.exists(target):
        return
    os.makedirs(directory, exist_ok=True)
    partial = f"{target}.{os.getpid()}.part"
    shutil.copyfile(path, partial)
    os.replace(partial, target)


class SparkWorkerImportError(SparkEngineError):
    """A Spark Python worker cannot import a module compactd needs there; its message is
    one line naming the module, the worker's interpreter and the fix."""

    def __init__(self, module: str, python: str) -> None:
        self.module, self.python = module, python
        super().__init__(
            f"Spark's Python workers ({python}) cannot import {module!r}: install compactd's dependencies "
            f"there (pip install 'compactd[spark]'), or point spark.pyspark.python / PYSPARK_PYTHON at an "
            f"interpreter that has them")


def probe_worker(_: Any = None) -> str | None:
    """Run on a worker: the first of ``WORKER_MODULES`` it cannot import (None: all import)."""
    import importlib

    for name in WORKER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as error:
            return getattr(error, "name", None) or name
    return None


def _point_local_workers_at_driver(spark: Any) -> None:
    """On a ``local`` master with no worker interpreter chosen, use the driver's own."""
    context = spark.sparkContext
    chosen = os.environ.get("PYSPARK_PYTHON") or context.getConf().get("spark.pyspark.python")
    if not chosen and context.master.startswith("local"):
        context.pythonExec = sys.executable


def _check_workers(spark: Any) -> None:
    """Raise ``SparkWorkerImportError`` unless a worker imports every ``WORKER_MODULES``."""
    context = spark.sparkContext
    try:
        missing = context.parallelize([0], 1).map(probe_worker).collect()[0]
    except Exception as error:  # noqa: BLE001 - the worker died before answering: its Python error, in a Java one
        found = _MISSING_MODULE.search(str(error))
        if found is None:
            raise SparkEngineError(f"Spark's Python workers ({context.pythonExec}) cannot run: "
                                   f"{str(error).strip().splitlines()[0]}") from None
        missing = found.group(1)
    if missing is not None:
        raise SparkWorkerImportError(missing, context.pythonExec) from None


def register(spark: Any, *, check_workers: bool = True) -> None:
    """Ship compactd to ``spark``'s workers and register the ``compactd`` data source
    (``compactor.spark.source``) on it.

    On a ``local`` master with no worker interpreter chosen, the workers run the driver's
    interpreter. With ``check_workers`` (the default) a worker first imports what a read
    needs; ``SparkWorkerImportError`` names what it lacks (see the module docstring).
    """
    from compactor.spark.source import CompactdDataSource

    _point_local_workers_at_driver(spark)
    ship_code(spark)
    if check_workers:
        _check_workers(spark)
    spark.dataSource.register(CompactdDataSource)
