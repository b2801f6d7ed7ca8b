"""Structure: the ``__compaction`` cursor belongs to ``compactor.view.topic.CompactedTopic``.

No module outside the compactor package opens that cursor by name, or reads, writes or
deletes its rows: they take ``CompactedTopic.cursor`` (admin stats may still list it with
every other cursor, by a name they did not write). Inside the compactor only ``topic.py``
opens it, as a ``ManagedCursor`` (the Spark data source reads its persisted row, as any
reader of a data dir does).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CURSOR_CALLS = {"open_durable", "open_non_durable", "load_cursor", "save_cursor", "delete_cursor"}
OUTSIDE = ("api", "cursor", "ledger", "bench", "scripts")
OWNER = "compactor/view/topic.py"
ROW_READER = "compactor/spark/source.py"


def _names_the_compaction_cursor(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "__compaction"
    if isinstance(node, ast.Name):
        return node.id == "COMPACTION_SUBSCRIPTION"
    if isinstance(node, ast.Attribute):
        return node.attr == "COMPACTION_SUBSCRIPTION"
    return False


def compaction_cursor_calls(root: Path, packages: tuple[str, ...]) -> list[str]:
    """``path:line call`` for every cursor call naming the ``__compaction`` cursor."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
                if name in CURSOR_CALLS and any(_names_the_compaction_cursor(arg) for arg in arguments):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return found


def test_no_module_outside_the_compactor_opens_or_touches_the_compaction_cursor() -> None:
    assert compaction_cursor_calls(ROOT, OUTSIDE) == []


def test_inside_the_compactor_only_the_topic_opens_the_compaction_cursor() -> None:
    calls = compaction_cursor_calls(ROOT, ("compactor",))
    assert calls, "the check finds nothing: it no longer recognises the calls"
    assert {call.split(":")[0] for call in calls} <= {OWNER, ROW_READER}
    assert all(call.endswith(" open_durable") for call in calls if call.startswith(OWNER))  # the cursor object, no raw rows
    assert all(call.endswith(" load_cursor") for call in calls if call.startswith(ROW_READER))
