"""Authentication and authorization in the broker core and on both doors, without sockets.

The Pulsar side drives ``ServerConnection`` through the wire harness over a real broker
(``PulsarBroker`` on a tmp data dir); the REST side sends requests through
``httpx.ASGITransport`` to the real application built on that broker. Grants live in the
real SQLite metadata database, so their persistence is checked by reopening the data dir.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.auth.rest import HostAllowListMiddleware, host_of
from api.auth.tokens import create_secret_key, create_token
from api.broker.access import AccessControl, AuthorizationError, Credentials, exposure_warning
from api.broker.grants import GrantStore
from api.config import Settings
from api.http import HEALTH_PATH, create_app
from api.wire.frames import make_command
from api.wire.listener import PulsarBroker
from ledger.data_dir import DataDir
from ledger.database import Database
from message.proto import pulsar_api_pb2 as pb
from tests.unit.api.wire.harness import T, Wire, broker_service

TOPIC = "persistent://public/default/guarded"


@pytest.fixture
def key_url(tmp_path: Path) -> str:
    path = tmp_path / "secret.key"
    path.write_bytes(create_secret_key())
    return f"file://{path}"


def _settings(key_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"authentication_enabled": True, "authorization_enabled": True,
                              "token_secret_key": key_url, "super_user_roles": ("admin",),
                              "compaction_monitor_interval_seconds": 0}
    values.update(overrides)
    return Settings(**values)


def _connect(broker: PulsarBroker, method: str = "", data: str | None = None) -> tuple[Wire, list[Any]]:
    wire = Wire(broker, connect=False)
    connect = pb.CommandConnect(client_version="test", protocol_version=20, auth_method_name=method)
    if data is not None:
        connect.auth_data = data.encode()
    return wire, wire.request(make_command(connect))


def _producer(wire: Wire, topic: str = TOPIC, request_id: int = 1) -> Any:
    return wire.request(make_command(pb.CommandProducer(topic=topic, producer_id=request_id,
                                                        request_id=request_id)))[0]


async def _subscribe(wire: Wire, topic: str = TOPIC, request_id: int = 2) -> Any:
    """SUBSCRIBE's answer (a success comes once the new cursor is durable)."""
    return (await wire.request_durable(make_command(pb.CommandSubscribe(
        topic=topic, subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=request_id,
        request_id=request_id))))[0]


def _run(tmp_path: Path, settings: Settings, body: Callable[[PulsarBroker], Awaitable[None]]) -> None:
    async def main() -> None:
        with broker_service(tmp_path / "data", settings) as broker:
            await body(broker)

    asyncio.run(main())


# -- the Pulsar port -------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "data", "reason"), [
    ("", None, "auth method 'none' is not accepted"),
    ("token", None, "no token was given"),
    ("token", "not-a-jwt", "the token is malformed"),
    ("basic", "user:password", "auth method 'basic' is not accepted"),
    ("tls", None, "no trusted client certificate"),
])
def test_a_connect_without_a_valid_credential_is_refused_and_closed(
        tmp_path: Path, key_url: str, method: str, data: str | None, reason: str) -> None:
    async def body(broker: PulsarBroker) -> None:
        wire, answers = _connect(broker, method, data)
        assert [frame.type for frame in answers] == [T.ERROR]
        error = answers[0].command.error
        assert error.error == pb.AuthenticationError
        assert reason in error.message and (data is None or data not in error.message)
        assert wire.closed
        assert wire.request(make_command(pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1))) == []
        await asyncio.sleep(0)
        assert broker.registry.loaded == {} and broker.list_topics("public/default") == []

    _run(tmp_path, _settings(key_url), body)


def test_expired_and_foreign_tokens_are_refused(tmp_path: Path, key_url: str) -> None:
    other = tmp_path / "other.key"
    other.write_bytes(create_secret_key())
    expired = create_token("admin", secret_key_url=key_url, expiry_s=1, now=0)
    foreign = create_token("admin", secret_key_url=f"file://{other}")

    async def body(broker: PulsarBroker) -> None:
        for token, reason in ((expired, "expired"), (foreign, "signature")):
            wire, answers = _connect(broker, "token", token)
            assert answers[0].command.error.error == pb.AuthenticationError
            assert reason in answers[0].command.error.message and wire.closed

    _run(tmp_path, _settings(key_url), body)


