"""``register(spark)``: compactd's data sources on a SparkSession, and its code on the executors.

A PySpark data source runs in Python workers started by Spark (on the driver to plan a
read, on the executors to read), with the interpreter of ``spark.pyspark.python`` /
``PYSPARK_PYTHON`` — not the driver's. Those workers must import ``compactor.spark.source``
and what it imports, so ``register`` ships compactd's own packages (``ledger``,
``cursor``, ``compactor``: the code a read needs, never ``api``) as one zip through
``SparkContext.addPyFile``: every later task and planning worker has the zip on its
``sys.path``, whether or not compactd is installed where it runs.

The zip is built once per process from the packages this driver imports, named by a hash
of its content (``compactd-<hash>.zip`` in a temporary directory), and added to a
SparkContext once; a copy also goes where PySpark's streaming source runner looks for its
includes (``_mirror_for_streaming``). Only compactd is shipped: the workers' interpreter must still have its
third-party dependencies (PyArrow, NumPy, protobuf, crc32c, cramjam, lz4: the ``spark``
extra's set).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import threading
import zipfile
from typing import Any

__all__ = ["SHIPPED_PACKAGES", "code_zip", "register", "ship_code"]

SHIPPED_PACKAGES = ("ledger", "cursor", "compactor")
STREAMING_FILES_DIR = "streaming_job"  # the job artifact id of PySpark's streaming source runner
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # a fixed timestamp: the same code gives the same zip
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


def register(spark: Any) -> None:
    """Ship compactd to ``spark``'s workers and register the ``compactd`` and
    ``compactd-phase-one`` data sources (``compactor.spark.source``) on it."""
    from compactor.spark.source import CompactdDataSource, PhaseOneDataSource

    ship_code(spark)
    spark.dataSource.register(CompactdDataSource)
    spark.dataSource.register(PhaseOneDataSource)
