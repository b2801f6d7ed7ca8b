"""``compactd tokens``: keys and tokens, as ``pulsar tokens`` makes them.

* ``create-secret-key --output F [--base64]``: a fresh HS256 secret key (raw bytes);
* ``create-key-pair --output-private-key F --output-public-key G [--algorithm RS256|ES256]``:
  a fresh key pair (DER);
* ``create --secret-key URL | --private-key URL --subject ROLE [--expiry-time 1h]``: a token,
  printed alone on the last line of stdout.

Key files are written owner-only (0600). Key URLs are ``file:///PATH`` or ``data:...``; a
bare path is taken as a file. Failures print one line ``compactd: <message>`` and exit 1
(a bad value: 2), never a traceback, and never the key.
"""

from __future__ import annotations

import base64
import os
from typing import Annotated, NoReturn

import typer

from api.auth.tokens import (
    KEY_PAIR_ALGORITHMS,
    create_key_pair,
    create_secret_key,
    create_token,
    parse_duration,
    write_owner_only,
)
from ledger.errors import CompactionServiceError

__all__ = ["app"]

EXIT_FAILURE = 1

app = typer.Typer(name="tokens", no_args_is_help=True, add_completion=False,
                  help="Create token keys and tokens (like pulsar tokens).")


def _fail(message: str) -> NoReturn:
    typer.echo(f"compactd: {message}", err=True)
    raise typer.Exit(EXIT_FAILURE)


def _key_url(text: str | None) -> str | None:
    """``text`` as a key URL: a bare path becomes ``file://`` + its absolute path."""
    if text is None or text.startswith(("file://", "data:")):
        return text
    return "file://" + os.path.abspath(text)


def _write(path: str, data: bytes) -> None:
    try:
        write_owner_only(path, data)
    except OSError as error:
        _fail(f"cannot write {path}: {error.strerror or error}")


@app.command("create-secret-key")
def create_secret_key_command(
    output: Annotated[str, typer.Option("--output", "-o", metavar="FILE", help="File to write the key to.")],
    base64_: Annotated[bool, typer.Option("--base64", help="Write the key base64-encoded.")] = False,
) -> None:
    """Write a fresh HS256 secret key (32 random bytes) to FILE, owner-only."""
    key = create_secret_key()
    _write(output, base64.b64encode(key) if base64_ else key)


@app.command("create-key-pair")
def create_key_pair_command(
    output_private_key: Annotated[str, typer.Option("--output-private-key", metavar="FILE",
                                                    help="File to write the private key to (DER).")],
    output_public_key: Annotated[str, typer.Option("--output-public-key", metavar="FILE",
                                                   help="File to write the public key to (DER).")],
    algorithm: Annotated[str, typer.Option("--algorithm", "-a", metavar="|".join(KEY_PAIR_ALGORITHMS),
                                           help="Signature algorithm.")] = "RS256",
) -> None:
    """Write a fresh key pair: the private key signs tokens, the public key verifies them."""
    if algorithm not in KEY_PAIR_ALGORITHMS:
        raise typer.BadParameter(f"{algorithm!r} is not one of {', '.join(KEY_PAIR_ALGORITHMS)}",
                                 param_hint="'--algorithm'")
    private, public = create_key_pair(algorithm)
    _write(output_private_key, private)
    _write(output_public_key, public)


@app.command("create")
def create_command(
    subject: Annotated[str, typer.Option("--subject", "-s", metavar="ROLE", help="The token's role (sub).")],
    secret_key: Annotated[str | None, typer.Option("--secret-key", metavar="URL",
                                                   help="HS256 secret key: file:///PATH or data:...")] = None,
    private_key: Annotated[str | None, typer.Option("--private-key", metavar="URL",
                                                    help="RS256/ES256 private key: file:///PATH or data:...")] = None,
    expiry_time: Annotated[str | None, typer.Option("--expiry-time", "-e", metavar="TIME",
                                                    help="Lifetime: 30s, 5m, 1h, 2d, 1w, 1y.")] = None,
) -> None:
    """Print a token for ROLE on the last line of stdout."""
    if (secret_key is None) == (private_key is None):
        raise typer.BadParameter("give exactly one of --secret-key and --private-key", param_hint="'--secret-key'")
    if not subject:
        raise typer.BadParameter("the subject is empty", param_hint="'--subject'")
    expiry_s = None
    if expiry_time is not None:
        try:
            expiry_s = parse_duration(expiry_time)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="'--expiry-time'") from None
    try:
        token = create_token(subject, secret_key_url=_key_url(secret_key), private_key_url=_key_url(private_key),
                             expiry_s=expiry_s)
    except CompactionServiceError as error:
        _fail(str(error))
    typer.echo(token)
