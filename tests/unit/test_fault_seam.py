"""Faults are injected one way: tests never replace a store's methods.

The seam is the shared database's named fault points (``ledger.database``: ``<transaction>
.before``, ``<transaction>.after`` and the ``checkpoint``s inside a transaction) and, for
ledger I/O, ``ledger.storage.faulty.FaultyLedgerStore``. This module reads every test file
and fails on a method of a metadata store assigned over (``store.save = ...``, with or
without ``# type: ignore[method-assign]``) or patched with ``setattr``, and on a fault point
name that no transaction or checkpoint of the code fires (a typo would leave a test that
injects nothing).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from api.broker.policies import PolicyStore
from compactor.runs.status import CompactionStatusStore
from cursor.store import CursorStore
from ledger.database import Database
from ledger.metadata import MetadataStore

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ledger", "cursor", "compactor", "api")
STORES = (Database, MetadataStore, CursorStore, PolicyStore, CompactionStatusStore)
STORE_METHODS = {name for store in STORES for name in vars(store) if callable(getattr(store, name))
                 and not name.startswith("__")}


def _test_files() -> list[Path]:
    return sorted(path for path in (ROOT / "tests").rglob("*.py") if path != Path(__file__).resolve())


def _replaced_methods(tree: ast.AST) -> list[tuple[int, str]]:
    """``x.method = ...`` and ``setattr(x, "method", ...)`` for store method names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [(node.lineno, target.attr) for target in targets
                      if isinstance(target, ast.Attribute) and target.attr in STORE_METHODS]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name == "setattr":  # setattr(x, "method", f) or monkeypatch.setattr("mod.Class.method", f)
                found += [(node.lineno, str(arg.value)) for arg in node.args[:2]
                          if isinstance(arg, ast.Constant) and str(arg.value).rsplit(".", 1)[-1] in STORE_METHODS]
    return found


def _fault_point_names(tree: ast.Module) -> list[tuple[int, str]]:
    """Names used as keys of ``fault_points[...]``, module constants resolved."""
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    names: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "fault_points":
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                names.append((node.lineno, key.value))
            elif isinstance(key, ast.Name) and key.id in constants:
                names.append((node.lineno, constants[key.id]))
    return names


def _fired_fault_points() -> set[str]:
    """Every fault point name the code fires."""
    fired: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            for name in re.findall(r"transaction\(\s*\"([\w.]+)\"", text):
                fired |= {f"{name}.before", f"{name}.after"}
            fired |= set(re.findall(r"checkpoint\(\s*\"([\w.]+)\"", text))
    return fired


def test_no_test_replaces_a_metadata_store_method() -> None:
    offences = []
    for path in _test_files():
        text = path.read_text()
        if "method-assign" in text:
            offences.append(f"{path.relative_to(ROOT)}: a type: ignore[method-assign]")
        offences += [f"{path.relative_to(ROOT)}:{line}: replaces {name}"
                     for line, name in _replaced_methods(ast.parse(text))]
    assert not offences, "inject faults through Database.fault_points instead:\n" + "\n".join(offences)


def test_every_fault_point_a_test_arms_is_one_the_code_fires() -> None:
    fired = _fired_fault_points()
    assert {"cursor.save.before", "cursor.save.after", "cursor.save.between_position_and_properties"} <= fired
    unknown = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in _test_files()
               for line, name in _fault_point_names(ast.parse(path.read_text())) if name not in fired]
    assert not unknown, "no such fault point:\n" + "\n".join(unknown)
