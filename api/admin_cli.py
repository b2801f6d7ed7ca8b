"""``compactd admin``: the admin REST API from the command line, as ``pulsar-admin`` does it.

Every verb is one HTTP request (``compaction-status -w``: a bounded series of them) to the
admin REST API of INTERFACES §3, made with httpx::

    compactd admin [--admin-url URL] [--auth-token TOKEN] topics|namespaces VERB [OPTIONS] NAME

Names follow Pulsar's rules: a topic ``t`` is ``persistent://public/default/t``, a topic
``tenant/namespace/t`` is ``persistent://tenant/namespace/t``; a namespace is
``tenant/namespace``. Sizes are bytes, or a number with a ``K``, ``M``, ``G`` or ``T``
suffix (1024-based, as ``pulsar-admin``); durations are milliseconds, or a number with an
``ms``, ``s``, ``m``, ``h``, ``d``, ``w`` or ``y`` suffix. A value that does not parse is a
usage error (exit 2) naming the value.

Output: JSON documents on stdout (pretty-printed by rich on a terminal, plain JSON
otherwise), topic lists one name a line; verbs that change state print nothing, like
``pulsar-admin``. Failures print one line to stderr and exit 1, never a traceback:
``error: <reason> (HTTP <code>)`` for an error answer, a line naming the URL when the
API cannot be reached.

The pure parts (``parse_size``, ``parse_duration_ms``, ``parse_ratio``, ``topic_path``,
``namespace_path``) raise ``ValueError`` naming the bad value; the command layer turns
that into typer's ``BadParameter``.

This module deliberately has no ``from __future__ import annotations``: the verbs that are
one request on their argument's path (``_add_request_verb``) and the policy verbs are built
by factories, and typer reads their annotations as live objects.
"""

import json
import logging
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn, TypeVar

import httpx
import typer
from rich.console import Console
from typer.core import TyperGroup

__all__ = [
    "ADMIN_URL_ENV",
    "AUTH_TOKEN_ENV",
    "DEFAULT_ADMIN_URL",
    "AdminClient",
    "AdminError",
    "PolicySpec",
    "app",
    "hoist_admin_options",
    "namespace_path",
    "parse_duration_ms",
    "parse_ratio",
    "parse_size",
    "topic_path",
]

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
ADMIN_URL_ENV = "COMPACTD_ADMIN_URL"
AUTH_TOKEN_ENV = "COMPACTD_AUTH_TOKEN"
EXIT_FAILURE = 1
# One admin request answers in milliseconds; one that takes this long is a stuck broker.
REQUEST_TIMEOUT_S = 30.0
# ``compaction-status -w``: pulsar-admin polls every second and waits without a bound;
# we bound the wait (a run over a large topic takes minutes, not hours) and say so.
WAIT_TIMEOUT_S_DEFAULT = 600.0
POLL_INTERVAL_S_DEFAULT = 1.0

_PART = re.compile(r"^[A-Za-z0-9_.=:\-]+$")  # Pulsar's allowed characters for each part
_SIZE = re.compile(r"^(\d+)([kKmMgGtT]?)$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w|y)?$")
_DURATION_MS = {
    "": 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
    "w": 7 * 86_400_000, "y": 365 * 86_400_000,
}


# -- the pure parts --------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Bytes of ``text``: ``1048576``, ``100M``, ``2g`` (1024-based suffixes K, M, G, T)."""
    return _scaled(text, _SIZE, _SIZE_UNITS, "size", "a number of bytes, or a number with a K, M, G or T "
                   "suffix (e.g. 100M); negative sizes are not allowed")


def parse_duration_ms(text: str) -> int:
    """Milliseconds of ``text``: ``5000`` (ms), ``30s``, ``10m``, ``1h``, ``7d``, ``2w``, ``1y``."""
    return _scaled(text, _DURATION, _DURATION_MS, "duration", "milliseconds, or a number with an ms, s, m, "
                   "h, d, w or y suffix (e.g. 1h); negative durations are not allowed")


