"""The packages import downwards only (ledger < cursor < compactor < api) and without cycles.

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
LAYERS = ("ledger", "cursor", "compactor", "api")
BROKER_CORE = "api.broker"
# What serves the broker core to clients; the core imports none of it.
DOORS = ("api.wire", "api.http", "api.routers", "api.server", "api.listener")


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the four packages by dotted name (generated ``*_pb2`` left out)."""
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


def test_no_module_of_the_four_packages_is_part_of_an_import_cycle() -> None:
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
