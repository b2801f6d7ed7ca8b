"""The README's five-minute tour runs, as written, against a real ``compactd serve``.

The tour's code blocks are read from ``README.md``: the one after ``<!-- tour: serve -->``
names the command that starts the broker (started here with its flags, on free ports and a
temporary data dir), and every block after ``<!-- tour -->`` runs in order: Python blocks
in one namespace (the tour's own ``assert``s check what it reads), bash blocks with
``compactd`` on the PATH and ``COMPACTD_ADMIN_URL`` pointing at the broker. The tour's
addresses (``pulsar://127.0.0.1:6650``, ``http://127.0.0.1:8080``) are replaced by the
broker's. A block that fails, or a tour that lost a step, fails the test.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serve_process import PROCESS_TIMEOUT_S, ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[3] / "README.md"
BLOCK = re.compile(r"<!-- tour(: serve)? -->\n```(python|bash)\n(.*?)```", re.DOTALL)
BROKER_URL, HTTP_URL = "pulsar://127.0.0.1:6650", "http://127.0.0.1:8080"


def tour_blocks() -> list[tuple[str, str, str]]:
    """(role, language, code) of each tour block, in README order."""
    return [("serve" if role else "step", language, code)
            for role, language, code in BLOCK.findall(README.read_text(encoding="utf-8"))]


def test_the_tour_has_a_serve_command_and_each_step_of_the_issue() -> None:
    blocks = tour_blocks()
    assert [role for role, _, _ in blocks].count("serve") == 1
    code = "\n".join(code for _, _, code in blocks)
    for step in ("partition_key=", "send(None", "compactd admin topics compact", "curl", "-X PUT",
                 "is_read_compacted=True", "create_table_view"):
        assert step in code, f"the tour lost the step {step!r}"


def test_the_readme_tour_runs_against_a_real_server(tmp_path: Path) -> None:
    blocks = tour_blocks()
    serve_code = next(code for role, _, code in blocks if role == "serve")
    arguments = shlex.split(serve_code.strip())
    assert arguments[:2] == ["compactd", "serve"]
    flags = [str(tmp_path / "data") if value == "./data" else value for value in arguments[2:]]
    flags = [value for flag, value in zip(["", *flags], flags, strict=False) if flag != "--data-dir"
             and value != "--data-dir"]  # ServeProcess passes the data dir itself
    serve = ServeProcess(tmp_path / "data", tmp_path / "serve.log", *flags)
    namespace: dict[str, Any] = {}
    env = {**os.environ, "COMPACTD_ADMIN_URL": serve.http_url,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        for role, language, code in blocks:
            if role == "serve":
                continue
            code = code.replace(BROKER_URL, serve.broker_url).replace(HTTP_URL, serve.http_url)
            if language == "python":
                exec(compile(code, "README.md (tour)", "exec"), namespace)  # noqa: S102 - the tour is ours
            else:
                result = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=env, cwd=tmp_path,
                                        capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False)
                assert result.returncode == 0, f"tour block failed:\n{code}\n{result.stdout}\n{result.stderr}"
        status = httpx.get(serve.http_url + "/admin/v2/persistent/public/default/prices/compaction", timeout=10)
        assert status.json() == {"status": "SUCCESS", "lastError": ""}
    finally:
        try:
            client = namespace.get("client")
            if client is not None:  # the tour closes it at its end; not when a step failed
                with contextlib.suppress(pulsar.AlreadyClosed):
                    client.close()
        finally:
            assert serve.terminate() == 0
