"""The settings of ``compactd serve``, read once at startup into one frozen ``Settings``.

Every setting has one key (``broker_port``), one flag (``--broker-port``) and one
environment variable (``COMPACTD_BROKER_PORT``); a TOML config file names it by its key.
It is declared once, as a ``Settings`` field (type, default, help, the flag's metavar,
bounds); ``compactd serve``'s flags are built from those declarations (``api.cli_app``).
``load_settings`` picks each value from the first source that has it::

    flag  >  environment  >  config file  >  default

and checks it where it was found, so an error names the flag, the variable or the config
file key that was wrong, and the value. It is a pure function of its three inputs: the
CLI reads ``os.environ`` and the file and passes them in (STYLE P1), tests pass dicts.
``settings_from_command_line`` is that reading, shared by ``compactd serve`` and
``compactd compact-topic``: the config file is the ``config`` flag, else ``COMPACTD_CONFIG``.

Flag values may already be typed (typer parsed them) or be strings; environment values
are strings (booleans: ``true/false``, ``1/0``, ``yes/no``, ``on/off``; role lists:
``a,b``; an empty value of an optional setting means none); config file values must have
the TOML type of the setting (an integer may stand for a number of seconds).

Authentication and TLS settings (INTERFACES §4) are checked here; ``api.auth`` serves them.

Every default is written once. A setting that a lower layer applies through its own
config (``ManagedLedgerConfig``, ``CompactionConfig``, ``WireLimits``, the ledger store's
open-file bound and sync policy) takes its default from that layer's definition, never a
second literal; the layer's config built from default ``Settings`` is then that layer's
default config (``tests/unit/api/test_config.py`` checks both). The one place that turns
``Settings`` into a layer's config sits beside the code that builds the layer:
``api.broker.service.compaction_config`` and ``ledger_config``,
``api.wire.listener.wire_limits``. Everything above the layers takes a typed ``Settings``
and reads its fields; nothing reads a setting by name with a fallback.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

from api.schema_names import SchemaStrategyName
from api.wire.frames import MESSAGE_BYTES_MAX
from api.wire.limits import WireLimits
from compactor.engine import EngineName
from compactor.runs.runner import CompactionConfig
from compactor.view.manifest import GRACE_PERIOD_S_DEFAULT
from cursor.store import MARK_DELETE_RATE_LIMIT
from ledger.errors import CompactionServiceError
from ledger.managed_ledger import ManagedLedgerConfig
from ledger.storage.base import SyncPolicy
from ledger.storage.file import MAX_OPEN_FILES_DEFAULT, READ_CACHE_BYTES_DEFAULT
from ledger.storage.object_fs import BucketConfig, BucketConfigError

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "ConfigError",
    "SettingSpec",
    "Settings",
    "env_name",
    "flag_name",
    "load_settings",
    "offload_bucket",
    "require_supported",
    "setting_specs",
    "settings_from_command_line",
]

ENV_PREFIX = "COMPACTD_"
CONFIG_ENV = "COMPACTD_CONFIG"  # names the TOML config file when no --config is passed
PORT_MAX = 65535
# Pulsar's token key settings are URLs: a file (``file:///PATH``) or inline (``data:``).
TOKEN_KEY_PREFIXES = ("file:///", "data:")
# Settings whose value may be a key itself (``data:``): an error never shows it.
SECRET_KEYS = frozenset({"token_secret_key", "token_public_key"})
BOOLEAN_WORDS = {
    "true": True, "1": True, "yes": True, "on": True,
    "false": False, "0": False, "no": False, "off": False,
}

FsyncPolicy = Literal["always", "group", "none"]  # the values of ledger.storage.base.SyncPolicy
LogFormat = Literal["text", "json"]  # api.logs: readable lines, or JSON lines
LogLevel = Literal["debug", "info", "warning", "error"]
SchemaStrategy = SchemaStrategyName  # Pulsar's SchemaCompatibilityStrategy names

# Offload (Pulsar's broker.conf defaults): automatic offload off; local copies kept 4 h.
OFFLOAD_THRESHOLD_OFF = -1
OFFLOAD_DELETION_LAG_MS_DEFAULT = 4 * 3_600_000
OFFLOAD_DRIVERS = ("aws-s3", "s3", "filesystem")  # ledger.storage.object_fs's names (s3: aws-s3)

# The default configs of the lower layers: the defaults of the settings they apply.
_LEDGER = ManagedLedgerConfig()
_COMPACTION = CompactionConfig()
_WIRE = WireLimits()


class ConfigError(CompactionServiceError):
    """A setting is missing, malformed, out of range, or asks for what this build lacks.

    ``key`` is the setting's key (``broker_port``) where one is to blame, ``value`` the
    value as it was given.
    """

    def __init__(self, message: str, *, key: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value


def _setting(default: Any, help: str, *, metavar: str | None = None, minimum: float | None = None,
             maximum: float | None = None, above: float | None = None) -> Any:
    """A ``Settings`` field: its default, its help line, the word its flag's value is shown
    as in ``--help`` (``--data-dir PATH``; none for a boolean, whose flag takes no value,
    and for a ``Literal``, whose choices are shown) and its bounds (inclusive, ``above``:
    exclusive)."""
    return field(default=default, metadata={
        "help": help, "metavar": metavar, "minimum": minimum, "maximum": maximum, "above": above,
    })


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``compactd serve`` is configured with; INTERFACES §1 and §4 name each key."""

    data_dir: str = _setting("./data", "Directory of the ledger files and the metadata database.", metavar="PATH")
    bind: str = _setting("127.0.0.1", "Address both listeners bind to.", metavar="ADDR")
    broker_port: int = _setting(6650, "Pulsar binary protocol port; 0 picks a free port.",
                                minimum=0, maximum=PORT_MAX, metavar="N")
    http_port: int = _setting(8080, "Admin REST port; 0 picks a free port.", minimum=0, maximum=PORT_MAX, metavar="N")
    advertised_address: str | None = _setting(
        None, "Host name or IP that lookups give clients (behind NAT, in a container); none: the "
        "address the client reached.", metavar="HOST")
    compaction_monitor_interval_seconds: float = _setting(
        60.0, "How often the scheduler checks compaction thresholds; 0 or less disables it.", metavar="N")
    compaction_threshold_bytes: int = _setting(
        0, "Broker-wide backlog size that triggers a compaction; 0 turns it off.", minimum=0, metavar="N")
    compaction_phase_one_loop_timeout_seconds: float = _setting(
        _COMPACTION.phase_one_read_timeout_s, "Limit on each phase-one read of a compaction run.", above=0, metavar="N")
    topic_compaction_retain_null_key: bool = _setting(
        _COMPACTION.retain_null_key, "Keep key-less messages in the compacted view.")
    # At least one: with none allowed every trigger would wait forever; the scheduler is
    # turned off with compaction_monitor_interval_seconds instead.
    compaction_max_concurrent_runs: int = _setting(
        2, "Compaction runs at once on this broker.", minimum=1, metavar="N")
    compaction_engine: EngineName = _setting(  # noqa: RUF009 - a str, immutable
        _COMPACTION.engine, "Engine of a compaction run: auto, local or spark.")
    spark_master: str = _setting(_COMPACTION.spark_master, "Spark master URL of the spark engine.", metavar="URL")
    compaction_worker_process: bool = _setting(
        True, "Run the local engine's compaction rounds in worker processes (one per concurrent run), off "
        "the broker's interpreter, so that a run never holds the broker's GIL.")
    compaction_key_index: bool = _setting(
        _COMPACTION.key_index, "Index each sealed ledger's keys in a background worker process (a .kidx file "
        "beside the ledger), and run compaction rounds over the indexes instead of parsing every message.")
    compaction_incremental: bool = _setting(
        _COMPACTION.incremental, "Compact only the backlog into a new ledger of the view and mark what it "
        "supersedes in the older ledgers dead, instead of rewriting the whole view each run.")
    compaction_merge_dead_ratio: float = _setting(
        _COMPACTION.merge_dead_ratio, "Rewrite a ledger of a compacted view once this share of its messages is "
        "dead (Kafka's min.cleanable.dirty.ratio).", minimum=0, maximum=1, metavar="RATIO")
    compaction_merge_fan_in: int = _setting(
        _COMPACTION.merge_fan_in, "Tiered merging of a compacted view's ledgers: at most this many less one "
        "per size tier (each tier this many times the one below).", minimum=2, metavar="N")
    compaction_memory_budget_bytes: int = _setting(
        _COMPACTION.memory_budget_bytes, "Most memory the local engine's key map may hold (24 bytes a key); past it a run "
        "compacts in rounds, each one published.", minimum=1, metavar="BYTES")
    compaction_min_lag_ms: int = _setting(
        0, "Broker default of the minCompactionLagMs policy: a run leaves every message published "
        "less than this long ago uncompacted; 0 holds nothing back.", minimum=0, metavar="MS")
    compaction_max_bytes_per_second: int = _setting(
        0, "Broker default of the compactionMaxBytesPerSecond policy: each compaction run's reads "
        "and writes are throttled to this; 0 is unlimited.", minimum=0, metavar="BYTES")
    compacted_ledger_grace_period_s: float = _setting(
        GRACE_PERIOD_S_DEFAULT, "Seconds a replaced compacted ledger is kept after a new view is published "
        "(a Spark scan or task retry reading the old view keeps its input); 0 deletes it at once.", minimum=0, metavar="SECONDS")
    broker_deduplication_enabled: bool = _setting(
        False, "De-duplicate producers' re-sends on every topic (namespace and topic policy "
        "deduplicationEnabled win over it).")
    schema_compatibility_strategy: SchemaStrategy = _setting(  # noqa: RUF009 - a str, immutable
        "FULL", "Schema compatibility strategy of topics whose namespace and topic set none "
        "(Pulsar's names: FULL, BACKWARD, FORWARD, their _TRANSITIVE forms, ALWAYS_COMPATIBLE, "
        "ALWAYS_INCOMPATIBLE, NONE).", metavar="STRATEGY")
    schema_max_size_bytes: int = _setting(
        MESSAGE_BYTES_MAX, "Largest schema definition, on both ports: Pulsar's default maxMessageSize, the most "
        "its binary port carries (Pulsar has no setting of its own for it).", minimum=1, metavar="BYTES")
    max_num_partitions_per_partitioned_topic: int = _setting(
        1024, "Most partitions a partitioned topic may have (its partitions are created at once).",
        minimum=1, metavar="N")
    cluster_name: str = _setting(
        "standalone", "Cluster name: the first part of producer names the broker assigns, and a "
        "metrics label.", metavar="NAME")
    log_format: LogFormat = _setting(  # noqa: RUF009 - a str, immutable
        "text", "Log lines on stderr: text (readable) or json (one JSON object a line).")
    log_level: LogLevel = _setting(  # noqa: RUF009 - a str, immutable
        "info", "Least severe log level written: debug, info, warning or error.")
    fsync: FsyncPolicy = _setting(  # noqa: RUF009 - a str, immutable
        SyncPolicy.GROUP.value, "When an append is durable: always (fsync each), group (group commit), "
        "none (tests and benchmarks only).")
    managed_ledger_max_entries_per_ledger: int = _setting(
        _LEDGER.max_entries_per_ledger, "A topic's ledger rolls over after this many entries.", minimum=1, metavar="N")
    managed_ledger_max_size_per_ledger_bytes: int = _setting(
        _LEDGER.max_size_per_ledger_bytes, "A topic's ledger rolls over after this many bytes.", minimum=1, metavar="N")
    managed_ledger_roll_over_retry_ms: int = _setting(
        _LEDGER.roll_over_retry_ms, "After a topic's roll-over failed (a full disk), its sends fail at once, "
        "and new producers are refused, for this long before the next try.", minimum=0, metavar="MS")
    managed_ledger_mark_delete_rate_limit: float = _setting(
        MARK_DELETE_RATE_LIMIT, "Times a second a subscription's acknowledgements are persisted, at most "
        "(in the background; an ack receipt is sent once applied, and a crash redelivers what was "
        "acknowledged in the last 1/rate s); 0 writes each acknowledgement at once and sends its ack "
        "receipt only once it is durable.", minimum=0, metavar="PER_S")
    # Far under the usual limit of 1,024 descriptors a process, which connections and SQLite share.
    max_open_ledger_files: int = _setting(
        MAX_OPEN_FILES_DEFAULT, "Ledger files kept open while idle; more are closed (least recently used first) "
        "and reopened on demand.", minimum=1, metavar="N")
    wire_connect_timeout_seconds: float = _setting(
        _WIRE.connect_timeout_s, "A Pulsar connection that has not sent CONNECT within this is closed.",
        above=0, metavar="N")
    wire_frame_timeout_seconds: float = _setting(
        _WIRE.frame_timeout_s, "A Pulsar connection whose frame stays incomplete this long is closed.",
        above=0, metavar="N")
    wire_partial_frames_budget_bytes: int = _setting(
        _WIRE.partial_frames_budget_bytes, "Bytes all Pulsar connections together may hold in incomplete frames; "
        "the connection that would go over is closed.", minimum=1, metavar="BYTES")
    http_max_request_body_bytes: int = _setting(
        1024 * 1024, "Largest admin REST request body; a larger one answers 413 before it is read.",
        minimum=1, metavar="BYTES")
    authentication_enabled: bool = _setting(
        False, "Require a token (or a trusted TLS client certificate) on both ports.")
    token_secret_key: str | None = _setting(
        None, "HS256 secret key of tokens, file:///PATH or data:;base64,DATA.", metavar="file:///PATH")
    token_public_key: str | None = _setting(
        None, "RS256 or ES256 public key of tokens (DER or PEM), file:///PATH or data:;base64,DATA.", metavar="file:///PATH")
    super_user_roles: tuple[str, ...] = _setting(
        (), "Roles (token sub) allowed admin operations, comma-separated.", metavar="a,b")
    tls_cert_file: str | None = _setting(None, "TLS certificate file (PEM); with --tls-key-file it opens the TLS ports.", metavar="PATH")
    tls_key_file: str | None = _setting(None, "TLS private key file (PEM).", metavar="PATH")
    broker_port_tls: int = _setting(6651, "pulsar+ssl:// port.", minimum=0, maximum=PORT_MAX, metavar="N")
    http_port_tls: int = _setting(8443, "HTTPS admin port.", minimum=0, maximum=PORT_MAX, metavar="N")
    authorization_enabled: bool = _setting(
        False, "Check each role's grants (produce, consume) and keep admin operations to super-users; "
        "needs --authentication-enabled.")
    tls_trust_certs_file: str | None = _setting(
        None, "CA certificates (PEM) that client certificates are verified against.", metavar="PATH")
    tls_require_trusted_client_cert: bool = _setting(
        False, "Mutual TLS: the TLS ports refuse a client without a certificate signed by "
        "--tls-trust-certs-file; its CN is the role of auth method tls.")
    retention_check_interval_seconds: float = _setting(
        120.0, "How often every loaded topic is trimmed (consumed ledgers deleted) and, with offload on, "
        "offloaded ledgers' local copies past the deletion lag and unreferenced bucket objects are "
        "deleted (Pulsar's retentionCheckIntervalInSeconds).", above=0, metavar="SECONDS")
    managed_ledger_offload_driver: str | None = _setting(
        None, "Object store sealed ledgers are offloaded to: aws-s3 (S3 or S3-compatible; s3 is read as "
        "aws-s3) or filesystem (a directory, --file-system-uri); none: offload is off. Credentials come "
        "only from the AWS default chain (AWS_* environment, ~/.aws, an instance role), never a setting.",
        metavar="DRIVER")
    s3_managed_ledger_offload_bucket: str | None = _setting(
        None, "The aws-s3 driver's bucket.", metavar="BUCKET")
    s3_managed_ledger_offload_service_endpoint: str | None = _setting(
        None, "The aws-s3 driver's endpoint, for an S3-compatible store (http:// or https:// URL); none: AWS's.",
        metavar="URL")
    s3_managed_ledger_offload_region: str | None = _setting(
        None, "The aws-s3 driver's region; none: the AWS default chain's.", metavar="REGION")
    s3_managed_ledger_offload_tls_ca_file: str | None = _setting(
        None, "CA certificates (PEM) an https:// endpoint's certificate is checked against; none: the system's.",
        metavar="PATH")
    file_system_uri: str | None = _setting(
        None, "The filesystem driver's directory, file:///ABSOLUTE/PATH (local, or a mount every Spark "
        "executor sees).", metavar="file:///PATH")
    managed_ledger_offload_prefix: str | None = _setting(
        None, "Prefix of every offloaded object's name in the bucket, so that clusters can share one; "
        "none: no prefix.", metavar="PREFIX")
    managed_ledger_offload_threshold_in_bytes: int = _setting(
        OFFLOAD_THRESHOLD_OFF, "Broker default of the offloadThreshold policy: bytes of a topic's newest "
        "ledgers kept on local disk; at each roll-over older sealed ledgers are offloaded, oldest first. "
        "0 offloads every sealed ledger; negative turns automatic offload off (Pulsar's "
        "managedLedgerOffloadAutoTriggerSizeThresholdBytes).", metavar="BYTES")
    managed_ledger_offload_deletion_lag_ms: int = _setting(
        OFFLOAD_DELETION_LAG_MS_DEFAULT, "Broker default of the offloadDeletionLagMs policy: how long after its "
        "offload a ledger's local copy is deleted (reads then go to the bucket); negative keeps local "
        "copies.", metavar="MS")
    managed_ledger_offload_read_cache_bytes: int = _setting(
        READ_CACHE_BYTES_DEFAULT, "Memory of the block cache that reads of offloaded ledgers go through.",
        minimum=1, metavar="BYTES")
    http_allowed_hosts: tuple[str, ...] = _setting(
        (), "Host header names the admin API answers besides the bind address and loopback "
        "(any IP literal when bound to 0.0.0.0), comma-separated; * answers any (no DNS rebinding "
        "protection).", metavar="a,b")


