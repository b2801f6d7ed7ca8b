"""Settings: every key has a flag, an env var and a config key; flag > env > file > default."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import typer.main

from api.broker.service import compaction_config
from api.cli import CONFIG_ENV, app, settings_from_command_line
from api.config import (
    ConfigError,
    Settings,
    env_name,
    flag_name,
    load_settings,
    require_supported,
    setting_specs,
)

ROOT = Path(__file__).resolve().parents[3]
INTERFACES = ROOT.parent / "shared" / "design" / "INTERFACES.md"
# Settings INTERFACES.md does not list yet (the lead adds them there); once it does, the
# documentation test below fails until they are taken out of this set.
NOT_YET_IN_INTERFACES = {
    "fsync", "managed_ledger_max_entries_per_ledger", "managed_ledger_max_size_per_ledger_bytes",
    "managed_ledger_roll_over_retry_ms", "compaction_memory_budget_bytes", "broker_deduplication_enabled", "cluster_name",
    "max_open_ledger_files", "managed_ledger_mark_delete_rate_limit",
    "wire_connect_timeout_seconds", "wire_frame_timeout_seconds",
    "wire_partial_frames_budget_bytes", "http_max_request_body_bytes",
    "compaction_min_lag_ms", "compaction_max_bytes_per_second", "log_format", "log_level",
    "authorization_enabled", "tls_trust_certs_file", "tls_require_trusted_client_cert", "http_allowed_hosts",
    "schema_compatibility_strategy",
    "advertised_address",  # issue 16
    "max_num_partitions_per_partitioned_topic",
    "compacted_ledger_grace_period_s",  # issue 13
    "compaction_worker_process",  # issue 12
    "compaction_key_index",  # issue 12
}

# INTERFACES §1 and §4, column "default".
DOCUMENTED_DEFAULTS = {
    "data_dir": "./data", "bind": "127.0.0.1", "broker_port": 6650, "http_port": 8080,
    "compaction_monitor_interval_seconds": 60, "compaction_threshold_bytes": 0,
    "compaction_phase_one_loop_timeout_seconds": 30, "topic_compaction_retain_null_key": False,
    "compaction_max_concurrent_runs": 2, "compaction_worker_process": True, "compaction_engine": "auto", "spark_master": "local[*]",
    "authentication_enabled": False, "token_secret_key": None, "token_public_key": None,
    "super_user_roles": (), "tls_cert_file": None, "tls_key_file": None,
    "broker_port_tls": 6651, "http_port_tls": 8443,
    "fsync": "group", "managed_ledger_max_entries_per_ledger": 50_000,
    "managed_ledger_max_size_per_ledger_bytes": 2 * 1024**3, "managed_ledger_roll_over_retry_ms": 10_000,
    "compaction_memory_budget_bytes": 1 << 30, "max_open_ledger_files": 256,
    "managed_ledger_mark_delete_rate_limit": 1.0,
    "broker_deduplication_enabled": False, "cluster_name": "standalone",
    "wire_connect_timeout_seconds": 10.0, "wire_frame_timeout_seconds": 30.0,
    "wire_partial_frames_budget_bytes": 128 * 1024**2, "http_max_request_body_bytes": 1024**2,
    "compaction_min_lag_ms": 0, "compaction_max_bytes_per_second": 0, "log_format": "text", "log_level": "info",
    "authorization_enabled": False, "tls_trust_certs_file": None, "tls_require_trusted_client_cert": False,
    "http_allowed_hosts": (),
    "schema_compatibility_strategy": "FULL",
    "advertised_address": None,  # issue 16
    "max_num_partitions_per_partitioned_topic": 1024,
    "compacted_ledger_grace_period_s": 60.0,  # issue 13
    "compaction_key_index": True,  # issue 12
}

# One valid, non-default value per key: (as text for a flag or env var, as TOML, parsed).
SAMPLES: dict[str, tuple[str, str, object]] = {
    "data_dir": ("/srv/d", '"/srv/d"', "/srv/d"),
    "bind": ("0.0.0.0", '"0.0.0.0"', "0.0.0.0"),
    "schema_compatibility_strategy": ("BACKWARD", '"BACKWARD"', "BACKWARD"),
    "broker_port": ("7650", "7650", 7650),
    "http_port": ("0", "0", 0),
    "compaction_monitor_interval_seconds": ("0.5", "0.5", 0.5),
    "compaction_threshold_bytes": ("104857600", "104857600", 104857600),
    "compaction_phase_one_loop_timeout_seconds": ("5", "5", 5.0),
    "topic_compaction_retain_null_key": ("true", "true", True),
    "compaction_max_concurrent_runs": ("4", "4", 4),
    "compaction_engine": ("spark", '"spark"', "spark"),
    "spark_master": ("spark://h:7077", '"spark://h:7077"', "spark://h:7077"),
    "fsync": ("always", '"always"', "always"),
    "managed_ledger_max_entries_per_ledger": ("10", "10", 10),
    "managed_ledger_max_size_per_ledger_bytes": ("4096", "4096", 4096),
    "managed_ledger_roll_over_retry_ms": ("500", "500", 500),
    "compaction_memory_budget_bytes": ("4096", "4096", 4096),
    "broker_deduplication_enabled": ("on", "true", True),
    "compaction_worker_process": ("off", "false", False),
    "compaction_key_index": ("off", "false", False),
    "cluster_name": ("east", '"east"', "east"),
    "max_open_ledger_files": ("64", "64", 64),
    "managed_ledger_mark_delete_rate_limit": ("0.1", "0.1", 0.1),
    "wire_connect_timeout_seconds": ("0.5", "0.5", 0.5),
    "wire_frame_timeout_seconds": ("2", "2", 2.0),
    "wire_partial_frames_budget_bytes": ("1048576", "1048576", 1048576),
    "http_max_request_body_bytes": ("4096", "4096", 4096),
    "compaction_min_lag_ms": ("60000", "60000", 60000),
    "compaction_max_bytes_per_second": ("1048576", "1048576", 1048576),
    "compacted_ledger_grace_period_s": ("0.5", "0.5", 0.5),
    "log_format": ("json", '"json"', "json"),
    "log_level": ("debug", '"debug"', "debug"),
    "max_num_partitions_per_partitioned_topic": ("16", "16", 16),
    "authentication_enabled": ("yes", "true", True),
    "token_secret_key": ("file:///etc/secret", '"file:///etc/secret"', "file:///etc/secret"),
    "token_public_key": ("data:;base64,AAAA", '"data:;base64,AAAA"', "data:;base64,AAAA"),
    "super_user_roles": ("admin, ops", '["admin", "ops"]', ("admin", "ops")),
    "tls_cert_file": ("/etc/cert.pem", '"/etc/cert.pem"', "/etc/cert.pem"),
    "tls_key_file": ("/etc/key.pem", '"/etc/key.pem"', "/etc/key.pem"),
    "broker_port_tls": ("7651", "7651", 7651),
    "http_port_tls": ("9443", "9443", 9443),
    "authorization_enabled": ("true", "true", True),
    "tls_trust_certs_file": ("/etc/ca.pem", '"/etc/ca.pem"', "/etc/ca.pem"),
    "tls_require_trusted_client_cert": ("yes", "true", True),
    "http_allowed_hosts": ("broker.example, admin.example", '["broker.example", "admin.example"]',
                           ("broker.example", "admin.example")),
    "advertised_address": ("broker.example.com", '"broker.example.com"', "broker.example.com"),  # issue 16
}
KEYS = [spec.key for spec in setting_specs()]
# Settings that are only valid together with another one (checked across settings).
COMPANIONS = {
    "authentication_enabled": {"token_secret_key": "file:///k"},
    "tls_cert_file": {"tls_key_file": "/k.pem"},
    "tls_key_file": {"tls_cert_file": "/c.pem"},
    "authorization_enabled": {"authentication_enabled": True, "token_secret_key": "file:///k"},
    "tls_require_trusted_client_cert": {"tls_trust_certs_file": "/ca.pem", "tls_cert_file": "/c.pem",
                                        "tls_key_file": "/k.pem"},
}


def _serve_flags() -> dict[str, str]:
    """Every long flag of ``compactd serve`` → the parameter it sets."""
    command = typer.main.get_command(app)
    serve = command.commands["serve"]  # type: ignore[attr-defined]
    flags = {}
    for param in serve.params:
        for option in [*param.opts, *getattr(param, "secondary_opts", [])]:
            flags[option] = param.name
    return flags


def test_settings_have_the_documented_defaults() -> None:
    assert set(KEYS) == set(DOCUMENTED_DEFAULTS) == set(SAMPLES)
    defaults = load_settings({}, {}, None)
    assert defaults == Settings()
    assert dataclasses.asdict(defaults) == DOCUMENTED_DEFAULTS


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().broker_port = 1  # type: ignore[misc]


@pytest.mark.parametrize("key", KEYS)
def test_every_key_has_a_flag_an_env_var_and_a_config_key(key: str) -> None:
    flags = _serve_flags()
    assert flags[flag_name(key)] == key
    text, toml, expected = SAMPLES[key]
    extra = COMPANIONS.get(key, {})
    from_flag = load_settings({key: text, **extra}, {}, None)
    from_env = load_settings(extra, {env_name(key): text}, None)
    from_file = load_settings(extra, {}, f"{key} = {toml}\n")
    assert getattr(from_flag, key) == getattr(from_env, key) == getattr(from_file, key) == expected
    assert expected != DOCUMENTED_DEFAULTS[key]


def test_serve_has_no_flag_without_a_setting() -> None:
    names = set(_serve_flags().values()) - {"help"}
    assert names == set(KEYS) | {"config"}


def test_every_setting_is_documented_in_interfaces() -> None:
    if not INTERFACES.exists():
        pytest.skip(f"{INTERFACES} is not checked out beside the repository")
    text = INTERFACES.read_text(encoding="utf-8")
    first_cells = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `--")]
    documented = {flag for cell in first_cells for flag in re.findall(r"`(--[a-z0-9-]+)", cell)}
    keys = {flag[2:].replace("-", "_") for flag in documented} - {"config"}
    assert keys - set(KEYS) == set(), "documented but not a setting"
    assert set(KEYS) - keys == NOT_YET_IN_INTERFACES, "a setting INTERFACES.md does not document"
    for env in re.findall(r"`(COMPACTD_[A-Z0-9_]+)`", text):
        if env != CONFIG_ENV:
            assert env[len("COMPACTD_"):].lower() in KEYS, env


# -- precedence ---------------------------------------------------------------------------

PRECEDENCE = [
    # key, flag, env, file (TOML), expected
    ("broker_port", "1", "2", "3", 1),
    ("broker_port", None, "2", "3", 2),
    ("broker_port", None, None, "3", 3),
    ("broker_port", None, None, None, 6650),
    ("compaction_engine", "local", "spark", '"auto"', "local"),
    ("compaction_engine", None, "spark", '"local"', "spark"),
    ("compaction_engine", None, None, '"local"', "local"),
    ("topic_compaction_retain_null_key", False, "true", "true", False),
    ("topic_compaction_retain_null_key", None, "false", "true", False),
    ("topic_compaction_retain_null_key", None, None, "true", True),
    ("spark_master", "spark://a:1", "spark://b:2", '"spark://c:3"', "spark://a:1"),
    ("spark_master", None, None, None, "local[*]"),
    ("compaction_monitor_interval_seconds", 0.25, "5", "7", 0.25),
    ("compaction_monitor_interval_seconds", None, "-1", "7", -1.0),
    ("compaction_monitor_interval_seconds", None, None, "7", 7.0),
    ("super_user_roles", "a", "b,c", '["d"]', ("a",)),
    ("super_user_roles", None, "b,c", '["d"]', ("b", "c")),
    ("super_user_roles", None, None, '"d, e"', ("d", "e")),
    ("data_dir", None, "/from/env", '"/from/file"', "/from/env"),
]


@pytest.mark.parametrize(("key", "flag", "env", "file", "expected"), PRECEDENCE)
def test_flag_beats_env_beats_file_beats_default(key: str, flag: object, env: str | None,
                                                 file: str | None, expected: object) -> None:
    settings = load_settings(
        {} if flag is None else {key: flag},
        {} if env is None else {env_name(key): env},
        None if file is None else f"{key} = {file}\n",
    )
    assert getattr(settings, key) == expected


def test_sources_mix_key_by_key() -> None:
    settings = load_settings(
        {"broker_port": 1, "http_port": None},  # None: the flag was not given
        {"COMPACTD_HTTP_PORT": "2", "COMPACTD_UNRELATED": "x", "PATH": "/bin"},
        'bind = "0.0.0.0"\nhttp_port = 3\ncompaction_threshold_bytes = 10\n',
    )
    assert (settings.broker_port, settings.http_port, settings.bind) == (1, 2, "0.0.0.0")
    assert settings.compaction_threshold_bytes == 10
    assert settings.data_dir == "./data"


@pytest.mark.parametrize(("text", "expected"), [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("on", True),
    ("false", False), ("0", False), ("No", False), ("off", False),
])
def test_env_booleans(text: str, expected: bool) -> None:
    settings = load_settings({}, {"COMPACTD_TOPIC_COMPACTION_RETAIN_NULL_KEY": text}, None)
    assert settings.topic_compaction_retain_null_key is expected


def test_an_empty_env_var_of_an_optional_setting_means_none() -> None:
    settings = load_settings({}, {"COMPACTD_TLS_CERT_FILE": "", "COMPACTD_TLS_KEY_FILE": ""},
                             'tls_cert_file = "/c"\ntls_key_file = "/k"\n')
    assert settings.tls_cert_file is None and settings.tls_key_file is None


# -- bad values ---------------------------------------------------------------------------

BAD_TEXT = [
    ("broker_port", "abc", "is not an integer"),
    ("broker_port", "70000", "out of range (0..65535)"),
    ("http_port", "-1", "out of range (0..65535)"),
    ("broker_port_tls", "65536", "out of range"),
    ("compaction_threshold_bytes", "-5", "less than 0"),
    ("compaction_max_concurrent_runs", "0", "less than 1"),
    ("managed_ledger_max_entries_per_ledger", "0", "less than 1"),
    ("compaction_phase_one_loop_timeout_seconds", "0", "greater than 0"),
    ("compaction_monitor_interval_seconds", "soon", "is not a number"),
    ("compaction_monitor_interval_seconds", "nan", "not a finite number"),
    ("compaction_engine", "flink", "is not one of auto, local, spark"),
    ("fsync", "sometimes", "is not one of always, group, none"),
    ("topic_compaction_retain_null_key", "maybe", "is not a boolean"),
    ("data_dir", "  ", "is empty"),
    ("bind", "", "is empty"),
    ("super_user_roles", ",", None),  # an empty list after the commas is fine
]


@pytest.mark.parametrize(("key", "value", "problem"), BAD_TEXT)
def test_a_bad_flag_or_env_value_is_named_with_its_source(key: str, value: str, problem: str | None) -> None:
    if problem is None:
        assert load_settings({}, {env_name(key): value}, None).super_user_roles == ()
        return
    with pytest.raises(ConfigError) as from_flag:
        load_settings({key: value}, {}, None)
    assert str(from_flag.value).startswith(f"{flag_name(key)}: {value!r} ")
    assert problem in str(from_flag.value)
    assert (from_flag.value.key, from_flag.value.value) == (key, value)
    with pytest.raises(ConfigError) as from_env:
        load_settings({}, {env_name(key): value}, None)
    assert str(from_env.value).startswith(f"{env_name(key)}: {value!r} ")


@pytest.mark.parametrize("key", ["token_secret_key", "token_public_key"])
def test_a_bad_key_setting_is_named_without_its_value(key: str) -> None:
    """Issue 15: a key setting's value may be the key itself (pasted without ``data:``),
    so its error names the flag and the problem, never the value."""
    for flags, env, label in (({key: "c2VjcmV0LWtleQ=="}, {}, flag_name(key)),
                              ({}, {env_name(key): "c2VjcmV0LWtleQ=="}, env_name(key))):
        with pytest.raises(ConfigError) as caught:
            load_settings(flags, env, None)
        assert str(caught.value) == f"{label}: (a key, not shown) is not a key URL (file:///PATH or data:...)"


@pytest.mark.parametrize(("line", "message"), [
    ('broker_port = "6650"', "broker_port in compactd.toml: '6650' is not an integer"),
    ("broker_port = 6650.0", "broker_port in compactd.toml: 6650.0 is not an integer"),
    ("broker_port = true", "broker_port in compactd.toml: True is not an integer"),
    ("broker_port = 99999", "broker_port in compactd.toml: 99999 is out of range (0..65535)"),
    ('topic_compaction_retain_null_key = "yes"', "'yes' is not a boolean"),
    ("compaction_monitor_interval_seconds = false", "False is not a number"),
    ("compaction_monitor_interval_seconds = inf", "inf is not a finite number"),
    ("compaction_engine = 1", "compaction_engine in compactd.toml: 1 is not a string"),
    ('compaction_engine = "Spark"', "'Spark' is not one of auto, local, spark"),
    ("super_user_roles = [1, 2]", "[1, 2] is not a list of strings"),
    ('super_user_roles = ["a", ""]', "has an empty role"),
    ("super_user_roles = 3", "3 is not a list of strings"),
])
def test_a_wrong_type_in_the_config_file_names_the_key_and_the_value(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings({}, {}, line + "\n", config_file_path="compactd.toml")


def test_an_unknown_config_file_key_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'broker_prot' in the config file") as error:
        load_settings({}, {}, "broker_prot = 6650\n")
    assert error.value.key == "broker_prot"
    with pytest.raises(ConfigError, match="unknown setting 'compaction'"):
        load_settings({}, {}, "[compaction]\nengine = 'local'\n")


def test_an_unknown_flag_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'nope'"):
        load_settings({"nope": 1}, {}, None)


def test_invalid_toml_is_an_error_naming_the_file() -> None:
    with pytest.raises(ConfigError, match="invalid TOML in /etc/c.toml"):
        load_settings({}, {}, "broker_port = = 1\n", config_file_path="/etc/c.toml")


@pytest.mark.parametrize(("flags", "message"), [
    ({"broker_port": 7000, "http_port": 7000}, "broker_port and http_port are both 7000"),
    ({"tls_cert_file": "/c.pem"}, "TLS needs both --tls-cert-file and --tls-key-file"),
    ({"tls_key_file": "/k.pem"}, "TLS needs both"),
    ({"token_secret_key": "file:///a", "token_public_key": "file:///b"}, "not both"),
    ({"authentication_enabled": True}, "needs --token-secret-key or --token-public-key"),
    ({"authorization_enabled": True}, "--authorization-enabled needs --authentication-enabled"),
    ({"tls_require_trusted_client_cert": True, "tls_cert_file": "/c.pem", "tls_key_file": "/k.pem"},
     "--tls-require-trusted-client-cert needs --tls-trust-certs-file and --tls-cert-file"),
])
def test_settings_that_contradict_each_other(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(flags, {}, None)


def test_both_ports_may_be_zero() -> None:
    settings = load_settings({"broker_port": 0, "http_port": 0}, {}, None)
    assert (settings.broker_port, settings.http_port) == (0, 0)


@pytest.mark.parametrize("flags", [
    {"authentication_enabled": True, "token_secret_key": "file:///k"},
    {"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem"},
])
def test_authentication_and_tls_are_served(flags: dict[str, object]) -> None:
    """Issue 15 serves them: ``require_supported`` no longer refuses them (their files are
    read by ``api.auth.tls.preflight``, tested in ``test_auth_settings``)."""
    require_supported(load_settings(flags, {}, None))


def test_token_settings_without_authentication_are_served() -> None:
    require_supported(load_settings({"token_secret_key": "file:///k", "super_user_roles": "a"}, {}, None))


def test_the_sample_config_file_of_deploy_is_valid() -> None:
    sample = ROOT / "deploy" / "compactd.toml"
    settings = load_settings({}, {}, sample.read_text(encoding="utf-8"), config_file_path=str(sample))
    assert settings.data_dir == "/var/lib/compactd"


def test_the_compactor_takes_its_settings_from_the_broker_settings() -> None:
    """``compaction_config`` carries every compaction setting into the compactor, so the
    broker and ``compactd compact-topic`` compact alike."""
    settings = settings_from_command_line({
        "topic_compaction_retain_null_key": "true", "compaction_phase_one_loop_timeout_seconds": "5",
        "compaction_engine": "spark", "spark_master": "spark://h:7077",
        "compaction_memory_budget_bytes": "4096",
    }, {})
    config = compaction_config(settings)
    assert (config.retain_null_key, config.phase_one_read_timeout_s, config.engine, config.spark_master,
            config.memory_budget_bytes) == (True, 5.0, "spark", "spark://h:7077", 4096)
