"""README and CI agree: .ci/run runs exactly the README's test command."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_extracts_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    marker = readme.index("<!-- command: test -->")
    block = readme[marker:].split("```bash\n", 1)[1].split("\n", 1)[0]
    extracted = subprocess.run(
        ["awk", '/<!-- command: test -->/{found=1; next} found && /^```bash/{getline; print; exit}',
         str(ROOT / "README.md")], capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert extracted == block
    assert "pytest" in block
    assert "awk '/<!-- command: test -->/" in (ROOT / ".ci" / "run").read_text()
    serve = readme[readme.index("<!-- command: serve -->"):].split("```bash\n", 1)[1].split("\n", 1)[0]
    assert "compactd serve" in serve
    assert readme.index("<!-- command: serve -->") < marker  # the two set-up commands come first