def _scaled(text: str, pattern: re.Pattern[str], units: dict[str, int], what: str, expected: str) -> int:
    """``text``'s whole number times the unit of its suffix (``units`` by the lower-case
    suffix, ``""`` for none); ``ValueError`` naming ``what``, ``text`` and ``expected`` when
    ``pattern`` does not match it."""
    match = pattern.match(text.strip())
    if match is None:
        raise ValueError(f"invalid {what} {text!r}: expected {expected}")
    return int(match.group(1)) * units[(match.group(2) or "").lower()]


def parse_ratio(text: str) -> float:
    """A ratio between 0 and 1 inclusive: ``0.5``."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"invalid ratio {text!r}: expected a number between 0 and 1") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise ValueError(f"invalid ratio {text!r}: expected a number between 0 and 1")
    return value


def topic_path(text: str) -> str:
    """The REST path of topic ``text``: ``t`` → ``/admin/v2/persistent/public/default/t``."""
    name = text.strip()
    if "://" not in name:
        name = f"persistent://{name}" if name.count("/") == 2 else f"persistent://public/default/{name}"
    domain, _, rest = name.partition("://")
    if domain != "persistent":
        raise ValueError(f"invalid topic name {text!r}: only persistent:// topics exist in compactd")
    parts = rest.split("/")
    if len(parts) != 3 or not all(_PART.match(part) for part in parts):
        raise ValueError(f"invalid topic name {text!r}: expected persistent://tenant/namespace/topic")
    return "/admin/v2/persistent/" + "/".join(parts)


def namespace_path(text: str) -> str:
    """The REST path of namespace ``tenant/namespace``: ``/admin/v2/namespaces/tenant/namespace``."""
    parts = text.strip().split("/")
    if len(parts) != 2 or not all(_PART.match(part) for part in parts):
        raise ValueError(f"invalid namespace {text!r}: expected tenant/namespace")
    return "/admin/v2/namespaces/" + "/".join(parts)


def namespace_topics_path(text: str) -> str:
    """The REST path listing the topics of namespace ``tenant/namespace``."""
    return "/admin/v2/persistent/" + namespace_path(text).removeprefix("/admin/v2/namespaces/")


# -- HTTP ------------------------------------------------------------------------------


class AdminError(Exception):
    """A request that failed: ``message`` is the one line to print, ``status`` the HTTP code."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AdminClient:
    """The admin REST API at ``url``; every method raises ``AdminError`` on failure."""

    def __init__(self, url: str, *, token: str | None = None,
                 transport: httpx.BaseTransport | None = None,
                 verify: ssl.SSLContext | bool = True) -> None:
        self.url = url.rstrip("/")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=REQUEST_TIMEOUT_S,
                                  transport=transport, verify=verify)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, body: object = None, has_body: bool = False) -> Any:
        """Send one request; the decoded JSON answer, or None for an empty one (204)."""
        response = self.response(method, path, body=body, has_body=has_body)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def response(self, method: str, path: str, *, body: object = None, has_body: bool = False) -> httpx.Response:
        """Send one request; its successful answer as it came (peek reads headers and bytes)."""
        content = json.dumps(body).encode() if has_body else None
        headers = {"Content-Type": "application/json"} if has_body else None
        try:
            response = self._http.request(method, path, content=content, headers=headers)
        except httpx.ConnectError as error:
            raise AdminError(f"cannot reach the admin API at {self.url}: {_cause(error)}") from None
        except httpx.TimeoutException:
            raise AdminError(
                f"the admin API at {self.url} did not answer within {REQUEST_TIMEOUT_S:g} s") from None
        except httpx.HTTPError as error:
            raise AdminError(f"request to the admin API at {self.url} failed: {_cause(error)}") from None
        if response.status_code >= 400:
            raise AdminError(f"{_reason(response)} (HTTP {response.status_code})",
                             status=response.status_code)
        return response


def _cause(error: Exception) -> str:
    text = str(error)
    if "refused" in text.lower() or "Errno 111" in text:
        return "connection refused (is compactd serve running?)"
    return text or type(error).__name__


