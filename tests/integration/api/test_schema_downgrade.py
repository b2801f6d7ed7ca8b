"""A data dir written by a newer compactd is refused by ``compactd serve``, clearly and
without touching it (issue 16 point 7, "a downgrade is refused clearly").

The newer compactd is simulated the one way the database records it: a component's
version in ``schema_versions`` (or the layout in ``PRAGMA user_version``) above what this
code knows. ``compactd serve`` must exit 1 with one line naming the file, the component,
both versions and what to do, print no traceback, and leave ``metadata.db`` byte for
byte as it was.
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.database import LAYOUT
from ledger.metadata import MIGRATIONS
from tests.serve_process import PROCESS_TIMEOUT_S, ServeProcess

pytestmark = pytest.mark.integration

COMPACTD = str(Path(sys.executable).with_name("compactd"))


def _serve_once(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMPACTD, "serve", "--data-dir", str(data_dir), "--broker-port", "0", "--http-port", "0"],
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("newer", ["component", "layout"])
def test_a_data_dir_of_a_newer_compactd_is_refused_at_start_and_left_untouched(tmp_path: Path, newer: str) -> None:
    data_dir = tmp_path / "data"
    serve = ServeProcess(data_dir, tmp_path / "serve.log")
    assert serve.terminate() == 0
    database = data_dir / "metadata.db"
    with sqlite3.connect(database) as connection:
        if newer == "component":
            connection.execute("UPDATE schema_versions SET version = ? WHERE component = 'ledger'",
                               (len(MIGRATIONS) + 1,))
        else:
            connection.execute(f"PRAGMA user_version = {LAYOUT + 1}")
    connection.close()
    before = _digest(database)

    result = _serve_once(data_dir)

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    expected = (f"compactd: {database} has ledger schema version {len(MIGRATIONS) + 1}; this compactd knows up to "
                f"{len(MIGRATIONS)}: upgrade compactd" if newer == "component" else
                f"compactd: {database} has layout version {LAYOUT + 1}; this compactd knows up to {LAYOUT}: "
                "upgrade compactd")
    assert result.stderr.strip().splitlines()[-1] == expected
    assert result.stdout == ""  # never announced ready
    assert _digest(database) == before
