"""Authentication, authorization and TLS end to end: a real ``compactd serve`` process, the
real ``pulsar-client``, httpx and ``compactd admin``/``compactd tokens`` as subprocesses.

What each test shows (issue 15):

* ``test_tokens_admit_and_refuse_real_clients`` — ``pulsar.AuthenticationToken`` with a
  valid token produces and consumes; a missing, malformed, expired or wrongly signed one
  is refused at CONNECT (the client 3.13 treats any answer but CONNECTED as a failed
  connect and retries until its operation timeout: it raises ``pulsar.Timeout``; the
  broker logs the AuthenticationError it answered) and creates nothing.
* ``test_grants_from_the_cli_let_a_role_produce_and_consume_and_persist`` — a role without
  grants gets ``pulsar.AuthorizationError``; ``compactd admin namespaces grant-permission``
  and ``topics grant-permission`` (token from ``$COMPACTD_AUTH_TOKEN``) let it in; grants
  survive a restart; admin operations answer 403 to it; ``revoke-permission`` shuts it out.
* ``test_tls_ports_serve_the_real_client_and_https`` — ``pulsar+ssl://`` with
  ``tls_trust_certs_file_path`` and a token; the HTTPS admin port with the same CA, from
  httpx and from ``compactd admin --tls-trust-cert-path``.
* ``test_mutual_tls_takes_the_certificate_cn_as_the_role`` — with
  ``--tls-require-trusted-client-cert``, ``pulsar.AuthenticationTLS`` is admitted as its
  certificate's CN (which needs a grant like any role); a client without a certificate is not.
* ``test_secrets_never_reach_logs_bodies_metrics_or_the_process_title`` — after accepted and
  refused attempts on both ports, neither the tokens nor the key appear anywhere.
* ``test_a_non_loopback_bind_without_authentication_warns_once_and_refuses_foreign_hosts``.

AWS credentials (object storage): ``test_s3_secrets.py``.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.auth.tokens import create_token
from tests.integration.auth.tls_material import Authority, Issued, issue, make_ca
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
COMPACTD = str(Path(sys.executable).with_name("compactd"))
REFUSED_TIMEOUT_S = 1  # the client retries a refused CONNECT until this operation timeout


def _compactd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMPACTD, *args], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **(env or {})})


class Keys:
    """A secret key and tokens made by ``compactd tokens``, and a throwaway CA."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.secret = directory / "secret.key"
        assert _compactd("tokens", "create-secret-key", "--output", str(self.secret)).returncode == 0
        self.secret_url = f"file://{self.secret}"
        self.ca: Authority = make_ca(directory)
        self.server: Issued = issue(self.ca, directory, "server", "localhost", server=True)
        self.client: Issued = issue(self.ca, directory, "client", "svc-client", server=False)
        self.tokens: dict[str, str] = {}

    def token(self, role: str, *extra: str) -> str:
        key = " ".join((role, *extra))
        if key not in self.tokens:
            result = _compactd("tokens", "create", "--secret-key", self.secret_url, "--subject", role, *extra)
            assert result.returncode == 0, result.stderr
            self.tokens[key] = result.stdout.strip().splitlines()[-1]
        return self.tokens[key]

    def secrets(self) -> list[str]:
        """Every secret that must never be shown: the key (raw, hex, base64), the tokens, the TLS keys."""
        raw = self.secret.read_bytes()
        found = [raw.hex(), base64.b64encode(raw).decode(), *self.tokens.values()]
        for issued in (self.server, self.client):
            lines = issued.key_path.read_text().splitlines()
            found.extend(line for line in lines if line and not line.startswith("-----"))
        return found


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture
def start(tmp_path: Path, keys: Keys) -> Iterator[Callable[..., ServeProcess]]:
    """Start ``compactd serve`` with token authentication and authorization (``admin`` the
    super-user) plus ``flags``; every process is stopped after the test."""
    started: list[ServeProcess] = []

    def run(*flags: str, auth: bool = True) -> ServeProcess:
        auth_flags = ("--authentication-enabled", "--authorization-enabled", "--token-secret-key",
                      keys.secret_url, "--super-user-roles", "admin") if auth else ()
        serve = ServeProcess(tmp_path / "data", tmp_path / "serve.log", "--fsync", "none", *auth_flags, *flags)
        started.append(serve)
        return serve

    yield run
    for serve in started:
        if serve.running:
            assert serve.terminate() == 0
        else:
            serve.kill()


def _tls_flags(keys: Keys) -> tuple[str, ...]:
    return ("--tls-cert-file", str(keys.server.cert_path), "--tls-key-file", str(keys.server.key_path),
            "--broker-port-tls", "0", "--http-port-tls", "0")


def _url(serve: ServeProcess, name: str) -> str:
    for word in serve.ready_line.split():
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
    raise AssertionError(f"no {name} in {serve.ready_line!r}")


def _client(url: str, **options: Any) -> Any:
    return pulsar.Client(url, logger=QUIET, **{"operation_timeout_seconds": 10, **options})


