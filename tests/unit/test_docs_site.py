"""The docs build as a site, offline, without a warning (issue 26, point 1).

``mkdocs build --strict`` (Material theme, ``mkdocs.yml`` at the repository root) into
``tmp_path``: a broken link or anchor, a page missing from the navigation or any other
warning fails it. The README is no page of the site; its relative links must name files
that exist, and it links nowhere outside the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 120
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_site_builds_in_strict_mode_without_a_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, not about the docs
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.search(r"^(WARNING|ERROR)\b", result.stderr, re.MULTILINE) is None, result.stderr[-4000:]
    assert (site / "index.html").exists()
    assert (site / "guide" / "compaction.html").exists() or (site / "guide" / "compaction" / "index.html").exists()


def test_the_readme_and_docs_link_only_to_files_in_the_repository() -> None:
    problems = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:")):
                continue  # no such link today; an external one is allowed, a path out of the repo is not
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                problems.append(f"{page.relative_to(ROOT)} links to {target}, which is not in the repository")
    assert problems == []