def _reason(response: httpx.Response) -> str:
    """Pulsar's error body ``{"reason": …}``; FastAPI's ``{"detail": …}``; else the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict):
        for field in ("reason", "detail"):
            if field in body:
                value = body[field]
                return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(body)


# -- output ----------------------------------------------------------------------------


def _print_json(value: object) -> None:
    console = Console()
    if console.is_terminal:
        console.print_json(json.dumps(value))
    else:
        typer.echo(json.dumps(value, indent=2))


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_FAILURE)


def _client(ctx: typer.Context) -> AdminClient:
    client = ctx.find_object(AdminClient)
    assert client is not None, "the admin callback sets the client"
    return client


def _call(ctx: typer.Context, method: str, path: str, **body: Any) -> Any:
    try:
        return _client(ctx).request(method, path, **body)
    except AdminError as error:
        _fail(str(error))


_Parsed = TypeVar("_Parsed")


def _parsed(parse: Callable[[str], _Parsed], text: str, hint: str) -> _Parsed:
    try:
        return parse(text)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=hint) from None


def _topic(text: str) -> str:
    return _parsed(topic_path, text, "'TOPIC'")


def _namespace(text: str) -> str:
    return _parsed(namespace_path, text, "'NAMESPACE'")


# -- the commands ------------------------------------------------------------------------

# The admin group's own options, also accepted after the sub-command
# (``compactd admin topics stats T --admin-url URL``): moved in front before parsing.
_HOISTED_OPTIONS = ("--admin-url", "--auth-token")


def hoist_admin_options(args: list[str]) -> list[str]:
    """``args`` with every ``--admin-url``/``--auth-token`` (and its value) moved to the
    front, in order; nothing after ``--`` moves."""
    front: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            rest.extend(args[index:])
            break
        if arg in _HOISTED_OPTIONS and index + 1 < len(args):
            front.extend(args[index:index + 2])
            index += 2
            continue
        (front if arg.startswith(tuple(f"{o}=" for o in _HOISTED_OPTIONS)) else rest).append(arg)
        index += 1
    return front + rest


class _AdminGroup(TyperGroup):
    """The ``admin`` group: its options may also come after the sub-command."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own copy of click.Context
        return super().parse_args(ctx, hoist_admin_options(args))


app = typer.Typer(name="admin", no_args_is_help=True, add_completion=False, cls=_AdminGroup,
                  help="Administer a running compactd through its REST API (like pulsar-admin).")
topics = typer.Typer(name="topics", no_args_is_help=True, help="Operations on topics.")
namespaces = typer.Typer(name="namespaces", no_args_is_help=True, help="Operations on namespaces.")
app.add_typer(topics)
app.add_typer(namespaces)

_TARGETS = {
    "topic": ("TOPIC", "persistent://tenant/namespace/topic, or its short form."),
    "namespace": ("NAMESPACE", "tenant/namespace, e.g. public/default."),
    "tenant": ("TENANT", "A tenant name, e.g. public."),
}


def _target_argument(scope: str) -> Any:
    """The TOPIC, NAMESPACE or TENANT argument (``scope`` topic, namespace, tenant) of a verb."""
    metavar, help_text = _TARGETS[scope]
    return typer.Argument(..., metavar=metavar, help=help_text)


def _add_request_verb(group: typer.Typer, verb: str, method: str, scope: str, to_path: Callable[[str], str],
                      suffix: str = "", *, printed: bool = False, help_text: str) -> None:
    """``verb`` on ``group``: one ``method`` request to the path of its ``scope`` argument
    (``to_path``) followed by ``suffix``, printing the JSON answer when ``printed``."""
    argument = _target_argument(scope)

    def request(ctx: typer.Context, target: str = argument) -> None:
        answer = _call(ctx, method, to_path(target) + suffix)
        if printed:
            _print_json(answer)

    group.command(verb, help=help_text)(request)


Topic = Annotated[str, _target_argument("topic")]
Namespace = Annotated[str, _target_argument("namespace")]


