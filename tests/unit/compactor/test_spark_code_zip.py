"""The zip ``compactor.spark.register`` ships to Spark's Python workers (issue 13, point 6).

It holds compactd's packages that a read needs (``ledger``, ``cursor``, ``compactor``)
and nothing else of compactd, is the same file for the same code, and an interpreter
that has it first on its path imports compactd's reader from it. (That Spark's workers
get it, and read with it where compactd is not installed, is
``tests/integration/spark/test_spark_shipping.py``.)
"""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from compactor.spark import shipping
from compactor.spark.shipping import code_zip


def test_the_code_zip_holds_the_reader_packages_only_and_is_stable(monkeypatch: pytest.MonkeyPatch) -> None:
    path = code_zip()
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    assert {name.split("/")[0] for name in names} == {"ledger", "message", "cursor", "compactor"}
    assert {"compactor/spark/rows.py", "message/proto/pulsar_api_pb2.py", "ledger/storage/file.py",
            "cursor/store.py"} <= set(names)
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    monkeypatch.setattr(shipping, "_built", None)  # built again: the same bytes, the same name
    assert code_zip() == path


def test_an_interpreter_imports_the_reader_from_the_zip() -> None:
    path = code_zip()
    script = (f"import sys; sys.path.insert(0, {path!r}); import compactor.spark.rows as rows; "
              "print(rows.__file__)")
    result = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.decode().strip() == f"{path}/compactor/spark/rows.py"
