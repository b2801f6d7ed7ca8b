"""The packages import downwards only (ledger < message < cursor < compactor < api) and without cycles.

``message`` (Pulsar's message format) is a floor of its own: of compactd it imports
``ledger.errors`` only (the root error class). Inside ``compactor`` the floors are, bottom
up: its shared ground (the modules directly in ``compactor/``), ``compactor.view``,
``compactor.local``, ``compactor.spark``, ``compactor.runs``; a module imports its own
floor and the ones below, never one above.

Inside ``api``, the broker core (``api.broker``: the topic registry, which knows no sockets)
imports neither of its doors: not the wire package (the Pulsar listener, its connections
and their limits) nor the HTTP side (``api.http``, ``api.routers``, ``api.server``,
``api.listener``).

Every import counts: top-level, lazy (inside a function) and under ``TYPE_CHECKING`` alike,
because each one is a dependency a reader has to follow. The graph is built from the
source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("ledger", "message", "cursor", "compactor", "api")
BROKER_CORE = "api.broker"
# What serves the broker core to clients; the core imports none of it.
DOORS = ("api.wire", "api.http", "api.routers", "api.server", "api.listener")
# What the message format may import of compactd.
MESSAGE_ALLOWED = ("message", "ledger.errors")
# The compactor's floors, bottom up; a module directly in ``compactor/`` is on the ground.
# (The package's own ``__init__`` re-exports lazily from every floor: it counts as above them.)
COMPACTOR_FLOORS = ("compactor", "compactor.view", "compactor.local", "compactor.spark", "compactor.runs")


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the layered packages by dotted name (generated ``*_pb2`` left out)."""
    found = {}
    for package in LAYERS:
        for path in (root / package).rglob("*.py"):
            if path.name.endswith("_pb2.py"):
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported_names(name: str, path: Path) -> Iterator[str]:
    """The dotted names one module imports, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the four packages it imports (``from a import b`` counts
    ``a.b`` when that is a module, else ``a``); a package's own parents are left out."""
    known = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for target in _imported_names(name, path):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module in a higher layer than the importer's."""
    def layer(module: str) -> int:
        return LAYERS.index(module.split(".")[0])
    return [f"{a} imports {b}" for a, targets in sorted(graph.items()) for b in sorted(targets) if layer(b) > layer(a)]


def door_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a door (``DOORS``) by a module of the broker core."""
    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")
    return [f"{a} imports {b}" for a, targets in sorted(graph.items()) if within(a, BROKER_CORE)
            for b in sorted(targets) if any(within(b, door) for door in DOORS)]


def message_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import by a module of ``message`` of compactd beyond ``MESSAGE_ALLOWED``."""
    return [f"{a} imports {b}" for a, targets in sorted(graph.items()) if a.split(".")[0] == "message"
            for b in sorted(targets) if not any(b == ok or b.startswith(ok + ".") for ok in MESSAGE_ALLOWED)]


def compactor_floor(module: str) -> int:
    """The index in ``COMPACTOR_FLOORS`` of a module of the compactor; the package itself
    (its ``__init__``, the public names loaded lazily) stands above them all."""
    if module == "compactor":
        return len(COMPACTOR_FLOORS)
    parts = module.split(".")
    inner = ".".join(parts[:2])
    return COMPACTOR_FLOORS.index(inner) if inner in COMPACTOR_FLOORS else 0


def compactor_upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import by a module of the compactor of a module on a higher compactor floor."""
    def inside(module: str) -> bool:
        return module.split(".")[0] == "compactor"
    return [f"{a} imports {b}" for a, targets in sorted(graph.items()) if inside(a)
            for b in sorted(targets) if inside(b) and compactor_floor(b) > compactor_floor(a)]


def test_the_message_format_imports_nothing_of_compactd_but_ledger_errors() -> None:
    graph = import_graph(ROOT)
    assert any(name.startswith("message.") for name in graph)
    assert message_imports(graph) == []


def test_no_module_of_the_compactor_imports_a_floor_above_its_own() -> None:
    graph = import_graph(ROOT)
    assert {name.split(".")[1] for name in graph if name.count(".") >= 2 and name.startswith("compactor.")} \
        >= {"view", "local", "spark", "runs"}
    assert compactor_upward(graph) == []


def test_imports_of_the_floors_are_reported(tmp_path: Path) -> None:
    sources = {
        "message/entry.py": "from ledger.errors import CompactionServiceError\nfrom ledger.position import P\n",
        "message/errors.py": "def f():\n    import compactor.errors\n",
        "compactor/errors.py": "from message.errors import E\n",
        "compactor/view/view.py": "from compactor.local.algorithm import phase_two\n",
        "compactor/local/algorithm.py": "from compactor.view.view import CompactedEntry\n",
        "compactor/runs/runner.py": "def f():\n    from compactor.spark.engine import S\n",
        "compactor/spark/engine.py": "from compactor.runs.runner import R\n",
        "ledger/errors.py": "", "ledger/position.py": "",
    }
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text, encoding="utf-8")
    graph = import_graph(tmp_path)
    assert message_imports(graph) == ["message.entry imports ledger.position", "message.errors imports compactor.errors"]
    assert compactor_upward(graph) == [
        "compactor.spark.engine imports compactor.runs.runner", "compactor.view.view imports compactor.local.algorithm"]


def test_no_module_of_the_layered_packages_is_part_of_an_import_cycle() -> None:
    assert cycles(import_graph(ROOT)) == []


def test_no_module_imports_a_package_above_its_own() -> None:
    assert upward(import_graph(ROOT)) == []


def test_the_broker_core_imports_neither_the_wire_package_nor_the_http_side() -> None:
    assert door_imports(import_graph(ROOT)) == []


@pytest.mark.parametrize(("sources", "expected"), [
    ({"api/a.py": "from api import b\n", "api/b.py": "def f():\n    from api.a import x\n"}, [["api.a", "api.b"]]),
    ({"api/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T\n",
      "api/b.py": "import api.c\n", "api/c.py": "from api.a import y\n"}, [["api.a", "api.b", "api.c"]]),
    ({"api/a.py": "from api.b import x\n", "api/b.py": "import ledger.c\n", "ledger/c.py": ""}, []),
])
def test_the_graph_sees_lazy_relative_and_type_checking_imports(
    tmp_path: Path, sources: dict[str, str], expected: list[list[str]],
) -> None:
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text, encoding="utf-8")
    assert cycles(import_graph(tmp_path)) == expected


def test_an_import_from_a_lower_layer_upwards_is_reported(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    (tmp_path / "api").mkdir()
    (tmp_path / "ledger" / "a.py").write_text("def f():\n    import api.b\n", encoding="utf-8")
    (tmp_path / "api" / "b.py").write_text("", encoding="utf-8")
    assert upward(import_graph(tmp_path)) == ["ledger.a imports api.b"]


def test_an_import_of_a_door_by_the_broker_core_is_reported(tmp_path: Path) -> None:
    sources = {
        "api/broker/service.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from api.wire.limits import W\n",
        "api/broker/admin.py": "def f():\n    import api.server\n",
        "api/broker/topic.py": "from api.config import Settings\n",
        "api/wire/limits.py": "", "api/server.py": "", "api/config.py": "",
        "api/wire/listener.py": "from api.broker.service import B\n",
    }
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text, encoding="utf-8")
    assert door_imports(import_graph(tmp_path)) == [
        "api.broker.admin imports api.server", "api.broker.service imports api.wire.limits"]
