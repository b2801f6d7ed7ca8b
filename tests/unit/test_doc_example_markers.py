"""The docs' examples are each run or skipped for a stated reason (issue 26, point 2).

Reads README.md and docs/ without running anything (the runs are
``tests/integration/docs/test_doc_examples.py``): every python or bash block has a known
marker or none, every skip names its reason, no runnable code hides in a fence the test
does not run, and the output rule of ``tests/doc_examples.py`` holds.
"""

from __future__ import annotations

from tests.doc_examples import (
    UNTESTED_LANGUAGES,
    examples,
    fences,
    output_matches,
    page_name,
    pages,
)


def test_every_example_has_a_known_marker_and_every_skip_a_reason() -> None:
    problems = [f"{block.where}: unknown marker {block.argument!r}"
                for path in pages() for block in examples(path) if block.kind == "bad"]
    problems += [f"{block.where}: a skip without a reason"
                 for path in pages() for block in examples(path) if block.kind == "skip" and not block.argument]
    assert problems == []


def test_no_runnable_code_is_fenced_under_a_name_the_test_does_not_run() -> None:
    hidden = [f"{page_name(path)}:{line}: ```{language}" for path in pages()
              for line, language, _, _ in fences(path.read_text(encoding="utf-8"))
              if language in UNTESTED_LANGUAGES]
    assert hidden == [], "use ```python or ```bash (run by the suite), or a marker"


def test_the_readme_has_one_serve_example_and_set_up_commands_that_are_not_run() -> None:
    kinds = [(block.kind, block.argument) for block in examples(pages()[0])]
    assert ("command", "serve") in kinds and ("command", "test") in kinds
    assert [kind for kind, _ in kinds].count("serve") == 1


def test_most_examples_run_rather_than_being_skipped() -> None:
    blocks = [block for path in pages() for block in examples(path)]
    skipped = [block for block in blocks if block.kind == "skip"]
    ran = [block for block in blocks if block.kind == "run"]
    assert len(ran) > 2 * len(skipped), [block.where for block in skipped]


def test_an_output_block_matches_lines_with_ellipses_and_nothing_else() -> None:
    assert output_matches('{"ledgerId": …, "status": "SUCCESS"}\n', '{"ledgerId": 12, "status": "SUCCESS"}  \n\n')
    assert not output_matches("a\nb\n", "a\n")
    assert not output_matches("SUCCESS\n", "ERROR\n")
    assert not output_matches("x…\n", "y1\n")
