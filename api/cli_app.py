"""The ``compactd`` command tree (typer): ``serve``, ``admin``, ``tokens``, ``compact-topic``,
``backup``, ``restore``; ``api.cli`` is its light entry point.

``compactd serve`` has one flag per setting of ``api.config.Settings`` (INTERFACES §1 and
§4) plus ``--config FILE`` (or ``COMPACTD_CONFIG``), a TOML file of settings. The flags
are not declared here: ``serve``'s signature is built from ``api.config.setting_specs()``
(flag, help, metavar, default shown), so a setting is declared once, in ``Settings``, and
typer reads that signature as it reads any function's. Every flag defaults to ``None``:
only the flags the user actually passed are handed to ``load_settings``, which fills the
rest from the environment, the config file and the defaults, in that order. ``serve`` then runs ``api.server.run`` and exits with its code.

Expected failures print one line ``compactd: <message>`` to stderr, never a traceback:
bad settings exit 2 (like a usage error), a locked data dir or a port in use exit 1.
"""

from __future__ import annotations

import inspect
import os
from typing import Annotated, NoReturn

import typer

from api import (  # noqa: F401 - admin_cli_schemas, admin_cli_topics register their verbs
    admin_cli,
    admin_cli_offload,
    admin_cli_schemas,
    admin_cli_tenants,
    admin_cli_topics,
    backup_cli,
    offline,
)
from api.auth import tokens_cli
from api.cli_help import PlainHelpCommand
from api.config import (
    CONFIG_ENV,
    ConfigError,
    SettingSpec,
    flag_name,
    require_supported,
    setting_specs,
    settings_from_command_line,
)
from ledger.errors import CompactionServiceError

__all__ = ["CONFIG_ENV", "app", "settings_from_command_line"]

EXIT_FAILURE = 1
EXIT_BAD_SETTINGS = 2  # what click uses for a usage error

app = typer.Typer(
    name="compactd",
    help="compactd: a Pulsar-compatible broker whose reason to exist is topic compaction.",
    no_args_is_help=True,
    add_completion=False,
)


def _setting_option(spec: SettingSpec) -> inspect.Parameter:
    """``serve``'s parameter of one setting: named as its key, its flag ``flag_name(key)``
    (a boolean's with its ``--no-`` form), its help the setting's, ending with the default.

    Every flag defaults to ``None`` (not given). Numbers are taken as text and parsed by
    ``load_settings``, like the environment's, so that a bad value gets the same message
    (``--broker-port: 'abc' is not an integer``) everywhere.
    """
    flag = flag_name(spec.key)
    if spec.kind is bool:
        flag = f"{flag}/--no-{flag.removeprefix('--')}"
    option = typer.Option(flag, metavar=spec.metavar, show_default=False,  # plain help: no markup
                          help=f"{spec.help} Default: {_shown(spec.default)}.")
    value = bool | None if spec.kind is bool else str | None
    return inspect.Parameter(spec.key, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[value, option])


def _shown(default: object) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, tuple):
        default = ",".join(default)
    return "none" if default in (None, "") else str(default)


_CONFIG_HELP = f"TOML file of settings, keys as the flags with underscores. Env: {CONFIG_ENV}."
_CONFIG_OPTION = inspect.Parameter(
    "config", inspect.Parameter.KEYWORD_ONLY, default=None,
    annotation=Annotated[str | None, typer.Option("--config", metavar="FILE", show_default=False, help=_CONFIG_HELP)])


@app.callback()
def _root() -> None:
    """compactd: a Pulsar-compatible broker whose reason to exist is topic compaction."""


assert admin_cli_tenants.tenants  # its verbs register on admin_cli's groups when it is imported
app.add_typer(admin_cli.app, name="admin")
app.add_typer(tokens_cli.app, name="tokens")
app.command("compact-topic")(offline.compact_topic_command)
app.command("backup")(backup_cli.backup_command)
app.command("restore")(backup_cli.restore_command)


def serve(ctx: typer.Context, **flags: str | bool | None) -> None:
    """Run the broker: Pulsar protocol, admin REST API and compaction, on the data dir.

    Every flag also comes from the environment (--broker-port: COMPACTD_BROKER_PORT) or the
    --config file (broker_port = 6650); a flag wins over the environment, which wins over
    the file. Prints "compactd ready broker=pulsar://HOST:PORT http=http://HOST:PORT" once
    both listeners accept connections; stops cleanly on SIGTERM or SIGINT.
    """
    try:
        settings = settings_from_command_line(_passed(ctx), os.environ)
        require_supported(settings)  # before anything is loaded or opened
        from api import server  # here: the other commands need not load the broker

        code = server.run(settings)
    except ConfigError as error:
        _fail(error, EXIT_BAD_SETTINGS)
    except CompactionServiceError as error:
        _fail(error, EXIT_FAILURE)
    raise typer.Exit(code)


# One parameter per setting, read off Settings (api.config), and --config: typer builds the
# command from this signature as from any function's; --help shows them in this order.
serve.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
    _CONFIG_OPTION, *(_setting_option(spec) for spec in setting_specs()),
])
app.command(cls=PlainHelpCommand)(serve)  # readable at 80 columns: flags in full, help wrapped at words


def _passed(ctx: typer.Context) -> dict[str, object]:
    """The parameters given on the command line, not those left at their default."""
    return {name: value for name, value in ctx.params.items()
            if _source_name(ctx, name) == "COMMANDLINE" and value is not None}


def _source_name(ctx: typer.Context, name: str) -> str | None:
    # Compared by name: typer carries its own copy of click's ParameterSource enum.
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name


def _fail(error: CompactionServiceError, code: int) -> NoReturn:
    typer.echo(f"compactd: {error}", err=True)
    raise typer.Exit(code)
