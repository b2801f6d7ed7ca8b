"""No layer above ``ledger/`` probes a ledger store: it asks ``LedgerStore.file_powers()``.

A store's powers beyond the nine-method seam are named (``ledger.storage.powers.LedgerFiles``)
and asked for once; guessing them from a store's type or attributes is what this AST scan
refuses in ``compactor/``, ``cursor/``, ``api/`` and ``message/``:

* ``getattr(x, ...)`` / ``hasattr(x, ...)`` where ``x`` is store-like: the name it ends in
  (``store``, ``self._store``, ``topic.ledger.store``, ``data_dir.ledgers``, ``make_store()``)
  ends in ``store``/``stores``/``ledgers``;
* ``isinstance(x, C)`` / ``issubclass(x, C)`` where ``C`` (or any member of a tuple or
  ``A | B`` union) names a class with ``Store`` in its name;
* ``type(x) is C`` / ``type(x) == C`` (either side, ``is not``/``!=`` too) with such a ``C``.

``ledger/`` is the stores' own package and is not scanned.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("compactor", "cursor", "api", "message")
STORE_LIKE_NAME = re.compile(r"(stores?|ledgers)$", re.IGNORECASE)
STORE_CLASS = re.compile(r"Store")


def _terminal(node: ast.expr) -> str | None:
    """The name an expression ends in: ``a.b.c`` → ``c``, ``f()`` → ``f``, ``x[0]`` → ``x``."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return None


def _class_names(node: ast.expr) -> list[str]:
    """The class names a classinfo argument names: one, a tuple's, or a ``|`` union's."""
    if isinstance(node, ast.Tuple):
        return [name for element in node.elts for name in _class_names(element)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _class_names(node.left) + _class_names(node.right)
    name = _terminal(node)
    return [] if name is None else [name]


def _names_store_class(node: ast.expr) -> bool:
    return any(STORE_CLASS.search(name) for name in _class_names(node))


def _is_type_call(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
            and len(node.args) == 1)


def store_probes(source: str, filename: str = "<snippet>") -> list[str]:
    """Every store probe in ``source``, as ``file:line: code``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        probe = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            name, first = node.func.id, node.args[0]
            if name in ("getattr", "hasattr"):
                probe = STORE_LIKE_NAME.search(_terminal(first) or "") is not None
            elif name in ("isinstance", "issubclass") and len(node.args) == 2:
                probe = _names_store_class(node.args[1])
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
                node.ops[0], ast.Is | ast.IsNot | ast.Eq | ast.NotEq):
            left, right = node.left, node.comparators[0]
            probe = ((_is_type_call(left) and _names_store_class(right))
                     or (_is_type_call(right) and _names_store_class(left)))
        if probe:
            assert isinstance(node, ast.expr)
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def _sources() -> list[Path]:
    return sorted(path for package in SCANNED for path in (ROOT / package).rglob("*.py"))


def test_no_layer_above_the_ledger_probes_a_store() -> None:
    sources = _sources()
    assert ROOT / "compactor" / "runs" / "runner.py" in sources  # the scan sees the code it guards
    assert ROOT / "api" / "broker" / "service.py" in sources
    probes = [probe for path in sources
              for probe in store_probes(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert probes == [], "ask LedgerStore.file_powers() instead of probing the store:\n" + "\n".join(probes)


@pytest.mark.parametrize("snippet", [
    'getattr(store, "root", None)',
    'hasattr(store, "reserve_ids")',
    'getattr(topic.ledger.store, "adopt_sealed", None)',
    'hasattr(self._store, "confirmed_length")',
    'getattr(data_dir.ledgers, "root")',
    'hasattr(make_store(), "root")',
    'getattr(stores[0], "root")',
    "isinstance(data_dir.ledgers, FileLedgerStore)",
    "isinstance(anything, storage.FileLedgerStore)",
    "isinstance(x, (MemoryLedgerStore, FileLedgerStore))",
    "isinstance(x, int | FileLedgerStore)",
    "not isinstance(x, LedgerStore)",
    "issubclass(type(x), LedgerStore)",
    "type(store) is FileLedgerStore",
    "FileLedgerStore == type(x)",
    "type(x) is not MemoryLedgerStore",
])
def test_the_rule_catches_each_form_of_probe(snippet: str) -> None:
    assert len(store_probes(f"def f():\n    if {snippet}:\n        pass\n")) == 1


@pytest.mark.parametrize("snippet", [
    "store.file_powers()",
    'getattr(engine, "stop", None)',
    'hasattr(pool, "_processes")',
    'getattr(request.app.state.broker, "access", None)',
    'getattr(storey_value, "x")',  # "store" inside a name is not its end
    "isinstance(access, AccessControl)",
    "isinstance(files, tuple)",
    "type(x) is int",
])
def test_the_rule_leaves_other_code_alone(snippet: str) -> None:
    assert store_probes(f"def f():\n    if {snippet}:\n        pass\n") == []
