"""The source passes the project's linters: ruff over the tree, mypy --strict over the packages."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists() and shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")
    return str(path) if path.exists() else name


def test_ruff_is_clean() -> None:
    result = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = subprocess.run([_tool("mypy"), "ledger", "cursor", "compactor", "api"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