class SettingSpec(NamedTuple):
    """How one setting is named, typed, defaulted and bounded; read off ``Settings``."""

    key: str
    kind: type  # bool, int, float, str or tuple (of str)
    optional: bool  # None is a valid value (``str | None``)
    choices: tuple[str, ...]  # for a Literal type; () otherwise
    default: object
    help: str
    metavar: str | None  # the flag's value in --help; None for a boolean (its flag takes none)
    minimum: float | None
    maximum: float | None
    above: float | None


def flag_name(key: str) -> str:
    """``broker_port`` → ``--broker-port``."""
    return "--" + key.replace("_", "-")


def env_name(key: str) -> str:
    """``broker_port`` → ``COMPACTD_BROKER_PORT``."""
    return ENV_PREFIX + key.upper()


def setting_specs() -> tuple[SettingSpec, ...]:
    """One ``SettingSpec`` per ``Settings`` field, in declaration order."""
    return _SPECS


def _spec(settings_field: dataclasses.Field[Any], hint: Any) -> SettingSpec:
    arguments = [argument for argument in typing.get_args(hint) if argument is not type(None)]
    optional = len(arguments) < len(typing.get_args(hint))
    choices: tuple[str, ...] = ()
    if typing.get_origin(hint) is Literal:
        kind: type = str
        choices = tuple(arguments)
    elif typing.get_origin(hint) is tuple:
        kind = tuple
    else:
        kind = arguments[0] if optional else hint
    metadata = settings_field.metadata
    metavar = metadata["metavar"]
    if choices and metavar is None:
        metavar = "{" + ",".join(choices) + "}"
    if (kind is bool) != (metavar is None):
        raise TypeError(f"setting {settings_field.name}: a boolean has no metavar, any other setting one")
    return SettingSpec(settings_field.name, kind, optional, choices, settings_field.default,
                       metadata["help"], metavar, metadata["minimum"], metadata["maximum"], metadata["above"])


