"""The message format is a floor of its own: importing it loads neither NumPy nor the compactor.

The wire layer decodes frames with ``message``; before it had its own package, that import
went through ``compactor/__init__`` and loaded the runner, the worker and NumPy. Each module
of the package is imported in a fresh interpreter, and ``sys.modules`` is checked after.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import message

ROOT = Path(__file__).resolve().parents[3]


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(message.__path__, "message."))


def test_importing_every_module_of_message_loads_neither_numpy_nor_the_compactor() -> None:
    modules = _modules()
    assert {"message.entry", "message.encoder", "message.compression", "message.errors",
            "message.proto.pulsar_api_pb2"} <= set(modules)
    script = (
        "import importlib, json, sys\n"
        f"for name in ['message'] + {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    loaded = json.loads(result.stdout)
    assert set(modules) <= set(loaded)
    assert [name for name in loaded if name == "numpy" or name.startswith("numpy.")] == []
    assert [name for name in loaded if name == "compactor" or name.startswith("compactor.")] == []
    assert [name for name in loaded if name.split(".")[0] in {"cursor", "api"}] == []


def test_the_compactor_errors_are_the_format_errors() -> None:
    import compactor.errors
    import message.errors

    assert compactor.errors.MalformedEntryError is message.errors.MalformedEntryError
    assert compactor.errors.UndecodablePayloadError is message.errors.UndecodablePayloadError
    try:
        raise message.errors.UndecodablePayloadError("bad payload", ledger_id=3, entry_id=4)
    except compactor.errors.MalformedEntryError as error:
        assert (error.ledger_id, error.entry_id) == (3, 4)
