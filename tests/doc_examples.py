"""The documentation's examples, read and run (``docs/examples.md`` is the user-facing rule).

Every fenced ``python`` or ``bash`` block of ``README.md`` and ``docs/**/*.md`` is an
example. The HTML comment on the line before a block says what the test does with it:

* none: run it. Python blocks run in one namespace per page (so a page's later blocks use
  its earlier ones' ``client``, ``producer``); bash blocks run with ``bash -euo pipefail``.
  Both run in a working directory that stands in for the repository root: ``.venv`` there
  is the test's virtual environment (the examples call ``.venv/bin/python`` and
  ``.venv/bin/compactd`` by path), ``./data`` is the running broker's data dir, and the
  venv's ``bin`` is *not* on ``PATH`` (nothing relies on an activated venv);
* ``<!-- example: serve -->``: the command that starts the broker; the test's own
  ``compactd serve`` (free ports, ``./data``) stands in for it, and the block must be
  ``.venv/bin/compactd serve --data-dir ./data``;
* ``<!-- example: file NAME -->``: the block is written to ``NAME`` in the working
  directory (a later block runs it);
* ``<!-- example: skip (REASON) -->``: not run, for the reason given (which must be there);
* ``<!-- command: serve -->`` / ``<!-- command: test -->``: the README's set-up commands
  (``.ci/run`` runs the test command on a fresh machine; ``tests/unit/test_ci_wiring.py``
  checks both), not run here.

Addresses: the examples use the defaults ``127.0.0.1:6650`` (Pulsar) and ``127.0.0.1:8080``
(admin REST); the test rewrites them to its broker's ports, and bash blocks get
``COMPACTD_ADMIN_URL`` (the admin CLI's default URL) pointing at it.

Output: a fenced ``output`` block right after an example is what the example prints
(stdout), checked line by line after trailing blanks are stripped and the broker's
addresses are written back as the defaults; ``…`` in it stands for any text on its line.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = ("python", "bash")  # what is run; any other fence is not an example
# Fence names of code that could run but would escape the test: the docs use these never.
UNTESTED_LANGUAGES = ("sh", "shell", "console", "py", "python3", "pycon", "zsh")
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*(example|command):\s*(.*?)\s*-->\s*$")
SKIP = re.compile(r"skip \((.+)\)")
FILE = re.compile(r"file ([A-Za-z0-9_.-]+)")
BROKER_DEFAULT, HTTP_DEFAULT = "127.0.0.1:6650", "127.0.0.1:8080"
SERVE_COMMAND = ".venv/bin/compactd serve --data-dir ./data"
BLOCK_TIMEOUT_S = 240.0  # one bash block (a Spark job on a busy 2-core machine is the longest)


@dataclass(frozen=True)
class Example:
    """One fenced block of a page: where it is, its language and code, the marker before
    it (``"run"``, ``"serve"``, ``"file"``, ``"skip"``, ``"command"``; ``"bad"`` for a
    marker this module does not know), the marker's argument, and the ``output`` block
    that follows it, if any."""

    page: str
    line: int
    language: str
    code: str
    kind: str
    argument: str
    output: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md, then every page under docs/, in path order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fences(text: str) -> list[tuple[int, str, str, int]]:
    """(line of the opening fence, language, code, line after the closing fence)."""
    found = []
    for match in FENCE.finditer(text):
        start = text.count("\n", 0, match.start()) + 1
        end = text.count("\n", 0, match.end()) + 2
        found.append((start, match.group(1), match.group(2), end))
    return found


def examples(path: Path) -> list[Example]:
    """The page's python and bash blocks, with their markers and shown outputs."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    blocks = fences(text)
    found = []
    for index, (start, language, code, end) in enumerate(blocks):
        if language not in LANGUAGES:
            continue
        kind, argument = "run", ""
        previous = lines[start - 2] if start >= 2 else ""
        marker = MARKER.search(previous)
        if marker is not None:
            kind, argument = _kind(marker.group(1), marker.group(2))
        output = None
        if index + 1 < len(blocks):
            next_start, next_language, next_code, _ = blocks[index + 1]
            between = lines[end - 1:next_start - 1]
            if next_language == "output" and all(not line.strip() for line in between):
                output = next_code
        found.append(Example(page_name(path), start, language, code, kind, argument, output))
    return found