_HINTS = typing.get_type_hints(Settings)
_SPECS = tuple(_spec(settings_field, _HINTS[settings_field.name])
               for settings_field in dataclasses.fields(Settings))
_SPEC_BY_KEY = {spec.key: spec for spec in _SPECS}


def load_settings(flags: Mapping[str, object], env: Mapping[str, str], config_file_text: str | None,
                  *, config_file_path: str | None = None) -> Settings:
    """Settings from the flags the user passed, the environment and a TOML config file.

    ``flags`` holds only flags given on the command line (a ``None`` value counts as not
    given), keyed by setting key. ``config_file_path`` only names the file in errors.
    Raises ``ConfigError`` naming the flag, variable or file key and the bad value.
    """
    file_label = f"in {config_file_path}" if config_file_path else "in the config file"
    file_values = _parse_config_file(config_file_text, file_label)
    unknown_flags = sorted(set(flags) - set(_SPEC_BY_KEY))
    if unknown_flags:
        raise ConfigError(f"unknown setting {unknown_flags[0]!r}", key=unknown_flags[0])
    values: dict[str, object] = {}
    for spec in _SPECS:
        flag_value = flags.get(spec.key)
        if flag_value is not None:
            values[spec.key] = _from_flag(spec, flag_value)
        elif env_name(spec.key) in env:
            values[spec.key] = _from_text(spec, env[env_name(spec.key)], env_name(spec.key))
        elif spec.key in file_values:
            values[spec.key] = _from_file(spec, file_values[spec.key], f"{spec.key} {file_label}")
    settings = Settings(**values)  # type: ignore[arg-type]  # each value checked against its spec
    _check_together(settings)
    return settings


