"""The ``compactd`` console script's entry point, and the command tree by lazy import.

``main`` logs to stderr (stdout carries only ``serve``'s ready line, ``api.server.run``)
and runs the command tree of ``api.cli_app``. ``compactd admin …`` is the one command a
user runs often and interactively: it loads only the admin client (``api.admin_cli`` and
its verb modules: typer, httpx, rich), not the settings, the broker, the compactor or
NumPy, so it sends its request a fraction of a second after it starts
(``bench.cli_start`` measures it). Every other command loads the whole tree.

``app``, ``CONFIG_ENV`` and ``settings_from_command_line`` are ``api.cli_app``'s, loaded
on first access.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.cli_app import CONFIG_ENV, app, settings_from_command_line

__all__ = ["CONFIG_ENV", "app", "main", "settings_from_command_line"]

ADMIN_COMMAND = "admin"
ADMIN_MODULES = ("api.admin_cli_schemas", "api.admin_cli_tenants", "api.admin_cli_topics", "api.admin_cli_offload")  # they add the verbs
_LAZY = {"app": "api.cli_app", "CONFIG_ENV": "api.cli_app", "settings_from_command_line": "api.cli_app"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'api.cli' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def admin_app() -> Any:
    """``compactd admin``'s typer app with all its verbs, loading nothing else."""
    for module in ADMIN_MODULES:
        importlib.import_module(module)
    from api.admin_cli import app as admin

    return admin


def main() -> None:
    """Console-script entry point: log to stderr (stdout carries only the ready line);
    ``serve`` then logs as its ``--log-format`` and ``--log-level`` say (``api.server.run``)."""
    from api.logs import configure_logging

    configure_logging("text", "info")
    prog_name = os.path.basename(sys.argv[0]) or "compactd"
    if sys.argv[1:2] == [ADMIN_COMMAND]:
        admin_app()(args=sys.argv[2:], prog_name=f"{prog_name} {ADMIN_COMMAND}")
        return
    importlib.import_module("api.cli_app").app(prog_name=prog_name)
