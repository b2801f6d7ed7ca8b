"""The docs cannot drift from the code (issue 16 point 7).

The code is read by introspection (``scripts/gen_docs.py``: ``Settings``, the typer app's
command tree, the FastAPI application's OpenAPI paths); the docs are ``README.md``, the
pages under ``docs/`` (the generated tables are in ``docs/reference/``) and
``deploy/compactd.toml``. Each test lists exactly what is missing where, in both
directions:

* ``test_every_setting_is_in_the_sample_config_with_its_default_and_nothing_else`` —
  a setting missing from ``deploy/compactd.toml``, a key there that no setting has, a
  value that is not the default (the data dir is the deployments' ``/var/lib/compactd``);
* ``test_every_setting_is_in_the_docs_and_every_flag_they_name_exists`` — the settings
  table, and every ``--flag`` the docs name alone in code;
* ``test_every_command_is_in_the_docs_and_every_command_they_show_exists`` — every
  command path; every ``compactd …`` the docs show resolves to a command, with options
  that command has;
* ``test_every_route_is_in_the_docs_and_every_route_they_show_exists`` — every method and
  path; every ``METHOD /path`` and ``curl`` URL the docs show is served;
* ``test_the_generated_parts_of_the_docs_are_up_to_date`` — help texts and defaults too.

The fix for most failures: ``python scripts/gen_docs.py`` (then review the diff).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from typing import Any

from api.admin_cli import hoist_admin_options
from api.config import flag_name, load_settings, setting_specs
from api.http import create_app
from scripts import gen_docs

FIX = "fix: run `python scripts/gen_docs.py` and review the diff"
CODE_BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")
# ``compactd`` as a command: at the start of a line or span, after a path or a shell operator.
COMPACTD_MENTION = re.compile(r"(?:^|(?<=/)|(?<=&& )|(?<=\| )|(?<=\$ ))compactd[ \t]+([^\n`|#;&]*)", re.MULTILINE)
ROUTE_MENTION = re.compile(r"\b(GET|PUT|POST|DELETE|PATCH)\s+(/[^\s`]*)")
CURL = re.compile(r"\bcurl\b([^\n]*?)https?://[^/\s]+(/[^\s'\"`]*)")


def _docs() -> dict[str, str]:
    """Every page (README.md and docs/), by path."""
    return gen_docs.documentation()


def _settings_page() -> str:
    return gen_docs.PAGES["settings"].read_text(encoding="utf-8")


def _code_texts(text: str) -> Iterator[str]:
    """Every code block and inline code span of ``text``."""
    without_blocks = CODE_BLOCK.sub("", text)
    yield from (match.group(1) for match in CODE_BLOCK.finditer(text))
    yield from (" ".join(match.group(1).split()) for match in INLINE_CODE.finditer(without_blocks))


def _report(problems: list[str]) -> str:
    return "the docs and the code disagree:\n  " + "\n  ".join(problems) + f"\n{FIX}"


# -- settings ---------------------------------------------------------------------------------


def _sample_keys(text: str) -> set[str]:
    """Keys set in the sample, and keys shown commented out (``# key = ...  (default: none)``)."""
    keys = set(tomllib.loads(text))
    keys.update(re.findall(r"^# ([a-z0-9_]+) = \.\.\.", text, re.MULTILINE))  # s3_…: a digit
    return keys


def test_every_setting_is_in_the_sample_config_with_its_default_and_nothing_else() -> None:
    text = gen_docs.CONFIG_SAMPLE.read_text(encoding="utf-8")
    code = {spec.key for spec in setting_specs()}
    documented = _sample_keys(text)
    problems = [f"deploy/compactd.toml lacks the setting {key}" for key in sorted(code - documented)]
    problems += [f"deploy/compactd.toml has {key}, which no setting of api/config.py has"
                 for key in sorted(documented - code)]
    assert problems == [], _report(problems)
    loaded = load_settings({}, {}, text, config_file_path="deploy/compactd.toml")
    expected = {spec.key: gen_docs.SAMPLE_OVERRIDES.get(spec.key, spec.default) for spec in setting_specs()}
    differing = [f"deploy/compactd.toml sets {key} = {getattr(loaded, key)!r}; it should be {value!r}"
                 for key, value in expected.items() if getattr(loaded, key) != value]
    assert differing == [], _report(differing)


def test_every_setting_is_in_the_docs_and_every_flag_they_name_exists() -> None:
    page = str(gen_docs.PAGES["settings"].relative_to(gen_docs.ROOT))
    table = gen_docs.generated_section(_settings_page(), "settings")
    assert table is not None, f"{page} has no <!-- generated:settings --> section; " + FIX
    code = {flag_name(spec.key) for spec in setting_specs()}
    documented = set(re.findall(r"^\| `(--[a-z0-9-]+)` \|", table, re.MULTILINE))
    problems = [f"{page}'s settings table lacks {flag}" for flag in sorted(code - documented)]
    problems += [f"{page}'s settings table has {flag}, which is no setting" for flag in sorted(documented - code)]
    known = code | gen_docs.option_names() | {"--help"}
    for name, text in _docs().items():
        named = {code_text for code_text in _code_texts(text) if re.fullmatch(r"--[a-z0-9-]+", code_text)}
        problems += [f"{name} names `{flag}`, which no setting or command option has" for flag in sorted(named - known)]
    assert problems == [], _report(problems)


# -- commands ---------------------------------------------------------------------------------


def _resolve(tokens: list[str]) -> tuple[str, str | None]:
    """Walk ``compactd`` + ``tokens`` down the command tree: (command path, problem or None)."""
    command: Any = gen_docs.command_tree()
    path: list[str] = []
    skip_value = False
    if tokens[:1] == ["admin"]:  # as the admin group parses: its options may follow the sub-command
        tokens = ["admin", *hoist_admin_options(tokens[1:])]
    for token in tokens:
        if skip_value:
            skip_value = False
            continue
        if token.startswith("-"):
            option = _option(command, token.split("=")[0])
            if option is None:
                return " ".join(path), f"has no option {token.split('=')[0]}"
            skip_value = "=" not in token and not option.is_flag and option.nargs != 0
            continue
        children = gen_docs.subcommands(command)
        if not children:  # a command's arguments
            continue
        if token not in children:
            return " ".join(path), f"has no sub-command {token!r}"
        command = children[token]
        path.append(token)
    return " ".join(path), None


def _option(command: Any, name: str) -> Any:
    for parameter in command.params:
        if name in (*parameter.opts, *parameter.secondary_opts):
            return parameter
    if name == "--help":
        return _HelpOption()
    return None


class _HelpOption:
    is_flag = True
    nargs = 0


def _command_mentions(text: str) -> Iterator[list[str]]:
    for code in _code_texts(text):
        for match in COMPACTD_MENTION.finditer(code):
            tokens = match.group(1).split()
            if any("=" in token and not token.startswith("-") for token in tokens):
                continue  # a line compactd prints (``compactd ready broker=…``), not a command
            yield tokens


def test_every_command_is_in_the_docs_and_every_command_they_show_exists() -> None:
    mentioned: set[str] = set()
    problems: list[str] = []
    for name, text in _docs().items():
        for tokens in _command_mentions(text):
            path, problem = _resolve(tokens)
            mentioned.add(path)
            if problem is not None:
                problems.append(f"{name} shows `compactd {' '.join(tokens)}`, but `compactd {path}` {problem}")
    problems += [f"the docs do not mention the command `compactd {path}`"
                 for path in sorted(set(gen_docs.command_paths()) - mentioned)]
    assert problems == [], _report(problems)


# -- routes -----------------------------------------------------------------------------------


def _served(method: str, path: str, routes: set[tuple[str, str]]) -> bool:
    for route_method, template in routes:
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        if route_method == method and re.fullmatch(pattern, path.split("?")[0].rstrip("/") or "/"):
            return True
    return False


def _route_mentions(text: str) -> Iterator[tuple[str, str]]:
    for code in _code_texts(text):
        for match in ROUTE_MENTION.finditer(code):
            if "…" not in match.group(2):
                yield match.group(1), match.group(2)
        for match in CURL.finditer(code):
            method = re.search(r"-X\s*([A-Z]+)", match.group(1))
            yield (method.group(1) if method else "GET"), match.group(2)


def test_every_route_is_in_the_docs_and_every_route_they_show_exists() -> None:
    app = create_app()
    routes = set(gen_docs.routes())
    builtin = {("GET", route.path) for route in app.routes  # /docs, /redoc, /openapi.json: outside the schema
               if not getattr(route, "include_in_schema", True) and "GET" in (getattr(route, "methods", None) or ())}
    mentions = {(name, *mention) for name, text in _docs().items() for mention in _route_mentions(text)}
    problems = [f"the docs do not mention `{method} {path}`"
                for method, path in sorted(routes - {(method, path) for _, method, path in mentions})]
    problems += [f"{name} shows `{method} {path}`, which compactd does not serve"
                 for name, method, path in sorted(mentions) if not _served(method, path, routes | builtin)]
    assert problems == [], _report(problems)


def test_the_generated_parts_of_the_docs_are_up_to_date() -> None:
    stale = [f"{path.relative_to(gen_docs.ROOT)} differs from what the code generates (a help text, a default "
             "or an entry changed)" for path, text in gen_docs.expected_files()
             if path.read_text(encoding="utf-8") != text]
    assert stale == [], _report(stale)