def settings_from_command_line(flags: Mapping[str, object], env: Mapping[str, str]) -> Settings:
    """Settings from the passed flags (``config`` among them), the environment and the config file."""
    flags = dict(flags)
    config_path = flags.pop("config", None) or env.get(CONFIG_ENV) or None
    text = None
    if config_path is not None:
        try:
            with open(str(config_path), encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read config file {config_path}: {error}") from None
    return load_settings(flags, env, text, config_file_path=None if config_path is None else str(config_path))


def require_supported(settings: Settings) -> None:
    """Refuse, with ``ConfigError``, settings this build accepts but does not serve (none at
    present: authentication and TLS are served; their key and certificate files are read
    by ``api.auth.preflight`` before the data dir is touched)."""


def _parse_config_file(text: str | None, file_label: str) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"invalid TOML {file_label}: {error}") from None
    for key in values:
        if key not in _SPEC_BY_KEY:
            raise ConfigError(f"unknown setting {key!r} {file_label}", key=key, value=values[key])
    return values


def _from_flag(spec: SettingSpec, value: object) -> object:
    label = flag_name(spec.key)
    if isinstance(value, str) and spec.kind is not str:
        return _from_text(spec, value, label)
    return _from_file(spec, value, label)


def _from_text(spec: SettingSpec, text: str, label: str) -> object:
    """A value written as text (environment, or a flag given as a string)."""
    if spec.optional and text == "":
        return None
    if spec.kind is bool:
        if text.strip().lower() not in BOOLEAN_WORDS:
            raise _bad(spec, label, text, "is not a boolean (true or false)")
        return BOOLEAN_WORDS[text.strip().lower()]
    if spec.kind is tuple:
        return _checked(spec, label, text, tuple(part.strip() for part in text.split(",") if part.strip()))
    if spec.kind in (int, float):
        try:
            number = spec.kind(text.strip())
        except ValueError:
            kind = "an integer" if spec.kind is int else "a number"
            raise _bad(spec, label, text, f"is not {kind}") from None
        return _checked(spec, label, text, number)
    return _checked(spec, label, text, text)


