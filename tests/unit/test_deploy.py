"""``deploy/`` agrees with the code (issue 16 point 5); no container engine is needed.

The Dockerfile and the compose file are parsed, and what they say is checked against what
the code defines: ports and the health path (``Settings`` defaults, ``api.http``), the
settings they pass as ``COMPACTD_*`` variables (``load_settings`` must accept them), the
data dir that is the volume, the ``spark`` extra of ``pyproject.toml``, the packages the
image must copy, the commands it runs (the typer app). The Grafana dashboard may only
query metrics ``api/metrics.py`` serves, and shows every ``pulsar_compaction_*`` family.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs

from api import metrics
from api.config import ENV_PREFIX, Settings, load_settings
from api.http import HEALTH_PATH
from compactor.record import LATENCY_BUCKETS_MS
from scripts import gen_docs

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DEFAULTS = Settings()
JAVA_VERSIONS = ("17", "21")  # what PySpark 4 runs on (docs/guide/spark.md)


# -- the Dockerfile ---------------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    found = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, arguments = line.strip().partition(" ")
            found.append((instruction.upper(), arguments.strip()))
    return found


def _stages() -> dict[str, list[tuple[str, str]]]:
    """Each named stage's instructions, its base stages' included (what the image has)."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for instruction, arguments in _instructions((DEPLOY / "Dockerfile").read_text(encoding="utf-8")):
        if instruction == "FROM":
            image, _, name = arguments.partition(" AS ")
            current = list(stages.get(image.strip(), []))
            stages[name.strip()] = current
        else:
            current.append((instruction, arguments))
    return stages


def _env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction, arguments in stage:
        if instruction == "ENV":
            for item in shlex.split(arguments):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def _last(stage: list[tuple[str, str]], instruction: str) -> str:
    values = [arguments for name, arguments in stage if name == instruction]
    assert values, f"no {instruction} in the stage"
    return values[-1]


def _runtime_stages() -> dict[str, list[tuple[str, str]]]:
    return {name: stage for name, stage in _stages().items() if any(i == "ENTRYPOINT" for i, _ in stage)}


def test_each_image_runs_compactd_serve_as_a_non_root_user_on_a_data_volume() -> None:
    runtime = _runtime_stages()
    assert set(runtime) >= {"broker", "spark"}
    for name, stage in runtime.items():
        user = _last(stage, "USER")
        assert user not in ("root", "0"), name
        assert any(i == "RUN" and re.search(rf"useradd\b.*\b{user}$", a) for i, a in stage), f"{name}: no user {user}"
        env = _env(stage)
        settings = load_settings({}, {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}, None)
        assert settings.bind == "0.0.0.0", f"{name}: the listeners must bind every interface"
        assert json.loads(_last(stage, "VOLUME")) == [settings.data_dir], name
        assert any(i == "RUN" and f"chown {user}:" in a and settings.data_dir in a for i, a in stage), name
        entrypoint, command = json.loads(_last(stage, "ENTRYPOINT")), json.loads(_last(stage, "CMD"))
        assert entrypoint == ["compactd"] and command[0] in gen_docs.subcommands(gen_docs.command_tree()), name
        assert command == ["serve"]
        assert _last(stage, "STOPSIGNAL") == "SIGTERM"


def test_each_image_exposes_the_default_ports_and_checks_health_on_the_health_path() -> None:
    for name, stage in _runtime_stages().items():
        assert sorted(int(port) for port in _last(stage, "EXPOSE").split()) == sorted(
            [DEFAULTS.broker_port, DEFAULTS.http_port]), name
        health = _last(stage, "HEALTHCHECK")
        assert f"http://127.0.0.1:{DEFAULTS.http_port}{HEALTH_PATH}" in health, name
        assert "CMD" in health