def _round_trip(client: Any, topic: str, payload: bytes = b"hello") -> bytes:
    producer = client.create_producer(topic)
    producer.send(payload)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    data: bytes = reader.read_next(10_000).data()
    producer.close()
    reader.close()
    return data


def _refused(url: str, authentication: Any, topic: str, **options: Any) -> type[BaseException]:
    client = _client(url, authentication=authentication, operation_timeout_seconds=REFUSED_TIMEOUT_S, **options)
    try:
        with pytest.raises(Exception) as caught:
            client.create_producer(topic)
        return caught.type
    finally:
        client.close()


@pytest.mark.slow  # several processes and a client's timed-out retries
def test_tokens_admit_and_refuse_real_clients(start: Callable[..., ServeProcess], keys: Keys) -> None:
    serve = start()
    topic = "persistent://public/default/tokens"
    other = keys.directory / "other.key"
    other.write_bytes(os.urandom(32))
    wrong = _compactd("tokens", "create", "--secret-key", f"file://{other}", "--subject", "admin")
    keys.tokens["wrongly signed"] = wrong.stdout.strip()
    expired = create_token("admin", secret_key_url=keys.secret_url, expiry_s=60, now=time.time() - 3600)
    keys.tokens["expired"] = expired
    attempts = {"missing": None, "malformed": pulsar.AuthenticationToken("not-a-jwt"),
                "expired": pulsar.AuthenticationToken(expired),
                "wrongly signed": pulsar.AuthenticationToken(keys.tokens["wrongly signed"])}
    for name, authentication in attempts.items():
        assert _refused(serve.broker_url, authentication, topic) is pulsar.Timeout, name
    log = serve.log_path.read_text()
    for reason in ("auth method 'none' is not accepted", "the token is malformed", "the token has expired",
                   "the token's signature does not verify"):
        assert reason in log
    admin = keys.token("admin")
    listed = httpx.get(f"{serve.http_url}/admin/v2/persistent/public/default",
                       headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    assert listed.json() == []  # nothing was created by a refused client
    client = _client(serve.broker_url, authentication=pulsar.AuthenticationToken(admin))
    try:
        assert _round_trip(client, topic) == b"hello"
    finally:
        client.close()


@pytest.mark.slow  # several processes and a client's timed-out retries
def test_grants_from_the_cli_let_a_role_produce_and_consume_and_persist(
        start: Callable[..., ServeProcess], keys: Keys) -> None:
    serve = start()
    topic = "persistent://public/default/granted"
    env = {"COMPACTD_AUTH_TOKEN": keys.token("admin"), "COMPACTD_ADMIN_URL": serve.http_url}
    alice = pulsar.AuthenticationToken(keys.token("alice"))
    client = _client(serve.broker_url, authentication=alice)
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
        result = _compactd("admin", "namespaces", "grant-permission", "public/default", "--role", "alice",
                           "--actions", "produce", env=env)
        assert result.returncode == 0, result.stderr
        producer = client.create_producer(topic)
        producer.send(b"granted")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_reader(topic, pulsar.MessageId.earliest)
        assert _compactd("admin", "topics", "grant-permission", topic, "--role", "alice", "--actions",
                         "consume", env=env).returncode == 0
        assert client.create_reader(topic, pulsar.MessageId.earliest).read_next(10_000).data() == b"granted"
    finally:
        client.close()
    alice_rest = {"Authorization": f"Bearer {keys.token('alice')}"}
    assert httpx.put(f"{serve.http_url}/admin/v2/persistent/public/default/granted/compaction",
                     headers=alice_rest, timeout=10).status_code == 403
    denied = _compactd("admin", "--auth-token", keys.token("alice"), "--admin-url", serve.http_url,
                       "topics", "delete", topic)
    assert denied.returncode == 1 and "(HTTP 403)" in denied.stderr
    assert _compactd("admin", "--admin-url", serve.http_url, "topics", "list", "public/default",
                     env={"COMPACTD_AUTH_TOKEN": ""}).stderr.strip().endswith("(HTTP 401)")

    assert serve.terminate() == 0
    serve = start()
    env["COMPACTD_ADMIN_URL"] = serve.http_url
    listed = _compactd("admin", "namespaces", "permissions", "public/default", env=env)
    assert json.loads(listed.stdout) == {"alice": ["produce"]}
    assert json.loads(_compactd("admin", "topics", "permissions", topic, env=env).stdout) == {"alice": ["consume"]}
    assert _compactd("admin", "namespaces", "revoke-permission", "public/default", "--role", "alice",
                     env=env).returncode == 0
    client = _client(serve.broker_url, authentication=alice)
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
    finally:
        client.close()


@pytest.mark.slow  # several processes and a client's timed-out retries
def test_tls_ports_serve_the_real_client_and_https(start: Callable[..., ServeProcess], keys: Keys) -> None:
    serve = start(*_tls_flags(keys))
    broker_tls, https = _url(serve, "broker_tls"), _url(serve, "https")
    assert broker_tls.startswith("pulsar+ssl://") and https.startswith("https://")
    client = _client(broker_tls, tls_trust_certs_file_path=str(keys.ca.cert_path),
                     authentication=pulsar.AuthenticationToken(keys.token("admin")))
    try:
        assert _round_trip(client, "persistent://public/default/over-tls", b"sealed") == b"sealed"
    finally:
        client.close()
    context = ssl.create_default_context(cafile=str(keys.ca.cert_path))
    with httpx.Client(base_url=https, verify=context, timeout=10) as http:
        assert http.get("/admin/v2/brokers/health").text == "ok"
        assert http.get("/admin/v2/persistent/public/default").status_code == 401
    listed = _compactd("admin", "--admin-url", https, "--tls-trust-cert-path", str(keys.ca.cert_path),
                       "--auth-token", keys.token("admin"), "topics", "list", "public/default")
    assert listed.stdout.split() == ["persistent://public/default/over-tls"], listed.stderr
    untrusted = _compactd("admin", "--admin-url", https, "--auth-token", keys.token("admin"),
                          "topics", "list", "public/default")
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr


def test_mutual_tls_takes_the_certificate_cn_as_the_role(start: Callable[..., ServeProcess], keys: Keys) -> None:
    serve = start(*_tls_flags(keys), "--tls-trust-certs-file", str(keys.ca.cert_path),
                  "--tls-require-trusted-client-cert")
    broker_tls = _url(serve, "broker_tls")
    topic = "persistent://public/default/mutual"
    trust = {"tls_trust_certs_file_path": str(keys.ca.cert_path)}
    certificate = pulsar.AuthenticationTLS(str(keys.client.cert_path), str(keys.client.key_path))
    client = _client(broker_tls, authentication=certificate, **trust)
    try:
        with pytest.raises(pulsar.AuthorizationError):  # admitted as svc-client, which has no grant
            client.create_producer(topic)
    finally:
        client.close()
    granted = httpx.post(f"{serve.http_url}/admin/v2/namespaces/public/default/permissions/svc-client",
                         json=["produce", "consume"], headers={"Authorization": f"Bearer {keys.token('admin')}"},
                         timeout=10)
    assert granted.status_code == 204
    client = _client(broker_tls, authentication=certificate, **trust)
    try:
        assert _round_trip(client, topic, b"by certificate") == b"by certificate"
    finally:
        client.close()
    no_certificate = pulsar.AuthenticationToken(keys.token("admin"))
    assert _refused(broker_tls, no_certificate, topic, **trust) in (pulsar.Timeout, pulsar.ConnectError)


@pytest.mark.slow  # several processes and a client's timed-out retries
def test_secrets_never_reach_logs_bodies_metrics_or_the_process_title(
        start: Callable[..., ServeProcess], keys: Keys) -> None:
    serve = start()
    admin, alice = keys.token("admin"), keys.token("alice")
    bodies = []
    with httpx.Client(base_url=serve.http_url, timeout=10) as http:
        for token in (admin, alice, admin[:-4] + "AAAA", "not-a-jwt"):
            for path in ("/admin/v2/persistent/public/default", "/metrics",
                         "/admin/v2/namespaces/public/default/permissions"):
                bodies.append(http.get(path, headers={"Authorization": f"Bearer {token}"}).text)
    for authentication in (pulsar.AuthenticationToken(alice[:-4] + "AAAA"),):
        _refused(serve.broker_url, authentication, "persistent://public/default/secret")
    client = _client(serve.broker_url, authentication=pulsar.AuthenticationToken(alice))
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer("persistent://public/default/secret")
    finally:
        client.close()
    title = Path(f"/proc/{serve.process.pid}/cmdline").read_bytes().decode(errors="replace")
    serve.terminate()
    log = serve.log_path.read_text()
    assert "refusing connection" in log and "is not authorized to produce" in log
    for secret in [*keys.secrets(), admin[:-4] + "AAAA", alice[:-4] + "AAAA"]:
        assert secret not in log
        assert secret not in title
        for body in bodies:
            assert secret not in body


def test_a_non_loopback_bind_without_authentication_warns_once_and_refuses_foreign_hosts(
        start: Callable[..., ServeProcess]) -> None:
    serve = start("--bind", "0.0.0.0", auth=False)
    port = serve.http_url.rsplit(":", 1)[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        assert http.get("/admin/v2/brokers/health").text == "ok"
        foreign = http.get("/admin/v2/brokers/health", headers={"Host": f"rebound.attacker.example:{port}"})
        assert foreign.status_code == 403 and "--http-allowed-hosts" in foreign.json()["reason"]
    assert serve.terminate() == 0
    warnings = [line for line in serve.log_path.read_text().splitlines() if "not a loopback address" in line]
    assert len(warnings) == 1 and "0.0.0.0" in warnings[0]
