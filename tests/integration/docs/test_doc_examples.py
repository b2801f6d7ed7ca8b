"""Every example of README.md and docs/ runs against a real ``compactd serve`` (issue 26,
point 2), and shows what it prints.

``tests/doc_examples.py`` reads the examples and their markers (the rule is written for
users in ``docs/examples.md``). One broker serves every page, in order (README.md first,
then docs/ in path order), from a working directory that stands in for the repository
root; ``docs/guide/spark.md`` has a test of its own (``tests/integration/spark/
test_doc_spark_example.py``), which runs it with a ``python3`` on PATH that lacks
compactd's dependencies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_examples import (
    PageRunner,
    bash_environment,
    examples,
    page_name,
    pages,
    working_directory,
)
from tests.serve_process import ServeProcess

pytest.importorskip("pulsar")

pytestmark = [pytest.mark.slow, pytest.mark.integration]

OWN_TEST = {"docs/guide/spark.md"}  # run by tests/integration/spark/test_doc_spark_example.py


def test_the_readme_tour_has_each_step_of_the_issue() -> None:
    blocks = [block for block in examples(pages()[0])]
    assert [block.kind for block in blocks].count("serve") == 1
    code = "\n".join(block.code for block in blocks if block.kind == "run")
    for step in ("partition_key=", "send(None", ".venv/bin/compactd admin topics compact", "curl", "-X PUT",
                 "is_read_compacted=True", "create_table_view"):
        assert step in code, f"the tour lost the step {step!r}"


def test_every_example_runs_against_one_server(tmp_path: Path) -> None:
    workdir = working_directory(tmp_path / "root")
    serve = ServeProcess(workdir / "data", tmp_path / "serve.log")
    runner = PageRunner(workdir, serve.broker_url, serve.http_url, bash_environment(serve.http_url))
    problems: list[str] = []
    ran = 0
    try:
        for path in pages():
            if page_name(path) in OWN_TEST:
                continue
            blocks = examples(path)
            ran += sum(block.kind == "run" for block in blocks)
            problems += runner.run_page(blocks)
    finally:
        assert serve.terminate() == 0
    assert problems == [], "\n\n".join(problems)
    assert ran >= 10, f"only {ran} examples ran: the examples went missing"
