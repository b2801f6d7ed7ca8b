"""One owner of the topic lifecycle: no module but ``api.broker.registry`` reads or changes
which topics are loaded, loading, closing or deleted.

An AST scan of the source packages: the broker's former sets (``.topics``, ``.loading``,
``.closing``, ``.deleting``) on the service (``broker``, ``service``, ``self`` in the
service's classes) and the registry's private state (``._loaded``, ``._states``, ...) reached
from outside it are findings; so is a ``TopicStates`` machine made outside the registry.
The scanner is shown to find each kind of access in a snippet, so that it can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
PACKAGES = ("api", "compactor", "cursor", "ledger")
OWNER = Path("api/broker/registry.py")
MACHINE = Path("api/broker/topic_state.py")

SERVICE_SETS = frozenset({"topics", "loading", "closing", "deleting"})
REGISTRY_PRIVATE = frozenset({"_loaded", "_states", "_opens", "_closes", "_discards"})
SERVICE_NAMES = frozenset({"broker", "service", "core", "_broker", "_service"})
SERVICE_CLASSES = frozenset({"BrokerService", "PulsarBroker"})


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def findings(source: str, path: str = "<snippet>") -> list[str]:
    """Each access to the lifecycle's state that is not the registry's, as ``path:line: text``."""
    tree = ast.parse(source)
    found: list[str] = []

    def visit(node: ast.AST, service_class: bool) -> None:
        if isinstance(node, ast.ClassDef):
            service_class = node.name in SERVICE_CLASSES
        if isinstance(node, ast.Attribute):
            owner = _last_name(node.value)
            if node.attr in SERVICE_SETS and (owner in SERVICE_NAMES or (owner == "self" and service_class)):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
            if node.attr in REGISTRY_PRIVATE and owner is not None and owner.endswith("registry"):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and _last_name(node.func) == "TopicStates":
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, service_class)

    visit(tree, False)
    return found


@pytest.mark.parametrize("snippet", [
    "broker.topics.get(name)",
    "name in self.broker.loading",
    "self.broker.deleting.add(name)",
    "del service.closing[name]",
    "class BrokerService:\n    def f(self):\n        self.topics[k] = t",
    "broker.registry._loaded.pop(k)",
    "self.registry._states.handle(event)",
    "states = TopicStates()",
])
def test_the_scanner_finds_each_kind_of_access(snippet: str) -> None:
    assert findings(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "broker.registry.get(name)",
    "class Tenants:\n    def f(self):\n        return self.topics",
    "admin_cli.topics",
    "states.topics(Phase.QUEUED)",
])
def test_the_scanner_leaves_other_uses_alone(snippet: str) -> None:
    assert findings(snippet) == [], snippet


def test_no_module_but_the_registry_touches_the_topic_lifecycle_state() -> None:
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative in (OWNER, MACHINE):
                continue
            found += findings(path.read_text(encoding="utf-8"), str(relative))
    assert found == [], "\n".join(found)


def test_the_service_holds_no_lifecycle_set_of_its_own(tmp_path: Path) -> None:
    from api.broker.registry import TopicRegistry
    from api.broker.service import BrokerService
    from api.config import Settings
    from ledger.data_dir import DataDir

    data_dir = DataDir.open(str(tmp_path))
    try:
        service = BrokerService(data_dir, Settings())
        assert isinstance(service.registry, TopicRegistry)
        assert not [name for name in SERVICE_SETS if hasattr(service, name)]
    finally:
        data_dir.close()