@app.callback()
def _admin(
    ctx: typer.Context,
    admin_url: Annotated[str, typer.Option(
        "--admin-url", envvar=ADMIN_URL_ENV, metavar="URL",
        help="Base URL of the admin REST API.")] = DEFAULT_ADMIN_URL,
    auth_token: Annotated[str | None, typer.Option(
        "--auth-token", envvar=AUTH_TOKEN_ENV, metavar="TOKEN", show_default=False,
        help="Token sent as 'Authorization: Bearer TOKEN'.")] = None,
    tls_trust_cert_path: Annotated[str | None, typer.Option(
        "--tls-trust-cert-path", metavar="PATH", show_default=False,
        help="CA certificates (PEM) that an https:// admin URL's certificate is checked against.")] = None,
) -> None:
    """Administer a running compactd through its REST API (like pulsar-admin)."""
    # ``compactd`` logs at INFO to stderr; httpx would log every request there.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Tests hand an httpx transport in as ``obj``; users never do.
    transport = ctx.obj if isinstance(ctx.obj, httpx.BaseTransport) else None
    verify: ssl.SSLContext | bool = True
    if tls_trust_cert_path is not None:
        try:
            verify = ssl.create_default_context(cafile=tls_trust_cert_path)
        except (OSError, ssl.SSLError) as error:
            raise typer.BadParameter(f"cannot load {tls_trust_cert_path}: {error}",
                                     param_hint="'--tls-trust-cert-path'") from None
    client = AdminClient(admin_url, token=auth_token, transport=transport, verify=verify)
    ctx.call_on_close(client.close)
    ctx.obj = client


_add_request_verb(topics, "create", "PUT", "topic", _topic, help_text="Create a topic (HTTP 409 when it exists).")
_add_request_verb(topics, "delete", "DELETE", "topic", _topic,
                  help_text="Delete a topic, its ledgers and its compacted ledger.")


@topics.command("list")
def list_topics(ctx: typer.Context, namespace: Namespace) -> None:
    """List the topics of a namespace, one a line."""
    path: str = _parsed(namespace_topics_path, namespace, "'NAMESPACE'")
    for name in _call(ctx, "GET", path) or []:
        typer.echo(name)


_add_request_verb(topics, "stats", "GET", "topic", _topic, "/stats", printed=True,
                  help_text="Print the topic's stats (with its compaction section).")
_add_request_verb(topics, "stats-internal", "GET", "topic", _topic, "/internalStats", printed=True,
                  help_text="Print the topic's internal stats (ledgers, cursors, compacted ledger).")


@topics.command("compact")
def compact(ctx: typer.Context, topic: Topic) -> None:
    """Start a compaction of the topic (HTTP 409 when one is running)."""
    path = _topic(topic)
    _call(ctx, "PUT", f"{path}/compaction")
    typer.echo(f"Topic compaction requested for {_full_name(path)}")


def _add_status_verb(verb: str, process: str, help_text: str, *, ends: str) -> None:
    """``verb`` on ``topics``: print the status of the topic's ``process`` (``compaction``,
    at ``<topic>/compaction``), ``-w`` waiting until the ``ends`` ends (``_print_process_status``)."""

    def status(
        ctx: typer.Context,
        topic: Topic,
        wait: bool = typer.Option(False, "--wait-complete", "-w", help=f"Wait until the {ends} ends."),
        wait_timeout_s: float = typer.Option(WAIT_TIMEOUT_S_DEFAULT, "--wait-timeout", metavar="SECONDS", min=0.0,
                                             help="With -w: give up (exit 1) after this long."),
        poll_interval_s: float = typer.Option(POLL_INTERVAL_S_DEFAULT, "--poll-interval", metavar="SECONDS",
                                              min=0.01, help="With -w: time between two status requests."),
    ) -> None:
        _print_process_status(ctx, _topic(topic), process, wait=wait, wait_timeout_s=wait_timeout_s,
                              poll_interval_s=poll_interval_s)

    topics.command(verb, help=help_text)(status)


_add_status_verb("compaction-status", "compaction", "Print the status of the topic's compaction; exit 1 when it is ERROR.",
                 ends="run")