def test_a_role_needs_a_grant_to_produce_or_consume(tmp_path: Path, key_url: str) -> None:
    alice = create_token("alice", secret_key_url=key_url)

    async def body(broker: PulsarBroker) -> None:
        wire, answers = _connect(broker, "token", alice)
        assert [frame.type for frame in answers] == [T.CONNECTED]
        refused = _producer(wire)
        assert refused.type == T.ERROR and refused.command.error.error == pb.AuthorizationError
        assert "'alice' is not authorized to produce" in refused.command.error.message
        refused = await _subscribe(wire)
        assert refused.command.error.error == pb.AuthorizationError
        assert broker.list_topics("public/default") == []  # nothing was created
        assert broker.access.grants is not None
        broker.access.grants.grant("public/default", "alice", ["produce"])
        assert _producer(wire, request_id=3).type == T.PRODUCER_SUCCESS
        assert (await _subscribe(wire, request_id=4)).command.error.error == pb.AuthorizationError
        broker.access.grants.grant(TOPIC, "alice", ["consume"])
        assert (await _subscribe(wire, request_id=5)).type == T.SUCCESS
        listing = make_command(pb.CommandGetTopicsOfNamespace(request_id=6, namespace="public/default"))
        assert wire.request(listing)[0].command.error.error == pb.AuthorizationError
        broker.access.grants.grant("public/default", "alice", ["produce", "consume"])
        assert wire.request(listing)[0].command.getTopicsOfNamespaceResponse.topics == [TOPIC]
        assert not wire.closed

    _run(tmp_path, _settings(key_url), body)


def test_a_super_user_needs_no_grant_and_without_authorization_any_role_may(tmp_path: Path,
                                                                           key_url: str) -> None:
    async def body(broker: PulsarBroker) -> None:
        wire, _ = _connect(broker, "token", create_token("admin", secret_key_url=key_url))
        assert _producer(wire).type == T.PRODUCER_SUCCESS

    _run(tmp_path, _settings(key_url), body)

    async def open_body(broker: PulsarBroker) -> None:
        wire, _ = _connect(broker, "token", create_token("anyone", secret_key_url=key_url))
        assert _producer(wire, "persistent://public/default/other").type == T.PRODUCER_SUCCESS

    _run(tmp_path / "second", _settings(key_url, authorization_enabled=False), open_body)


def test_authentication_off_admits_every_client_as_before(tmp_path: Path) -> None:
    async def body(broker: PulsarBroker) -> None:
        wire, answers = _connect(broker)
        assert [frame.type for frame in answers] == [T.CONNECTED]
        assert _producer(wire).type == T.PRODUCER_SUCCESS

    _run(tmp_path, Settings(compaction_monitor_interval_seconds=0), body)


# -- grants --------------------------------------------------------------------------------

def test_grants_persist_and_cover_namespace_topic_and_partitions(tmp_path: Path, key_url: str) -> None:
    settings = _settings(key_url)
    database = Database(str(tmp_path / "metadata.db"))
    grants = GrantStore(database)
    grants.grant("public/default", "reader", ["consume"])
    grants.grant("persistent://public/default/orders", "writer", ["produce", "consume"])
    database.close()

    access = AccessControl(settings, GrantStore(Database(str(tmp_path / "metadata.db"))))
    assert access.grants is not None
    assert access.grants.of_scope("public/default") == {"reader": ["consume"]}
    access.check_topic("reader", "persistent://public/default/anything", "consume")
    access.check_topic("writer", "persistent://public/default/orders-partition-3", "produce")
    access.check_topic("admin", "persistent://other/ns/t", "produce")
    for role, topic, action in (("reader", "persistent://public/default/t", "produce"),
                                ("writer", "persistent://public/default/orders2", "produce"),
                                ("reader", "persistent://public/other/t", "consume"),
                                (None, "persistent://public/default/t", "consume")):
        with pytest.raises(AuthorizationError):
            access.check_topic(role, topic, action)
    assert access.grants.revoke("public/default", "reader")
    assert not access.grants.revoke("public/default", "reader")
    with pytest.raises(AuthorizationError):
        access.check_topic("reader", "persistent://public/default/anything", "consume")


def test_a_topics_grants_go_with_the_topic(tmp_path: Path, key_url: str) -> None:
    async def body(broker: PulsarBroker) -> None:
        assert broker.access.grants is not None
        broker.get_topic(TOPIC)
        broker.access.grants.grant(TOPIC, "alice", ["produce"])
        broker.access.grants.grant("public/default", "bob", ["consume"])
        await broker.admin.delete_topic(TOPIC)
        assert broker.access.grants.of_scope(TOPIC) == {}
        assert broker.access.grants.of_scope("public/default") == {"bob": ["consume"]}

    _run(tmp_path, _settings(key_url), body)