def _from_file(spec: SettingSpec, value: object, label: str) -> object:
    """A value that must already have the setting's type (TOML, or a typed flag)."""
    if spec.kind is bool and not isinstance(value, bool):
        raise _bad(spec, label, value, "is not a boolean (true or false)")
    if spec.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _bad(spec, label, value, "is not an integer")
    if spec.kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad(spec, label, value, "is not a number")
        value = float(value)
    if spec.kind is str and not isinstance(value, str):
        raise _bad(spec, label, value, "is not a string")
    if spec.kind is tuple:
        if isinstance(value, str):
            return _from_text(spec, value, label)
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            raise _bad(spec, label, value, "is not a list of strings")
        value = tuple(item.strip() for item in value)
    return _checked(spec, label, value, value)


def _checked(spec: SettingSpec, label: str, given: object, value: object) -> object:
    """``value`` (converted from ``given``) if it is within the setting's bounds."""
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(spec, label, given, "is not a finite number")
    if isinstance(value, int | float) and not isinstance(value, bool):
        _check_bounds(spec, label, given, value)
    if spec.choices and value not in spec.choices:
        raise _bad(spec, label, given, "is not one of " + ", ".join(spec.choices))
    if isinstance(value, str) and not spec.choices:
        _check_text(spec, label, given, value)
    if isinstance(value, tuple) and any(not role for role in value):
        raise _bad(spec, label, given, "has an empty role")
    return value