def _kind(family: str, text: str) -> tuple[str, str]:
    if family == "command":
        return ("command", text) if text in ("serve", "test") else ("bad", text)
    if text == "serve":
        return "serve", ""
    if (skip := SKIP.fullmatch(text)) is not None:
        return "skip", skip.group(1).strip()
    if (file := FILE.fullmatch(text)) is not None:
        return "file", file.group(1)
    return "bad", text


def output_matches(expected: str, actual: str) -> bool:
    """``actual`` (stdout) shows ``expected`` (an output block): the same lines, trailing
    blanks and blank end lines aside, ``…`` matching any text within a line."""
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().split("\n")]
    want, got = lines(expected), lines(actual)
    if len(want) != len(got):
        return False
    return all(re.fullmatch(".*?".join(re.escape(part) for part in pattern.split("…")), line)
               for pattern, line in zip(want, got, strict=True))


def working_directory(directory: Path) -> Path:
    """``directory`` set up as the examples' repository root: ``.venv`` is this test's
    virtual environment."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    assert (directory / ".venv" / "bin" / "compactd").exists(), "the compactd console script is not installed"
    return directory


def bash_environment(http_url: str, path_prefix: str = "") -> dict[str, str]:
    """The environment of bash examples: the venv not activated (its ``bin`` off ``PATH``),
    the admin CLI's default URL the test broker's."""
    venv_bin = os.path.join(sys.prefix, "bin")
    path = [entry for entry in os.environ.get("PATH", "").split(os.pathsep)
            if entry and os.path.realpath(entry) != os.path.realpath(venv_bin)]
    if path_prefix:
        path.insert(0, path_prefix)
    env = {key: value for key, value in os.environ.items()
           if key not in {"VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "COMPACTD_CONFIG"}}
    env.update(PATH=os.pathsep.join(path), COMPACTD_ADMIN_URL=http_url)
    return env


class PageRunner:
    """Runs a page's examples in order against one broker (see the module docstring)."""

    def __init__(self, workdir: Path, broker_url: str, http_url: str, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.broker = broker_url.split("://", 1)[1]
        self.http = http_url.split("://", 1)[1]
        self.env = env

    def rewrite(self, code: str) -> str:
        return code.replace(BROKER_DEFAULT, self.broker).replace(HTTP_DEFAULT, self.http)

    def unwrite(self, text: str) -> str:
        return text.replace(self.broker, BROKER_DEFAULT).replace(self.http, HTTP_DEFAULT)

    def run_page(self, blocks: list[Example]) -> list[str]:
        """Run ``blocks`` (one page's) in order; the problems found, each naming its block
        (the page stops at its first failing block: later ones depend on it)."""
        namespace: dict[str, Any] = {"__name__": "__doc_example__"}
        problems: list[str] = []
        try:
            for block in blocks:
                problem = self.run(block, namespace)
                if problem is not None:
                    problems.append(problem)
                    break
        finally:
            client = namespace.get("client")
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
        return problems

    def run(self, block: Example, namespace: dict[str, Any]) -> str | None:
        if block.kind in ("skip", "command"):
            return None
        if block.kind == "bad":
            return f"{block.where}: unknown example marker {block.argument!r}"
        if block.kind == "serve":
            command = " ".join(block.code.split())
            return None if command == SERVE_COMMAND else f"{block.where}: a serve block must be `{SERVE_COMMAND}`"
        code = self.rewrite(block.code)
        if block.kind == "file":
            (self.workdir / block.argument).write_text(code, encoding="utf-8")
            return None
        if block.language == "python":
            stdout = io.StringIO()
            try:
                with contextlib.redirect_stdout(stdout), contextlib.chdir(self.workdir):
                    exec(compile(code, block.where, "exec"), namespace)  # noqa: S102 - our own docs
            except Exception as error:  # noqa: BLE001 - reported with the block
                return f"{block.where}: the example raised {type(error).__name__}: {error}\n{code}"
            printed = stdout.getvalue()
        else:
            result = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=self.env, cwd=self.workdir,
                                    stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=BLOCK_TIMEOUT_S, check=False)
            if result.returncode != 0:
                return (f"{block.where}: exit {result.returncode}\n{code}\nstdout: {result.stdout}\n"
                        f"stderr: {result.stderr[-4000:]}")
            printed = result.stdout
        if block.output is not None and not output_matches(block.output, self.unwrite(printed)):
            return f"{block.where}: printed\n{self.unwrite(printed)}\nthe docs show\n{block.output}"
        return None
