"""Regenerate the reference parts of the docs from the code, so that they cannot drift.

What the code defines, read by introspection (never a hand-kept list):

* settings: ``api.config.setting_specs()`` (key, default, help);
* CLI commands: the click tree of the typer app ``api.cli.app``;
* REST routes: the OpenAPI description of the FastAPI application ``api.http.create_app()``.

What this writes:

* ``deploy/compactd.toml``: every setting with its default and its one-line explanation
  (a setting whose default is "none" is commented out: TOML has no null);
* ``docs/reference/settings.md``, ``docs/reference/commands.md`` and
  ``docs/reference/rest.md``, between ``<!-- generated:settings -->``,
  ``<!-- generated:commands -->``, ``<!-- generated:routes -->`` (one in each) and their
  ``<!-- /generated:… -->`` markers: a table of the settings, of the commands and of the
  routes.

``tests/unit/test_docs_drift.py`` fails, listing what is missing where, when either file
is out of date. Usage::

    .venv/bin/python scripts/gen_docs.py            # rewrite the files
    .venv/bin/python scripts/gen_docs.py --check    # exit 1 when one differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import typer  # after the path: run as a script from anywhere

from api.cli import app as cli_app
from api.config import SettingSpec, env_name, flag_name, setting_specs
from api.http import create_app

DOCS = ROOT / "docs"
# The page that holds each generated section.
PAGES = {"settings": DOCS / "reference" / "settings.md", "commands": DOCS / "reference" / "commands.md",
         "routes": DOCS / "reference" / "rest.md"}
CONFIG_SAMPLE = ROOT / "deploy" / "compactd.toml"
SECTIONS = ("settings", "commands", "routes")
METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH")
DEPLOYED_DATA_DIR = "/var/lib/compactd"
# The sample's values that differ from the defaults: where a deployment keeps its data
# (the systemd unit's and the container image's data dir too).
SAMPLE_OVERRIDES: dict[str, object] = {"data_dir": DEPLOYED_DATA_DIR}


# -- what the code defines ---------------------------------------------------------------


def command_tree() -> Any:
    """The ``compactd`` command as click sees it (typer's own copy of click: a group is a
    command with ``commands``)."""
    command = typer.main.get_command(cli_app)
    assert hasattr(command, "commands")
    return command


def subcommands(command: Any) -> dict[str, Any]:
    """A group's sub-commands by name; {} for a command that is no group."""
    return dict(getattr(command, "commands", None) or {})


def command_paths() -> dict[str, str]:
    """Every command (leaf) as ``"admin topics create"`` → its one-line help."""
    found: dict[str, str] = {}

    def walk(group: Any, prefix: tuple[str, ...]) -> None:
        for name, command in sorted(subcommands(group).items()):
            if command.hidden:
                continue
            path = (*prefix, name)
            if subcommands(command):
                walk(command, path)
            else:
                found[" ".join(path)] = _first_line(command.help or command.short_help or "")

    walk(command_tree(), ())
    return found


def option_names() -> set[str]:
    """Every long option of every command and group (``--admin-url``, ``--threshold``)."""
    names: set[str] = set()

    def walk(command: Any) -> None:
        for parameter in command.params:
            names.update(opt for opt in [*parameter.opts, *parameter.secondary_opts] if opt.startswith("--"))
        for sub in subcommands(command).values():
            walk(sub)

    walk(command_tree())
    return names


def routes() -> dict[tuple[str, str], str]:
    """Every REST route as ``(method, path template)`` → its summary, as the application's
    OpenAPI description (what ``/docs`` shows) lists them."""
    found: dict[tuple[str, str], str] = {}
    for path, operations in create_app().openapi()["paths"].items():
        for method, operation in operations.items():
            if method.upper() in METHODS:
                found[(method.upper(), path)] = operation.get("summary") or operation.get("operationId", "")
    return found


def _first_line(text: str) -> str:
    return text.strip().split("\n\n")[0].replace("\n", " ").strip()


# -- what the docs say -------------------------------------------------------------------


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def config_sample() -> str:
    """The text of ``deploy/compactd.toml``."""
    lines = [
        "# Every setting of compactd serve, with its default (generated by scripts/gen_docs.py from",
        "# api/config.py; do not edit by hand). A key is also a flag (data_dir: --data-dir) and an",
        "# environment variable (COMPACTD_DATA_DIR); precedence: flag > env > this file > default.",
        "# Use it with --config FILE or COMPACTD_CONFIG=FILE; delete what you do not change.",
    ]
    for spec in setting_specs():
        lines.append("")
        lines.append(f"# {spec.help}")
        if spec.key in SAMPLE_OVERRIDES:
            lines.append(f"# (default: {_toml_value(spec.default)}; set here as the deployments in deploy/ use it)")
            lines.append(f"{spec.key} = {_toml_value(SAMPLE_OVERRIDES[spec.key])}")
        elif spec.default is None:
            lines.append(f"# {spec.key} = ...  (default: none)")
        else:
            lines.append(f"{spec.key} = {_toml_value(spec.default)}")
    return "\n".join(lines) + "\n"


def _shown_default(spec: SettingSpec) -> str:
    if spec.default is None or spec.default == ():
        return "none"
    if isinstance(spec.default, bool):
        return "true" if spec.default else "false"
    return str(spec.default)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_table() -> str:
    rows = ["| flag | environment | default | what it does |", "| --- | --- | --- | --- |"]
    rows.extend(f"| `{flag_name(spec.key)}` | `{env_name(spec.key)}` | `{_shown_default(spec)}` | {_cell(spec.help)} |"
                for spec in setting_specs())
    return "\n".join(rows)


def commands_table() -> str:
    rows = ["| command | what it does |", "| --- | --- |"]
    rows.extend(f"| `compactd {path}` | {_cell(text)} |" for path, text in command_paths().items())
    return "\n".join(rows)


def routes_table() -> str:
    rows = ["| route | what it does |", "| --- | --- |"]
    rows.extend(f"| `{method} {path}` | {_cell(text)} |" for (method, path), text in sorted(
        routes().items(), key=lambda item: (item[0][1], METHODS.index(item[0][0]))))
    return "\n".join(rows)


GENERATORS = {"settings": settings_table, "commands": commands_table, "routes": routes_table}


def _markers(section: str) -> tuple[str, str]:
    return f"<!-- generated:{section} -->", f"<!-- /generated:{section} -->"


def page_with_table(text: str, section: str) -> str:
    """``text`` (the section's page) with the generated section replaced by its current table."""
    begin, end = _markers(section)
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{PAGES[section].relative_to(ROOT)} has no {begin} … {end} section")
    replacement = f"{begin}\n{GENERATORS[section]()}\n{end}"
    return pattern.sub(replacement.replace("\\", "\\\\"), text)


def generated_section(text: str, section: str) -> str | None:
    """The body between a section's markers in ``text``; None without them."""
    begin, end = _markers(section)
    match = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), text, re.DOTALL)
    return None if match is None else match.group(1)


def expected_files() -> Iterator[tuple[Path, str]]:
    yield CONFIG_SAMPLE, config_sample()
    for section, page in PAGES.items():
        yield page, page_with_table(page.read_text(encoding="utf-8"), section)


def documentation() -> dict[str, str]:
    """Every page of the docs (README.md and docs/**/*.md), by path from the repository root."""
    paths = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in paths}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is out of date")
    arguments = parser.parse_args(argv)
    stale = []
    for path, text in expected_files():
        if path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not arguments.check:
                path.write_text(text, encoding="utf-8")
    if arguments.check and stale:
        print("out of date: " + ", ".join(str(path.relative_to(ROOT)) for path in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