def _check_bounds(spec: SettingSpec, label: str, given: object, value: float) -> None:
    if spec.minimum is not None and spec.maximum is not None and not spec.minimum <= value <= spec.maximum:
        raise _bad(spec, label, given, f"is out of range ({spec.minimum:g}..{spec.maximum:g})")
    if spec.minimum is not None and value < spec.minimum:
        raise _bad(spec, label, given, f"is less than {spec.minimum:g}")
    if spec.above is not None and value <= spec.above:
        raise _bad(spec, label, given, f"must be greater than {spec.above:g}")


def _check_text(spec: SettingSpec, label: str, given: object, value: str) -> None:
    if value.strip() == "":
        raise _bad(spec, label, given, "is empty")
    if spec.key in ("token_secret_key", "token_public_key") and not value.startswith(TOKEN_KEY_PREFIXES):
        raise _bad(spec, label, given, "is not a key URL (file:///PATH or data:...)")
    if spec.key == "managed_ledger_offload_driver" and value.strip().lower() not in OFFLOAD_DRIVERS:
        raise _bad(spec, label, given, "is not an offload driver (aws-s3 or filesystem)")
    if spec.key == "s3_managed_ledger_offload_service_endpoint" and "@" in urlsplit(value).netloc:
        # the value is not shown: it holds a credential
        raise ConfigError(f"{label}: credentials do not belong in the endpoint URL; the AWS default chain "
                          "(AWS_* environment, ~/.aws, an instance role) gives them", key=spec.key)
    if spec.key == "file_system_uri" and not value.startswith("file:///"):
        raise _bad(spec, label, given, "is not a file:///ABSOLUTE/PATH URL")
    if spec.key == "advertised_address" and (any(c.isspace() or c in "/@?#" for c in value) or value.count(":") == 1):
        raise _bad(spec, label, given, "is not a host name or IP address (no scheme, port or path)")