def test_tls_credentials_name_the_certificate_cn(key_url: str) -> None:
    access = AccessControl(_settings(key_url), None)
    assert access.authenticate(Credentials("tls", "", "client-7")) == "client-7"


# -- the admin port ----------------------------------------------------------------------------

def _rest(tmp_path: Path, settings: Settings,
          body: Callable[[PulsarBroker, httpx.AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        with broker_service(tmp_path / "data", settings) as broker:
            transport = httpx.ASGITransport(app=create_app(settings, broker=broker))
            async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as client:
                await body(broker, client)

    asyncio.run(main())


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_rest_needs_a_bearer_token_except_for_health(tmp_path: Path, key_url: str) -> None:
    admin = create_token("admin", secret_key_url=key_url)
    expired = create_token("admin", secret_key_url=key_url, expiry_s=1, now=0)

    async def body(broker: PulsarBroker, client: httpx.AsyncClient) -> None:
        assert (await client.get(HEALTH_PATH)).text == "ok"
        for headers in ({}, _bearer("garbage"), _bearer(expired), {"Authorization": f"Basic {admin}"}):
            response = await client.get("/admin/v2/persistent/public/default", headers=headers)
            assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
            assert "Unable to authenticate" in response.json()["reason"]
            assert admin not in response.text and expired not in response.text
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/admin/v2/persistent/public/default", headers=_bearer(admin))).json() == []

    _rest(tmp_path, _settings(key_url), body)


def test_admin_routes_answer_403_to_a_role_that_is_not_a_super_user(tmp_path: Path, key_url: str) -> None:
    alice = create_token("alice", secret_key_url=key_url)
    requests = [("GET", "/admin/v2/persistent/public/default"), ("PUT", "/admin/v2/persistent/public/default/t"),
                ("PUT", "/admin/v2/persistent/public/default/t/compaction"),
                ("POST", "/admin/v2/namespaces/public/default/compactionThreshold"),
                ("DELETE", "/admin/v2/persistent/public/default/t"),
                ("POST", "/admin/v2/namespaces/public/default/permissions/alice"),
                ("GET", "/admin/v2/tenants"), ("GET", "/admin/v2/some/route/added/later")]

    async def body(broker: PulsarBroker, client: httpx.AsyncClient) -> None:
        for method, path in requests:
            response = await client.request(method, path, headers=_bearer(alice), json=["produce"])
            assert response.status_code == 403, (method, path, response.text)
            assert "super-users only" in response.json()["reason"]
        assert broker.list_topics("public/default") == []
        assert (await client.get("/metrics", headers=_bearer(alice))).status_code == 200

    _rest(tmp_path, _settings(key_url), body)


def test_permissions_routes_grant_list_and_revoke(tmp_path: Path, key_url: str) -> None:
    admin = _bearer(create_token("admin", secret_key_url=key_url))
    namespace = "/admin/v2/namespaces/public/default/permissions"
    topic = "/admin/v2/persistent/public/default/orders/permissions"

    async def body(broker: PulsarBroker, client: httpx.AsyncClient) -> None:
        assert (await client.post(f"{namespace}/alice", json=["produce", "consume"], headers=admin)).status_code == 204
        assert (await client.post(f"{topic}/bob", json=["consume"], headers=admin)).status_code == 204
        assert (await client.get(namespace, headers=admin)).json() == {"alice": ["consume", "produce"]}
        assert (await client.get(topic, headers=admin)).json() == {"bob": ["consume"]}
        refused = await client.post(f"{namespace}/carol", json=["produce", "functions"], headers=admin)
        assert refused.status_code == 400 and "'functions'" in refused.json()["reason"]
        assert (await client.post(f"{namespace}/carol", json="produce", headers=admin)).status_code == 400
        bad = await client.get("/admin/v2/namespaces/pub%0Alic/default/permissions", headers=admin)
        assert bad.status_code == 412
        assert (await client.delete(f"{namespace}/alice", headers=admin)).status_code == 204
        assert (await client.get(namespace, headers=admin)).json() == {}
        broker.access.check_topic("bob", "persistent://public/default/orders", "consume")

    _rest(tmp_path, _settings(key_url), body)


def test_without_authentication_rest_is_open_as_before(tmp_path: Path) -> None:
    async def body(broker: PulsarBroker, client: httpx.AsyncClient) -> None:
        assert (await client.get("/admin/v2/persistent/public/default")).json() == []
        assert (await client.get("/admin/v2/namespaces/public/default/permissions")).json() == {}

    _rest(tmp_path, Settings(compaction_monitor_interval_seconds=0), body)


# -- Host allow-list, exposure warning, file modes -----------------------------------------------

@pytest.mark.parametrize(("bind", "allowed", "header", "served"), [
    ("127.0.0.1", (), "127.0.0.1:8080", True),
    ("127.0.0.1", (), "localhost:8080", True),
    ("127.0.0.1", (), "[::1]:8080", True),
    ("127.0.0.1", (), "evil.example:8080", False),
    ("127.0.0.1", (), "10.1.2.3:8080", False),
    ("127.0.0.1", (), None, False),
    ("127.0.0.1", ("broker.example",), "Broker.Example:8080", True),
    ("127.0.0.1", ("*",), "anything.example", True),
    ("0.0.0.0", (), "10.1.2.3:8080", True),
    ("0.0.0.0", (), "rebound.evil.example", False),
    ("10.0.0.5", (), "10.0.0.5", True),
    # the authority is parsed exactly (issue 25): userinfo, ports, IPv6 literals
    ("127.0.0.1", (), "127.0.0.1:80@attacker.example", False),
    ("127.0.0.1", (), "user@127.0.0.1", False),
    ("127.0.0.1", (), "localhost:80@attacker.example:80", False),
    ("127.0.0.1", (), "127.0.0.1:8080:80", False),
    ("127.0.0.1", (), "127.0.0.1:+80", False),
    ("127.0.0.1", (), "127.0.0.1:99999", False),
    ("127.0.0.1", (), "127.0.0.1:", False),
    ("127.0.0.1", (), "127.0.0.1/evil", False),
    ("127.0.0.1", (), "127.0.0.1#evil.example", False),
    ("127.0.0.1", (), "127.0.0.1 evil.example", False),
    ("127.0.0.1", (), "%6c%6fcalhost", False),
    ("127.0.0.1", (), "[::1]", True),
    ("127.0.0.1", (), "::1", False),
    ("127.0.0.1", (), "[::1]evil.example", False),
    ("127.0.0.1", (), "[localhost]:8080", False),
    ("127.0.0.1", (), "[127.0.0.1]", False),
    ("127.0.0.1", (), "", False),
    ("0.0.0.0", (), "[2001:db8::1]:8080", True),
    ("0.0.0.0", (), "10.1.2.3@rebound.evil.example", False),
    ("127.0.0.1", ("broker.example",), "broker.example@evil.example", False),
])
def test_the_host_allow_list(bind: str, allowed: tuple[str, ...], header: str | None, served: bool) -> None:
    async def ok(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not called")

    assert HostAllowListMiddleware(ok, bind, allowed).allows(header) is served


def test_a_refused_host_answers_403_before_the_application() -> None:
    app = HostAllowListMiddleware(create_app(), "127.0.0.1", ())

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://attacker.example") as client:
            response = await client.get(HEALTH_PATH)
            assert response.status_code == 403 and "--http-allowed-hosts" in response.json()["reason"]
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
            assert (await client.get(HEALTH_PATH)).text == "ok"

    asyncio.run(main())
    assert host_of("[::1]:80") == "::1" and host_of("Example.COM") == "example.com"


@pytest.mark.parametrize(("bind", "authentication", "warned"), [
    ("127.0.0.1", False, False), ("::1", False, False), ("localhost", False, False),
    ("0.0.0.0", False, True), ("10.0.0.5", False, True), ("0.0.0.0", True, False),
])
def test_one_warning_when_listening_beyond_loopback_without_authentication(
        bind: str, authentication: bool, warned: bool) -> None:
    settings = Settings(bind=bind, authentication_enabled=authentication,
                        token_secret_key="data:,k" if authentication else None)
    warning = exposure_warning(settings)
    assert (warning is not None) is warned
    if warning is not None:
        assert bind in warning and "authentication off" in warning


def test_data_files_and_directories_are_owner_only(tmp_path: Path) -> None:
    data_dir = DataDir.open(str(tmp_path / "data"))
    try:
        ledger_id = data_dir.ledgers.create()
        data_dir.ledgers.append(ledger_id, b"private").result(timeout=10)
        data_dir.metadata.next_counter("x")
    finally:
        data_dir.close()
    modes = {}
    for root, directories, files in os.walk(tmp_path / "data"):
        for name in directories + files:
            path = Path(root) / name
            modes[str(path.relative_to(tmp_path / "data"))] = stat.S_IMODE(path.stat().st_mode)
    modes["."] = stat.S_IMODE((tmp_path / "data").stat().st_mode)
    assert any(name.startswith("ledgers/") for name in modes) and "metadata.db" in modes
    for name, mode in modes.items():
        assert mode & 0o077 == 0, (name, oct(mode))
