"""The ``compactd`` command line (typer).

``compactd serve`` opens the embedded default storage under ``--data-dir`` (taking the
data-dir lock) and keeps it open until SIGTERM or SIGINT, then syncs and closes it. The
Pulsar binary protocol and the admin REST listeners are not part of this build yet; until
they are, ``serve`` says so on its first line and does not print the ``compactd ready``
line that INTERFACES promises once both listeners accept connections.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Annotated

import typer

from ledger.data_dir import DataDir
from ledger.errors import CompactionServiceError

__all__ = ["app", "main"]

app = typer.Typer(
    name="compactd",
    help="compactd: a Pulsar-compatible broker whose reason to exist is topic compaction.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """compactd: a Pulsar-compatible broker whose reason to exist is topic compaction."""


@app.command()
def serve(
    data_dir: Annotated[
        str, typer.Option("--data-dir", envvar="COMPACTD_DATA_DIR", help="Ledger files and metadata.")
    ] = "./data",
) -> None:
    """Open the embedded storage under --data-dir and hold it until SIGTERM/SIGINT."""
    try:
        storage = DataDir.open(data_dir)
    except CompactionServiceError as error:
        typer.echo(f"compactd: {error}", err=True)
        raise typer.Exit(code=1) from None
    stop = threading.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signal_number, lambda *_: stop.set())
    print(
        f"compactd storage open data_dir={storage.path} "
        "(broker and REST listeners are not in this build yet)",
        flush=True,
    )
    try:
        stop.wait()
    finally:
        storage.close()


def main() -> None:
    """Console-script entry point."""
    app(prog_name=os.path.basename(sys.argv[0]) or "compactd")
