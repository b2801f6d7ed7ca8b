"""The ``compactd`` command tree (typer): ``serve``, ``admin``, ``tokens``, ``compact-topic``,
``backup``, ``restore``; ``api.cli`` is its light entry point.

``compactd serve`` has one flag per setting of ``api.config.Settings`` (INTERFACES §1 and
§4) plus ``--config FILE`` (or ``COMPACTD_CONFIG``), a TOML file of settings. Every flag
defaults to ``None`` here: only the flags the user actually passed are handed to
``load_settings``, which fills the rest from the environment, the config file and the
defaults, in that order. ``serve`` then runs ``api.server.run`` and exits with its code.

Expected failures print one line ``compactd: <message>`` to stderr, never a traceback:
bad settings exit 2 (like a usage error), a locked data dir or a port in use exit 1.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, NoReturn

import typer

from api import (  # noqa: F401 - admin_cli_schemas, admin_cli_topics register their verbs
    admin_cli,
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

_SPEC_BY_KEY = {spec.key: spec for spec in setting_specs()}


def _option(key: str, flag: str, metavar: str | None = None) -> Any:
    """The option of setting ``key``, its help ending with the default."""
    spec = _SPEC_BY_KEY[key]
    help_text = f"{spec.help} Default: {_shown(spec.default)}."
    return typer.Option(flag, metavar=metavar, help=help_text, show_default=False)  # plain help: no markup


def _shown(default: object) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, tuple):
        default = ",".join(default)
    return "none" if default in (None, "") else str(default)


# Numbers are taken as text and parsed by load_settings, like the environment's, so that
# a bad value gets the same message ("--broker-port: 'abc' is not an integer") everywhere.
_PORT = "N"
DataDirOption = Annotated[str | None, _option("data_dir", "--data-dir", "PATH")]
Bind = Annotated[str | None, _option("bind", "--bind", "ADDR")]
BrokerPort = Annotated[str | None, _option("broker_port", "--broker-port", _PORT)]
HttpPort = Annotated[str | None, _option("http_port", "--http-port", _PORT)]
AdvertisedAddress = Annotated[str | None, _option("advertised_address", "--advertised-address", "HOST")]
MonitorInterval = Annotated[str | None, _option(
    "compaction_monitor_interval_seconds", "--compaction-monitor-interval-seconds", "N")]
ThresholdBytes = Annotated[str | None, _option(
    "compaction_threshold_bytes", "--compaction-threshold-bytes", "N")]
PhaseOneTimeout = Annotated[str | None, _option(
    "compaction_phase_one_loop_timeout_seconds", "--compaction-phase-one-loop-timeout-seconds", "N")]
RetainNullKey = Annotated[bool | None, _option(
    "topic_compaction_retain_null_key",
    "--topic-compaction-retain-null-key/--no-topic-compaction-retain-null-key")]
MaxConcurrentRuns = Annotated[str | None, _option(
    "compaction_max_concurrent_runs", "--compaction-max-concurrent-runs", "N")]
Engine = Annotated[str | None, _option("compaction_engine", "--compaction-engine", "{auto,local,spark}")]
SparkMaster = Annotated[str | None, _option("spark_master", "--spark-master", "URL")]
MemoryBudget = Annotated[str | None, _option(
    "compaction_memory_budget_bytes", "--compaction-memory-budget-bytes", "BYTES")]
WorkerProcess = Annotated[bool | None, _option(
    "compaction_worker_process", "--compaction-worker-process/--no-compaction-worker-process")]
KeyIndex = Annotated[bool | None, _option(
    "compaction_key_index", "--compaction-key-index/--no-compaction-key-index")]
MinLag = Annotated[str | None, _option("compaction_min_lag_ms", "--compaction-min-lag-ms", "MS")]
MaxBytesPerSecond = Annotated[str | None, _option(
    "compaction_max_bytes_per_second", "--compaction-max-bytes-per-second", "BYTES")]
GracePeriod = Annotated[str | None, _option(
    "compacted_ledger_grace_period_s", "--compacted-ledger-grace-period-s", "SECONDS")]
LogFormatOption = Annotated[str | None, _option("log_format", "--log-format", "{text,json}")]
LogLevelOption = Annotated[str | None, _option("log_level", "--log-level", "{debug,info,warning,error}")]
Deduplication = Annotated[bool | None, _option(
    "broker_deduplication_enabled", "--broker-deduplication-enabled/--no-broker-deduplication-enabled")]
ClusterName = Annotated[str | None, _option("cluster_name", "--cluster-name", "NAME")]
Fsync = Annotated[str | None, _option("fsync", "--fsync", "{always,group,none}")]
MaxEntries = Annotated[str | None, _option(
    "managed_ledger_max_entries_per_ledger", "--managed-ledger-max-entries-per-ledger", "N")]
MaxBytes = Annotated[str | None, _option(
    "managed_ledger_max_size_per_ledger_bytes", "--managed-ledger-max-size-per-ledger-bytes", "N")]
MaxOpenLedgerFiles = Annotated[str | None, _option(
    "max_open_ledger_files", "--max-open-ledger-files", "N")]
MarkDeleteRateLimit = Annotated[str | None, _option(
    "managed_ledger_mark_delete_rate_limit", "--managed-ledger-mark-delete-rate-limit", "PER_S")]
ConnectTimeout = Annotated[str | None, _option(
    "wire_connect_timeout_seconds", "--wire-connect-timeout-seconds", "N")]
FrameTimeout = Annotated[str | None, _option(
    "wire_frame_timeout_seconds", "--wire-frame-timeout-seconds", "N")]
PartialFramesBudget = Annotated[str | None, _option(
    "wire_partial_frames_budget_bytes", "--wire-partial-frames-budget-bytes", "BYTES")]
HttpMaxBody = Annotated[str | None, _option(
    "http_max_request_body_bytes", "--http-max-request-body-bytes", "BYTES")]
SchemaMaxSize = Annotated[str | None, _option(
    "schema_max_size_bytes", "--schema-max-size-bytes", "BYTES")]
MaxPartitions = Annotated[str | None, _option(
    "max_num_partitions_per_partitioned_topic", "--max-num-partitions-per-partitioned-topic", "N")]
AuthenticationEnabled = Annotated[bool | None, _option(
    "authentication_enabled", "--authentication-enabled/--no-authentication-enabled")]
TokenSecretKey = Annotated[str | None, _option("token_secret_key", "--token-secret-key", "file:///PATH")]
TokenPublicKey = Annotated[str | None, _option("token_public_key", "--token-public-key", "file:///PATH")]
SuperUserRoles = Annotated[str | None, _option("super_user_roles", "--super-user-roles", "a,b")]
TlsCertFile = Annotated[str | None, _option("tls_cert_file", "--tls-cert-file", "PATH")]
TlsKeyFile = Annotated[str | None, _option("tls_key_file", "--tls-key-file", "PATH")]
BrokerPortTls = Annotated[str | None, _option("broker_port_tls", "--broker-port-tls", _PORT)]
HttpPortTls = Annotated[str | None, _option("http_port_tls", "--http-port-tls", _PORT)]
AuthorizationEnabled = Annotated[bool | None, _option(
    "authorization_enabled", "--authorization-enabled/--no-authorization-enabled")]
TlsTrustCertsFile = Annotated[str | None, _option("tls_trust_certs_file", "--tls-trust-certs-file", "PATH")]
TlsRequireClientCert = Annotated[bool | None, _option(
    "tls_require_trusted_client_cert",
    "--tls-require-trusted-client-cert/--no-tls-require-trusted-client-cert")]
HttpAllowedHosts = Annotated[str | None, _option("http_allowed_hosts", "--http-allowed-hosts", "a,b")]
SchemaStrategy = Annotated[str | None, _option(
    "schema_compatibility_strategy", "--schema-compatibility-strategy", "STRATEGY")]
ConfigFile = Annotated[str | None, typer.Option(
    "--config", metavar="FILE", show_default=False,
    help=f"TOML file of settings, keys as the flags with underscores. Env: {CONFIG_ENV}.")]


@app.callback()
def _root() -> None:
    """compactd: a Pulsar-compatible broker whose reason to exist is topic compaction."""


assert admin_cli_tenants.tenants  # its verbs register on admin_cli's groups when it is imported
app.add_typer(admin_cli.app, name="admin")
app.add_typer(tokens_cli.app, name="tokens")
app.command("compact-topic")(offline.compact_topic_command)
app.command("backup")(backup_cli.backup_command)
app.command("restore")(backup_cli.restore_command)


@app.command(cls=PlainHelpCommand)  # readable at 80 columns: flags in full, help wrapped at words
def serve(  # one parameter per setting, each named as its key
    ctx: typer.Context,
    data_dir: DataDirOption = None, bind: Bind = None, broker_port: BrokerPort = None,
    http_port: HttpPort = None, config: ConfigFile = None, advertised_address: AdvertisedAddress = None,
    compaction_monitor_interval_seconds: MonitorInterval = None,
    compaction_threshold_bytes: ThresholdBytes = None,
    compaction_phase_one_loop_timeout_seconds: PhaseOneTimeout = None,
    topic_compaction_retain_null_key: RetainNullKey = None,
    compaction_max_concurrent_runs: MaxConcurrentRuns = None,
    compaction_engine: Engine = None, spark_master: SparkMaster = None,
    compaction_memory_budget_bytes: MemoryBudget = None, compaction_worker_process: WorkerProcess = None,
    compaction_key_index: KeyIndex = None,
    compaction_min_lag_ms: MinLag = None, compaction_max_bytes_per_second: MaxBytesPerSecond = None,
    compacted_ledger_grace_period_s: GracePeriod = None,
    log_format: LogFormatOption = None, log_level: LogLevelOption = None,
    broker_deduplication_enabled: Deduplication = None, cluster_name: ClusterName = None,
    fsync: Fsync = None,
    managed_ledger_max_entries_per_ledger: MaxEntries = None,
    managed_ledger_max_size_per_ledger_bytes: MaxBytes = None,
    max_open_ledger_files: MaxOpenLedgerFiles = None,
    managed_ledger_mark_delete_rate_limit: MarkDeleteRateLimit = None,
    wire_connect_timeout_seconds: ConnectTimeout = None, wire_frame_timeout_seconds: FrameTimeout = None,
    wire_partial_frames_budget_bytes: PartialFramesBudget = None,
    http_max_request_body_bytes: HttpMaxBody = None,
    schema_max_size_bytes: SchemaMaxSize = None,
    max_num_partitions_per_partitioned_topic: MaxPartitions = None,
    authentication_enabled: AuthenticationEnabled = None,
    token_secret_key: TokenSecretKey = None, token_public_key: TokenPublicKey = None,
    super_user_roles: SuperUserRoles = None,
    tls_cert_file: TlsCertFile = None, tls_key_file: TlsKeyFile = None,
    broker_port_tls: BrokerPortTls = None, http_port_tls: HttpPortTls = None,
    authorization_enabled: AuthorizationEnabled = None, tls_trust_certs_file: TlsTrustCertsFile = None,
    tls_require_trusted_client_cert: TlsRequireClientCert = None,
    http_allowed_hosts: HttpAllowedHosts = None,
    schema_compatibility_strategy: SchemaStrategy = None,
) -> None:
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