def _check_together(settings: Settings) -> None:
    """Checks that involve more than one setting."""
    if settings.broker_port == settings.http_port != 0:
        raise ConfigError(
            f"broker_port and http_port are both {settings.broker_port}; give them different ports",
            key="http_port", value=settings.http_port)
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        raise ConfigError("TLS needs both --tls-cert-file and --tls-key-file", key="tls_key_file",
                          value=settings.tls_key_file)
    if settings.token_secret_key is not None and settings.token_public_key is not None:
        raise ConfigError("give --token-secret-key or --token-public-key, not both",
                          key="token_public_key", value=settings.token_public_key)
    if settings.authentication_enabled and settings.token_secret_key is None \
            and settings.token_public_key is None:
        raise ConfigError(
            "--authentication-enabled needs --token-secret-key or --token-public-key",
            key="authentication_enabled", value=True)
    if settings.authorization_enabled and not settings.authentication_enabled:
        raise ConfigError("--authorization-enabled needs --authentication-enabled",
                          key="authorization_enabled", value=True)
    offload_bucket(settings)  # the driver's location is complete and valid
    if settings.tls_require_trusted_client_cert and (
            settings.tls_trust_certs_file is None or settings.tls_cert_file is None):
        raise ConfigError(
            "--tls-require-trusted-client-cert needs --tls-trust-certs-file and --tls-cert-file",
            key="tls_require_trusted_client_cert", value=True)


def offload_bucket(settings: Settings) -> BucketConfig | None:
    """Where sealed ledgers are offloaded (``ledger.storage.object_fs``); None when offload is
    off (no ``managed_ledger_offload_driver``). ``ConfigError`` naming the setting when the
    driver's location is missing or not valid. Never a credential: the AWS chain's."""
    driver = settings.managed_ledger_offload_driver
    if driver is None:
        return None
    prefix = settings.managed_ledger_offload_prefix or ""
    try:
        if driver.strip().lower() == "filesystem":
            if settings.file_system_uri is None:
                raise ConfigError("the filesystem offload driver needs --file-system-uri file:///PATH",
                                  key="file_system_uri")
            location = BucketConfig.from_url(settings.file_system_uri)
            return BucketConfig("filesystem", location.bucket, prefix)
        if settings.s3_managed_ledger_offload_bucket is None:
            raise ConfigError("the aws-s3 offload driver needs --s3-managed-ledger-offload-bucket",
                              key="s3_managed_ledger_offload_bucket")
        return BucketConfig("aws-s3", settings.s3_managed_ledger_offload_bucket, prefix,
                            settings.s3_managed_ledger_offload_service_endpoint,
                            settings.s3_managed_ledger_offload_region,
                            settings.s3_managed_ledger_offload_tls_ca_file)
    except BucketConfigError as error:
        raise ConfigError(f"offload: {error}", key="managed_ledger_offload_driver", value=driver) from None


def _bad(spec: SettingSpec, label: str, value: object, problem: str) -> ConfigError:
    shown = "(a key, not shown)" if spec.key in SECRET_KEYS else repr(value)  # may hold an inline key
    return ConfigError(f"{label}: {shown} {problem}", key=spec.key, value=value)