def _print_process_status(ctx: typer.Context, topic_path: str, process: str, *, wait: bool, wait_timeout_s: float,
                          poll_interval_s: float) -> None:
    """Print the status (Pulsar's ``LongRunningProcessStatus``) of the topic's ``process``
    at ``<topic_path>/<process>``; with ``wait``, once it is no longer RUNNING, asking every
    ``poll_interval_s`` (exit 1 after ``wait_timeout_s``). Exit 1 when it is ERROR."""
    path = f"{topic_path}/{process}"
    status = _call(ctx, "GET", path)
    deadline = time.monotonic() + wait_timeout_s
    while wait and _status_word(status) == "RUNNING":
        if time.monotonic() >= deadline:
            _print_json(status)
            _fail(f"{process} of {_full_name(topic_path)} still RUNNING after {wait_timeout_s:g} s")
        time.sleep(min(poll_interval_s, max(0.0, deadline - time.monotonic())))
        status = _call(ctx, "GET", path)
    _print_json(status)
    if _status_word(status) == "ERROR":
        last_error = status.get("lastError") if isinstance(status, dict) else None
        _fail(f"{process} failed: {last_error or 'no error given'}")


@topics.command("delete-subscription")
def delete_subscription(
    ctx: typer.Context,
    topic: Topic,
    subscription: Annotated[str, typer.Option("--subscription", "-s", metavar="NAME",
                                              help="The subscription to delete.")],
) -> None:
    """Delete a subscription; deleting __compaction drops the compacted view."""
    if not subscription:
        raise typer.BadParameter("the subscription name is empty", param_hint="'--subscription'")
    quoted = httpx.URL(f"/{subscription}").raw_path.decode("ascii").lstrip("/")
    _call(ctx, "DELETE", f"{_topic(topic)}/subscription/{quoted}")


def _status_word(status: object) -> str | None:
    return status.get("status") if isinstance(status, dict) else None


def _full_name(path: str) -> str:
    return "persistent://" + path.removeprefix("/admin/v2/persistent/")


# -- policies, on topics and on namespaces --------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One policy: its verb suffix, its REST name, its value option and how it parses."""

    verb: str  # compaction-threshold: set-compaction-threshold, get-…, remove-…
    name: str  # compactionThreshold: the REST path's last part
    flag: str  # --threshold
    metavar: str
    what: str  # the help text's description of the value
    parse: Callable[[str], object]


POLICIES = (
    PolicySpec("compaction-threshold", "compactionThreshold", "--threshold", "SIZE",
               "backlog size that triggers a compaction (bytes, or 100M, 1G: 1024-based)", parse_size),
    PolicySpec("min-cleanable-dirty-ratio", "minCleanableDirtyRatio", "--ratio", "RATIO",
               "share of the topic not yet compacted that triggers a compaction (0 to 1)", parse_ratio),
    PolicySpec("max-compaction-lag", "maxCompactionLagMs", "--lag", "DURATION",
               "longest time a message stays uncompacted (ms, or 30s, 10m, 1h, 7d)", parse_duration_ms),
    PolicySpec("delete-retention", "deleteRetentionMs", "--retention", "DURATION",
               "time a tombstone stays in the compacted view (ms, or 1h, 1d)", parse_duration_ms),
    PolicySpec("min-compaction-lag", "minCompactionLagMs", "--lag", "DURATION",
               "shortest time a message stays uncompacted (ms, or 30s, 10m, 1h, 7d)", parse_duration_ms),
    PolicySpec("compaction-max-bytes-per-second", "compactionMaxBytesPerSecond", "--rate", "SIZE",
               "I/O limit of each compaction run (bytes a second, or 10M; 0 = unlimited)", parse_size),
)


def _add_get_remove_verbs(group: typer.Typer, verb: str, name: str, scope: str,
                          to_path: Callable[[str], str]) -> None:
    """``get-<verb>`` (prints policy ``name``, null when unset) and ``remove-<verb>`` on ``group``."""
    _add_request_verb(group, f"get-{verb}", "GET", scope, to_path, f"/{name}", printed=True,
                      help_text=f"Print the {scope}'s {name} (null when unset).")
    _add_request_verb(group, f"remove-{verb}", "DELETE", scope, to_path, f"/{name}",
                      help_text=f"Remove the {scope}'s {name}.")


