"""Each setting's default is written once, and settings are read as typed fields.

A setting a lower layer applies (``ManagedLedgerConfig``, ``CompactionConfig``,
``WireLimits``, the data dir's open-file bound and sync policy) has its default in that
layer; ``api.config.Settings`` refers to it. So: the layer's config built from default
settings is the layer's default config, and the ``Settings`` field of such a setting has
no literal default. Above the layers nothing reads a setting by name with a fallback
(``getattr(settings, name, default)`` was a second default each time), and a string
default is written in one module only.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from api.broker.service import compaction_config, ledger_config
from api.config import Settings, SettingSpec, setting_specs
from api.wire.limits import WireLimits
from api.wire.listener import wire_limits
from compactor.runs.runner import CompactionConfig
from ledger.data_dir import DataDir
from ledger.managed_ledger import ManagedLedgerConfig
from ledger.storage.base import SyncPolicy

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("ledger", "cursor", "compactor", "api")
CONFIG_SOURCE = ROOT / "api" / "config.py"
# Each lower layer's config as the broker builds it from Settings, and the layer's default config.
LAYERS: dict[str, tuple[Callable[[Settings], object], object]] = {
    "ledger": (ledger_config, ManagedLedgerConfig()),
    "compactor": (compaction_config, CompactionConfig()),
    "wire": (wire_limits, WireLimits()),
}
OPEN_DEFAULTS = inspect.signature(DataDir.open).parameters
# Settings the data dir applies when it is opened (DataDir.open's keywords).
DATA_DIR_SETTINGS = {"max_open_ledger_files": "max_open_files", "fsync": "sync"}


def _other_value(spec: SettingSpec) -> Any:
    """A valid value of the setting other than its default (None where there is none to try)."""
    default = spec.default
    if spec.choices:
        return next(choice for choice in spec.choices if choice != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default + 1
    if isinstance(default, str):
        return default + "-other"
    return None


def layered_settings() -> set[str]:
    """The settings a lower layer's config changes with, found by changing each in turn."""
    found = set()
    defaults = Settings()
    for spec in setting_specs():
        other = _other_value(spec)
        if other is None:
            continue
        changed = dataclasses.replace(defaults, **{spec.key: other})
        if any(build(changed) != build(defaults) for build, _ in LAYERS.values()):
            found.add(spec.key)
    return found | set(DATA_DIR_SETTINGS)


def default_expressions() -> dict[str, ast.expr]:
    """Each ``Settings`` field's default as written in ``api/config.py``."""
    tree = ast.parse(CONFIG_SOURCE.read_text(encoding="utf-8"))
    settings = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Settings")
    found = {}
    for statement in settings.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            assert isinstance(statement.value, ast.Call)  # _setting(default, help, ...)
            found[statement.target.id] = statement.value.args[0]
    return found


def _is_literal(expression: ast.expr) -> bool:
    """A value written out (``30.0``, ``2 * 1024``), referring to nothing defined elsewhere."""
    return not any(isinstance(node, ast.Name | ast.Attribute | ast.Call) for node in ast.walk(expression))


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.name.endswith("_pb2.py"):
                yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_lower_layers_config_built_from_default_settings_is_that_layers_default(layer: str) -> None:
    build, default = LAYERS[layer]
    assert build(Settings()) == default


def test_the_data_dir_opens_by_default_as_default_settings_open_it() -> None:
    settings = Settings()
    assert settings.max_open_ledger_files == OPEN_DEFAULTS["max_open_files"].default
    assert SyncPolicy(settings.fsync) is OPEN_DEFAULTS["sync"].default


def test_the_settings_of_the_lower_layers_are_found() -> None:
    """The search below sees the settings each layer takes (a guard on the search itself)."""
    assert {"managed_ledger_max_entries_per_ledger", "compaction_phase_one_loop_timeout_seconds",
            "compaction_engine", "compaction_memory_budget_bytes", "spark_master",
            "wire_frame_timeout_seconds", "wire_partial_frames_budget_bytes"} <= layered_settings()
    assert "broker_port" not in layered_settings()


def test_a_setting_a_lower_layer_applies_takes_its_default_from_that_layer() -> None:
    expressions = default_expressions()
    written_twice = sorted(key for key in layered_settings() if _is_literal(expressions[key]))
    assert written_twice == [], "Settings repeats the lower layer's default literally"


def test_every_setting_has_a_default_expression_read_by_the_check_above() -> None:
    assert set(default_expressions()) == {spec.key for spec in setting_specs()}


def test_no_module_reads_a_setting_by_name_with_a_fallback() -> None:
    reads = [
        f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}"
        for path, tree in _modules() for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
        and node.args and ast.unparse(node.args[0]).endswith("settings")
    ]
    assert reads == []


def _string_constants(tree: ast.Module) -> set[str]:
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_a_string_default_is_written_in_one_module() -> None:
    """``cluster_name``'s ``standalone`` once stood in the metrics as well; a copy drifts."""
    defaults = {spec.key: spec.default for spec in setting_specs()
                if isinstance(spec.default, str) and not spec.choices}
    modules = [(path, _string_constants(tree)) for path, tree in _modules()]
    where: dict[str, list[str]] = {
        key: [str(path.relative_to(ROOT)) for path, strings in modules if value in strings]
        for key, value in defaults.items()
    }
    assert {key: paths for key, paths in where.items() if len(paths) != 1} == {}


def test_the_broker_core_takes_typed_settings() -> None:
    """``BrokerService``, the listener and the offline run are typed with ``Settings``, not ``Any``."""
    from api.broker.service import BrokerService
    from api.offline import compact_offline
    from api.wire.listener import PulsarBroker

    for function in (BrokerService.__init__, PulsarBroker.__init__, compact_offline,
                     compaction_config, ledger_config, wire_limits):
        hints: dict[str, Any] = inspect.get_annotations(function, eval_str=True)
        assert hints["settings"] is Settings, function.__qualname__