def test_the_image_holds_every_package_and_the_spark_variant_the_spark_extra_and_java() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = [name.rstrip("*") for name in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    base = _stages()["base"]
    copied = {arguments.split()[0] for instruction, arguments in base if instruction == "COPY"}
    assert set(packages) <= copied, f"the image does not copy {sorted(set(packages) - copied)}"
    spark = _stages()["spark"]
    installs = " ".join(arguments for instruction, arguments in spark if instruction == "RUN")
    assert "spark" in project["project"]["optional-dependencies"]
    assert "pip install '.[spark]'" in installs
    java = re.search(r"openjdk-(\d+)-jre", installs)
    assert java is not None and java.group(1) in JAVA_VERSIONS
    broker_installs = " ".join(arguments for instruction, arguments in _stages()["broker"] if instruction == "RUN")
    assert "pip install ." in broker_installs and "[spark]" not in broker_installs


# -- the compose file -------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    return loaded


def test_compose_runs_compactd_with_spark_master_and_worker_sharing_the_data_volume() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"compactd", "spark-master", "spark-worker"}
    broker = services["compactd"]
    assert broker["build"]["target"] in _stages() and broker["build"]["dockerfile"] == "deploy/Dockerfile"
    settings = load_settings({}, broker["environment"], None)
    assert settings.compaction_engine == "spark"
    master_url = re.fullmatch(r"spark://([\w-]+):(\d+)", settings.spark_master)
    assert master_url is not None and master_url.group(1) in services
    master_command = services[master_url.group(1)]["command"]
    assert master_command[master_command.index("--port") + 1] == master_url.group(2)
    assert services["spark-worker"]["command"][0] == settings.spark_master
    assert sorted(broker["ports"]) == sorted(f"{port}:{port}" for port in (DEFAULTS.broker_port, DEFAULTS.http_port))
    assert HEALTH_PATH in " ".join(broker["healthcheck"]["test"])
    volume, path = broker["volumes"][0].split(":")[:2]
    assert volume in compose["volumes"] and path == settings.data_dir
    worker_volume = services["spark-worker"]["volumes"][0].split(":")
    assert worker_volume[:2] == [volume, path], "the worker reads the data dir at the broker's path"
    assert worker_volume[2:] in ([], ["rw"]), "the executors write the compacted ledgers there"
    assert broker["hostname"] == "compactd", "the workers reach the driver by its host name"
    for name in ("spark-master", "spark-worker"):
        assert services[name]["image"] == broker["image"], "executors need compactd's code"


def test_the_systemd_unit_runs_compactd_serve_and_stops_it_with_sigterm() -> None:
    unit = (DEPLOY / "compactd.service").read_text(encoding="utf-8")
    exec_start = re.search(r"^ExecStart=(.+)$", unit, re.MULTILINE)
    assert exec_start is not None
    arguments = shlex.split(exec_start.group(1))
    assert Path(arguments[0]).name == "compactd" and arguments[1] == "serve"
    flags = dict(zip(arguments[2::2], arguments[3::2], strict=True))
    settings = load_settings({key.lstrip("-").replace("-", "_"): value for key, value in flags.items()}, {}, None)
    assert settings.data_dir == gen_docs.DEPLOYED_DATA_DIR
    assert re.search(r"^KillSignal=SIGTERM$", unit, re.MULTILINE)


def test_every_deployment_keeps_its_data_in_the_same_place() -> None:
    sample = tomllib.loads((DEPLOY / "compactd.toml").read_text(encoding="utf-8"))
    images = {name: _env(stage)[ENV_PREFIX + "DATA_DIR"] for name, stage in _runtime_stages().items()}
    compose = _compose()["services"]["compactd"]["environment"][ENV_PREFIX + "DATA_DIR"]
    assert {sample["data_dir"], compose, *images.values()} == {gen_docs.DEPLOYED_DATA_DIR}


# -- the Grafana dashboard --------------------------------------------------------------------


def _served_metric_names() -> set[str]:
    source = Path(metrics.__file__).read_text(encoding="utf-8")
    names = set(re.findall(r'"((?:pulsar|compactd)_[a-z0-9_]+)"', source))
    names.update(metrics._bucket_name(bound) for bound in LATENCY_BUCKETS_MS)
    return names


def test_the_grafana_dashboard_queries_only_served_metrics_and_every_compaction_family() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text(encoding="utf-8"))
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions += [variable["query"]["query"] for variable in dashboard["templating"]["list"]]
    queried = set()
    for expression in expressions:
        queried.update(re.findall(r"\b((?:pulsar|compactd)_[a-z0-9_]+)\b(?!\.\*)", expression))
    served = _served_metric_names()
    assert queried - served - {"pulsar_compaction_latency_le_"} == set(), "the dashboard queries unknown metrics"
    families = {name for name in served if name.startswith("pulsar_compaction_") and "_latency_le_" not in name}
    assert families - queried == set(), "the dashboard lacks these pulsar_compaction_* families"
    assert any('pulsar_compaction_latency_le_.*' in expression for expression in expressions)
    assert all(panel["datasource"]["uid"] == "${DS_PROMETHEUS}" for panel in dashboard["panels"])