def _add_policy_verbs(group: typer.Typer, spec: PolicySpec, scope: str, to_path: Callable[[str], str]) -> None:
    """``set-``, ``get-`` and ``remove-`` ``spec.verb`` on ``group`` (topics or namespaces)."""
    argument = _target_argument(scope)

    def set_policy(
        ctx: typer.Context,
        target: str = argument,
        value: str = typer.Option(..., spec.flag, metavar=spec.metavar, help=f"The {spec.what}."),
    ) -> None:
        parsed = _parsed(spec.parse, value, f"'{spec.flag}'")
        _call(ctx, "POST", f"{to_path(target)}/{spec.name}", body=parsed, has_body=True)

    group.command(f"set-{spec.verb}", help=f"Set the {scope}'s {spec.name}: the {spec.what}.")(set_policy)
    _add_get_remove_verbs(group, spec.verb, spec.name, scope, to_path)


def _add_deduplication_verbs(group: typer.Typer, scope: str, to_path: Callable[[str], str]) -> None:
    """``set-deduplication --enable|--disable``, ``get-deduplication`` and
    ``remove-deduplication`` on ``group``, as ``pulsar-admin`` names them."""
    argument = _target_argument(scope)

    def set_deduplication(
        ctx: typer.Context,
        target: str = argument,
        enable: bool = typer.Option(False, "--enable", "-e", help="Turn de-duplication on."),
        disable: bool = typer.Option(False, "--disable", "-d", help="Turn de-duplication off."),
    ) -> None:
        if enable == disable:
            raise typer.BadParameter("give exactly one of --enable and --disable", param_hint="'--enable'")
        _call(ctx, "POST", f"{to_path(target)}/deduplicationEnabled", body=enable, has_body=True)

    group.command("set-deduplication", help=f"Turn the {scope}'s message de-duplication on or off.")(
        set_deduplication)
    _add_get_remove_verbs(group, "deduplication", "deduplicationEnabled", scope, to_path)


def _add_permission_verbs(group: typer.Typer, scope: str, to_path: Callable[[str], str]) -> None:
    """``grant-permission``, ``revoke-permission`` and ``permissions`` of a topic or namespace."""
    argument = _target_argument(scope)

    def grant_permission(
        ctx: typer.Context,
        target: str = argument,
        role: str = typer.Option(..., "--role", metavar="ROLE", help="The role to grant to."),
        actions: str = typer.Option(..., "--actions", metavar="produce,consume", help="Actions, comma-separated."),
    ) -> None:
        chosen = [action.strip() for action in actions.split(",") if action.strip()]
        _call(ctx, "POST", f"{to_path(target)}/permissions/{role}", body=chosen, has_body=True)

    def revoke_permission(
        ctx: typer.Context,
        target: str = argument,
        role: str = typer.Option(..., "--role", metavar="ROLE", help="The role to revoke from."),
    ) -> None:
        _call(ctx, "DELETE", f"{to_path(target)}/permissions/{role}")

    def permissions(ctx: typer.Context, target: str = argument) -> None:
        _print_json(_call(ctx, "GET", f"{to_path(target)}/permissions"))

    group.command("grant-permission", help=f"Grant a role actions (produce, consume) on the {scope}.")(
        grant_permission)
    group.command("revoke-permission", help=f"Revoke a role's actions on the {scope}.")(revoke_permission)
    group.command("permissions", help=f"Print the roles granted actions on the {scope}.")(permissions)


for _spec in POLICIES:
    _add_policy_verbs(topics, _spec, "topic", _topic)
    _add_policy_verbs(namespaces, _spec, "namespace", _namespace)
_add_deduplication_verbs(topics, "topic", _topic)
_add_deduplication_verbs(namespaces, "namespace", _namespace)
_add_permission_verbs(topics, "topic", _topic)
_add_permission_verbs(namespaces, "namespace", _namespace)
