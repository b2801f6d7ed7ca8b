"""The Spark page's example runs as a user runs it (issue 26, point 2): a venv that is not
activated, ``.venv/bin/python query.py`` by path, and a ``python3`` on ``PATH`` that lacks
compactd's dependencies (``bare_interpreter``), against a real ``compactd serve`` whose
data dir the query reads. Its shown output is checked (``tests/doc_examples.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pulsar")

from tests.doc_examples import ROOT, PageRunner, bash_environment, examples, working_directory
from tests.integration.spark.support import bare_interpreter
from tests.serve_process import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PAGE = ROOT / "docs" / "guide" / "spark.md"


def test_the_spark_page_runs_with_a_python3_on_path_that_lacks_compactds_dependencies(tmp_path: Path) -> None:
    blocks = examples(PAGE)
    assert any(block.kind == "file" for block in blocks) and any(block.output for block in blocks)
    path_dir = tmp_path / "bin"
    path_dir.mkdir()
    (path_dir / "python3").symlink_to(bare_interpreter(tmp_path / "plain", hidden={"pyarrow", "numpy", "crc32c"}))
    workdir = working_directory(tmp_path / "root")
    serve = ServeProcess(workdir / "data", tmp_path / "serve.log")
    env = bash_environment(serve.http_url, path_prefix=str(path_dir))
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    try:
        problems = PageRunner(workdir, serve.broker_url, serve.http_url, env).run_page(blocks)
    finally:
        assert serve.terminate() == 0
    assert problems == [], "\n\n".join(problems)
