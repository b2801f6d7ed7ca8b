"""Authorization on every door (issue 25): each command of the Pulsar port and each REST
route × {super-user, granted role, ungranted role, no token}, against one real
``compactd serve`` with ``--authentication-enabled --authorization-enabled``.

The tables are the rule. ``WIRE`` has a row for every command the connection handles
(``api.wire.connection.HANDLERS``) and ``REST`` one for every route of the application
(``create_app``'s routes); ``test_every_command_and_route_has_a_row`` fails when one is
added without a row. Roles: ``admin`` (super-user), ``producer`` (produce on the topic),
``consumer`` (consume on the namespace), ``stranger`` (no grant), and no token at all.

* ``test_wire_command_admission`` drives each command with raw frames (the real client
  cannot send GET_SCHEMA, GET_OR_CREATE_SCHEMA or a lone LOOKUP), reading the command's own
  answer: admitted, or AuthorizationError in it. A command on a producer or consumer id is
  covered by the grant PRODUCER or SUBSCRIBE checked: it is sent after its parent, and a
  role refused the parent gets nothing of the topic from it.
* ``test_without_a_token_nothing_passes_connect`` — every command sent after a tokenless
  CONNECT goes unanswered: CONNECT is refused with AuthenticationError and the connection
  closed.
* ``test_real_client_admission`` — PARTITIONED_METADATA, LOOKUP + PRODUCER and SUBSCRIBE
  through ``pulsar.Client``: a refusal raises ``pulsar.AuthorizationError`` at once.
* ``test_rest_route_admission`` — every route with each role's token (and none): 401
  without a token, 403 where the role is not admitted, anything else where it is.
* ``test_an_ungranted_role_cannot_register_a_schema`` — the issue's case: a stranger's
  GET_OR_CREATE_SCHEMA on a fresh topic is refused and registers nothing, so the owner's
  producer with its own schema is then accepted.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.routing import Mount

from api.auth.tokens import create_token
from api.config import Settings
from api.http import create_app
from api.routers import ROUTERS
from api.wire.connection import HANDLERS
from api.wire.frames import FrameDecoder, encode_command, encode_payload_command, make_command
from message.proto import pulsar_api_pb2 as pb
from tests.serve_process import ServeProcess

pulsar = pytest.importorskip("pulsar")

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a broker process and a few hundred requests

T = pb.BaseCommand
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
ANSWER_TIMEOUT_S = 10.0  # an answer the broker owes comes within this
TENANT, NAMESPACE, LOCAL = "public", "default", "guarded"
TOPIC = f"persistent://{TENANT}/{NAMESPACE}/{LOCAL}"
ROLES = ("admin", "producer", "consumer", "stranger")  # each with a token; plus None: no token
GRANTS = {"admin": {"produce", "consume"}, "producer": {"produce"}, "consumer": {"consume"}, "stranger": set()}
STRING_SCHEMA = pb.Schema(name="String", schema_data=b"", type=pb.Schema.String)


@dataclass(frozen=True)
class Broker:
    serve: ServeProcess
    tokens: dict[str, str]

    @property
    def port(self) -> int:
        return int(self.serve.broker_url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker for the module: grants made, the topic holding one message and a STRING schema."""
    directory = tmp_path_factory.mktemp("authz")
    secret = directory / "secret.key"
    secret.write_bytes(os.urandom(32))
    url = f"file://{secret}"
    serve = ServeProcess(directory / "data", directory / "serve.log", "--fsync", "none", "--authentication-enabled",
                         "--authorization-enabled", "--token-secret-key", url, "--super-user-roles", "admin")
    tokens = {role: create_token(role, secret_key_url=url) for role in ROLES}
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    try:
        with httpx.Client(base_url=serve.http_url, headers=admin, timeout=10) as http:
            base = f"/admin/v2/persistent/{TENANT}/{NAMESPACE}/{LOCAL}"
            assert http.put(base).status_code == 204
            assert http.post(f"{base}/permissions/producer", json=["produce"]).status_code == 204
            assert http.post(f"/admin/v2/namespaces/{TENANT}/{NAMESPACE}/permissions/consumer",
                             json=["consume"]).status_code == 204
            schema = http.post(f"/admin/v2/schemas/{TENANT}/{NAMESPACE}/{LOCAL}/schema",
                               json={"type": "STRING", "schema": "", "properties": {}})
            assert schema.status_code == 200, schema.text
        client = pulsar.Client(serve.broker_url, logger=QUIET, operation_timeout_seconds=10,
                               authentication=pulsar.AuthenticationToken(tokens["admin"]))
        try:
            client.create_producer(TOPIC, schema=pulsar.schema.StringSchema()).send("first")
        finally:
            client.close()
        yield Broker(serve, tokens)
    finally:
        serve.terminate()


# -- raw frames ----------------------------------------------------------------------------


class Raw:
    """A hand-written Pulsar connection; CONNECT with ``token`` (None: no auth method)."""

    def __init__(self, port: int, token: str | None, *, pipelined: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
        self.decoder = FrameDecoder()
        self.frames: list[Any] = []
        self.closed = False
        connect = pb.CommandConnect(client_version="authz-table", protocol_version=20)
        if token is not None:
            connect.auth_method_name, connect.auth_data = "token", token.encode()
        self.sock.sendall(encode_command(make_command(connect)) + pipelined)

    def send(self, command: pb.BaseCommand, payload: bytes | None = None) -> None:
        self.sock.sendall(encode_command(command) if payload is None else encode_payload_command(command, payload))

    def next(self, timeout_s: float = ANSWER_TIMEOUT_S) -> pb.BaseCommand | None:
        """The next command from the broker (PINGs answered), or None once it closed."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self.frames:
                frame = self.frames.pop(0)
                if frame.type == T.PING:
                    self.send(make_command(pb.CommandPong()))
                    continue
                return frame.command
            if self.closed:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer from the broker")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                self.closed = True
                continue
            self.frames.extend(self.decoder.feed(data))

    def until(self, done: Callable[[pb.BaseCommand], bool]) -> list[pb.BaseCommand]:
        """Every command up to and including the first that is ``done``."""
        seen = []
        while True:
            command = self.next()
            assert command is not None, f"the broker closed the connection after {seen}"
            seen.append(command)
            if done(command):
                return seen

    def barrier(self) -> list[pb.BaseCommand]:
        """What came before the PONG to a PING sent now (for commands without an answer)."""
        self.send(make_command(pb.CommandPing()))
        return self.until(lambda c: c.type == T.PONG)[:-1]

    def close(self) -> None:
        self.sock.close()


AUTHZ = pb.AuthorizationError


def _request_answer(raw: Raw, request_id: int) -> pb.BaseCommand:
    def answers(c: pb.BaseCommand) -> bool:
        for field in ("success", "error", "producer_success", "partitionMetadataResponse", "lookupTopicResponse",
                      "getSchemaResponse", "getOrCreateSchemaResponse", "getTopicsOfNamespaceResponse",
                      "getLastMessageIdResponse"):
            if c.HasField(field) and getattr(c, field).request_id == request_id:
                return True
        return False
    return raw.until(answers)[-1]


def _verdict(answer: pb.BaseCommand) -> str:
    """"admitted" or "refused" (AuthorizationError in the command's own answer)."""
    if answer.type == T.ERROR:
        return "refused" if answer.error.error == AUTHZ else f"error {pb.ServerError.Name(answer.error.error)}"
    for field in ("partitionMetadataResponse", "lookupTopicResponse"):
        if answer.HasField(field):
            body = getattr(answer, field)
            if body.HasField("error"):
                return "refused" if body.error == AUTHZ else f"error {pb.ServerError.Name(body.error)}"
            return "admitted"
    for field in ("getSchemaResponse", "getOrCreateSchemaResponse"):
        if answer.HasField(field):
            body = getattr(answer, field)
            if body.HasField("error_code"):
                return "refused" if body.error_code == AUTHZ else f"error {pb.ServerError.Name(body.error_code)}"
            return "admitted"
    return "admitted"


_ids = iter(range(1, 1 << 30))


def _producer(raw: Raw) -> tuple[int, str]:
    producer_id, request_id = next(_ids), next(_ids)
    raw.send(make_command(pb.CommandProducer(topic=TOPIC, producer_id=producer_id, request_id=request_id,
                                             schema=STRING_SCHEMA)))
    return producer_id, _verdict(_request_answer(raw, request_id))


def _consumer(raw: Raw) -> tuple[int, str]:
    consumer_id, request_id = next(_ids), next(_ids)
    raw.send(make_command(pb.CommandSubscribe(
        topic=TOPIC, subscription=f"sub-{consumer_id}", subType=pb.CommandSubscribe.Exclusive,
        consumer_id=consumer_id, request_id=request_id, initialPosition=pb.CommandSubscribe.Earliest)))
    return consumer_id, _verdict(_request_answer(raw, request_id))


def _request(build: Callable[[int], Any]) -> Callable[[Raw], str]:
    def drive(raw: Raw) -> str:
        request_id = next(_ids)
        raw.send(make_command(build(request_id)))
        return _verdict(_request_answer(raw, request_id))
    return drive


def _on_producer(then: Callable[[Raw, int, bool], bool]) -> Callable[[Raw], str]:
    """A command on a producer id, covered by PRODUCER's grant: when PRODUCER was admitted
    the command works (``then`` True), when it was refused the command reaches nothing."""
    def drive(raw: Raw) -> str:
        producer_id, verdict = _producer(raw)
        assert then(raw, producer_id, verdict == "admitted") == (verdict == "admitted"), verdict
        return verdict
    return drive


def _on_consumer(then: Callable[[Raw, int, bool], bool]) -> Callable[[Raw], str]:
    """The same for a command on a consumer id, covered by SUBSCRIBE's grant."""
    def drive(raw: Raw) -> str:
        consumer_id, verdict = _consumer(raw)
        assert then(raw, consumer_id, verdict == "admitted") == (verdict == "admitted"), verdict
        return verdict
    return drive


def _entry(producer_id: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name=f"p-{producer_id}", sequence_id=0, publish_time=1).SerializeToString()
    return len(metadata).to_bytes(4, "big") + metadata + b"x"


def _send(raw: Raw, producer_id: int, admitted: bool = True) -> bool:
    raw.send(make_command(pb.CommandSend(producer_id=producer_id, sequence_id=0, num_messages=1)), _entry(producer_id))
    return raw.until(lambda c: c.type in (T.SEND_RECEIPT, T.SEND_ERROR))[-1].type == T.SEND_RECEIPT


def _send_then_close(raw: Raw, producer_id: int, admitted: bool) -> bool:
    sent = _send(raw, producer_id)
    request_id = next(_ids)
    raw.send(make_command(pb.CommandCloseProducer(producer_id=producer_id, request_id=request_id)))
    assert _request_answer(raw, request_id).type == T.SUCCESS
    assert not _send(raw, producer_id)  # closed, or never made
    return sent


def _flow(raw: Raw, consumer_id: int, admitted: bool) -> bool:
    """FLOW: a message comes (the topic holds some), or — for a refused role — nothing
    before the PONG to a PING sent after it."""
    raw.send(make_command(pb.CommandFlow(consumer_id=consumer_id, messagePermits=10)))
    if admitted:
        return bool(raw.until(lambda c: c.type == T.MESSAGE))
    return any(c.type == T.MESSAGE for c in raw.barrier())


def _ack(raw: Raw, consumer_id: int, admitted: bool) -> bool:
    """ACK after FLOW: answered ACK_RESPONSE either way; it acts on a consumer only if one was made."""
    delivered = _flow(raw, consumer_id, admitted)
    request_id = next(_ids)
    raw.send(make_command(pb.CommandAck(consumer_id=consumer_id, ack_type=pb.CommandAck.Individual,
                                        message_id=[pb.MessageIdData(ledgerId=0, entryId=0)], request_id=request_id)))
    raw.until(lambda c: c.type == T.ACK_RESPONSE)
    return delivered and _has(raw, consumer_id)


def _redeliver(raw: Raw, consumer_id: int, admitted: bool) -> bool:
    delivered = _flow(raw, consumer_id, admitted)
    raw.send(make_command(pb.CommandRedeliverUnacknowledgedMessages(consumer_id=consumer_id)))
    if admitted:
        return delivered and bool(raw.until(lambda c: c.type == T.MESSAGE))  # the same message again
    return delivered or any(c.type == T.MESSAGE for c in raw.barrier())


def _has(raw: Raw, consumer_id: int) -> bool:
    """Whether ``consumer_id`` is a consumer of this connection: GET_LAST_MESSAGE_ID answers it."""
    request_id = next(_ids)
    raw.send(make_command(pb.CommandGetLastMessageId(consumer_id=consumer_id, request_id=request_id)))
    return _request_answer(raw, request_id).type == T.GET_LAST_MESSAGE_ID_RESPONSE


def _request_on_consumer(build: Callable[[int, int], Any], answered: int) -> Callable[[Raw, int, bool], bool]:
    def then(raw: Raw, consumer_id: int, admitted: bool) -> bool:
        request_id = next(_ids)
        raw.send(make_command(build(consumer_id, request_id)))
        return _request_answer(raw, request_id).type == answered
    return then


def _close_consumer(raw: Raw, consumer_id: int, admitted: bool) -> bool:
    had = _has(raw, consumer_id)
    request_id = next(_ids)
    raw.send(make_command(pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=request_id)))
    assert _request_answer(raw, request_id).type == T.SUCCESS
    return had and not _has(raw, consumer_id)


def _no_topic(build: Callable[[], Any], answer: int | None) -> Callable[[Raw], str]:
    def drive(raw: Raw) -> str:
        raw.send(make_command(build()))
        if answer is not None:
            assert [c.type for c in raw.until(lambda c: c.type == answer)] == [answer]
        assert raw.barrier() == []  # nothing else, no ERROR
        return "admitted"
    return drive


@dataclass(frozen=True)
class WireRow:
    needs: str  # who is admitted: "any role", "produce", "consume", "produce or consume", "consume on namespace"
    drive: Callable[[Raw], str]


_LOOKUP = "produce or consume"
WIRE: dict[int, WireRow] = {
    T.CONNECT: WireRow("any role (its token is what CONNECT checks)", lambda raw: "admitted"),
    T.PING: WireRow("any role: names no topic", _no_topic(pb.CommandPing, T.PONG)),
    T.PONG: WireRow("any role: names no topic", _no_topic(pb.CommandPong, None)),
    T.PARTITIONED_METADATA: WireRow(_LOOKUP, _request(
        lambda r: pb.CommandPartitionedTopicMetadata(topic=TOPIC, request_id=r))),
    T.LOOKUP: WireRow(_LOOKUP, _request(lambda r: pb.CommandLookupTopic(topic=TOPIC, request_id=r))),
    T.GET_SCHEMA: WireRow(_LOOKUP, _request(lambda r: pb.CommandGetSchema(topic=TOPIC, request_id=r))),
    T.GET_OR_CREATE_SCHEMA: WireRow("produce", _request(
        lambda r: pb.CommandGetOrCreateSchema(topic=TOPIC, request_id=r, schema=STRING_SCHEMA))),
    T.PRODUCER: WireRow("produce", lambda raw: _producer(raw)[1]),
    T.SUBSCRIBE: WireRow("consume", lambda raw: _consumer(raw)[1]),
    T.GET_TOPICS_OF_NAMESPACE: WireRow("consume on namespace", _request(
        lambda r: pb.CommandGetTopicsOfNamespace(namespace=f"{TENANT}/{NAMESPACE}", request_id=r))),
    # Commands on a producer (consumer) id: the grant PRODUCER (SUBSCRIBE) checked covers them.
    T.SEND: WireRow("produce", _on_producer(_send)),
    T.CLOSE_PRODUCER: WireRow("produce", _on_producer(_send_then_close)),
    T.FLOW: WireRow("consume", _on_consumer(_flow)),
    T.ACK: WireRow("consume", _on_consumer(_ack)),
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: WireRow("consume", _on_consumer(_redeliver)),
    T.SEEK: WireRow("consume", _on_consumer(_request_on_consumer(
        lambda c, r: pb.CommandSeek(consumer_id=c, request_id=r, message_id=pb.MessageIdData(ledgerId=0, entryId=0)),
        T.SUCCESS))),
    T.GET_LAST_MESSAGE_ID: WireRow("consume", _on_consumer(_request_on_consumer(
        lambda c, r: pb.CommandGetLastMessageId(consumer_id=c, request_id=r), T.GET_LAST_MESSAGE_ID_RESPONSE))),
    T.UNSUBSCRIBE: WireRow("consume", _on_consumer(_request_on_consumer(
        lambda c, r: pb.CommandUnsubscribe(consumer_id=c, request_id=r), T.SUCCESS))),
    T.CLOSE_CONSUMER: WireRow("consume", _on_consumer(_close_consumer)),
}


_ZERO = pb.MessageIdData(ledgerId=0, entryId=0)
# What follows a tokenless CONNECT, one per command (CONNECT's: a LOOKUP).
NO_TOKEN_PROBES: dict[int, Any] = {
    T.CONNECT: pb.CommandLookupTopic(topic=TOPIC, request_id=1), T.PING: pb.CommandPing(), T.PONG: pb.CommandPong(),
    T.PARTITIONED_METADATA: pb.CommandPartitionedTopicMetadata(topic=TOPIC, request_id=1),
    T.LOOKUP: pb.CommandLookupTopic(topic=TOPIC, request_id=1),
    T.GET_SCHEMA: pb.CommandGetSchema(topic=TOPIC, request_id=1),
    T.GET_OR_CREATE_SCHEMA: pb.CommandGetOrCreateSchema(topic=TOPIC, request_id=1, schema=STRING_SCHEMA),
    T.PRODUCER: pb.CommandProducer(topic=TOPIC, producer_id=1, request_id=1),
    T.SUBSCRIBE: pb.CommandSubscribe(topic=TOPIC, subscription="s", subType=pb.CommandSubscribe.Exclusive,
                                     consumer_id=1, request_id=1),
    T.GET_TOPICS_OF_NAMESPACE: pb.CommandGetTopicsOfNamespace(namespace=f"{TENANT}/{NAMESPACE}", request_id=1),
    T.SEND: pb.CommandSend(producer_id=1, sequence_id=0), T.FLOW: pb.CommandFlow(consumer_id=1, messagePermits=1),
    T.ACK: pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual, message_id=[_ZERO]),
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: pb.CommandRedeliverUnacknowledgedMessages(consumer_id=1),
    T.SEEK: pb.CommandSeek(consumer_id=1, request_id=1, message_id=_ZERO),
    T.GET_LAST_MESSAGE_ID: pb.CommandGetLastMessageId(consumer_id=1, request_id=1),
    T.UNSUBSCRIBE: pb.CommandUnsubscribe(consumer_id=1, request_id=1),
    T.CLOSE_PRODUCER: pb.CommandCloseProducer(producer_id=1, request_id=1),
    T.CLOSE_CONSUMER: pb.CommandCloseConsumer(consumer_id=1, request_id=1),
}


def _admitted(role: str, needs: str) -> bool:
    if role == "admin" or needs.startswith("any role"):
        return True
    if needs == "consume on namespace":
        return role == "consumer"  # its grant is on the namespace; the producer's on the topic
    return bool(GRANTS[role] & set(needs.split(" or ")))


# -- REST ----------------------------------------------------------------------------------

_PARAMS = {"tenant": TENANT, "namespace": NAMESPACE, "topic": LOCAL, "domain": "persistent", "role": "nobody",
           "subscription": "nosub", "version": "0", "timestamp": "0", "messagePosition": "1", "path": "x"}
# The super-user acts on names of its own: what it deletes or changes there harms no other row.
_SUPER_PARAMS = {**_PARAMS, "tenant": "scratch", "namespace": "scratch", "topic": "scratch"}
_NAMESPACE = "/admin/v2/namespaces/{tenant}/{namespace}"
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
_SCHEMA = "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema"
# Who each route admits, with authorization on. Pulsar's rule carried over: looking a
# topic up (lookup, partitioned metadata, reading its schema) needs produce or consume,
# uploading a schema produce; deleting a schema is a tenant admin's (compactd has none).
REST: dict[tuple[str, str], str] = {
    ("GET", "/admin/v2/brokers/health"): "everyone",
    **{("GET", path): "any role" for path in ("/metrics", "/docs", "/docs/oauth2-redirect", "/redoc",
                                               "/openapi.json")},
    ("GET", "/static-offline-docs/{path}"): "super-user",  # the docs' assets (a browser sends no token)
    ("GET", _SCHEMA): _LOOKUP,
    ("GET", _SCHEMA + "/{version}"): _LOOKUP,
    ("POST", _SCHEMA): "produce",
    ("DELETE", _SCHEMA): "super-user",
    ("GET", _TOPIC + "/partitions"): _LOOKUP,
    ("GET", "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}"): _LOOKUP,
    **{route: "super-user" for route in (
    ("GET", "/admin/v2/clusters"),
    ("POST", "/admin/v2/compactd/backup"),
    ("GET", "/admin/v2/namespaces/{tenant}"),
    ("DELETE", _NAMESPACE),
    ("PUT", _NAMESPACE),
    ("DELETE", _NAMESPACE + "/compactionMaxBytesPerSecond"),
    ("GET", _NAMESPACE + "/compactionMaxBytesPerSecond"),
    ("POST", _NAMESPACE + "/compactionMaxBytesPerSecond"),
    ("DELETE", _NAMESPACE + "/compactionThreshold"),
    ("GET", _NAMESPACE + "/compactionThreshold"),
    ("POST", _NAMESPACE + "/compactionThreshold"),
    ("DELETE", _NAMESPACE + "/deduplicationEnabled"),
    ("GET", _NAMESPACE + "/deduplicationEnabled"),
    ("POST", _NAMESPACE + "/deduplicationEnabled"),
    ("DELETE", _NAMESPACE + "/deleteRetentionMs"),
    ("GET", _NAMESPACE + "/deleteRetentionMs"),
    ("POST", _NAMESPACE + "/deleteRetentionMs"),
    ("DELETE", _NAMESPACE + "/maxCompactionLagMs"),
    ("GET", _NAMESPACE + "/maxCompactionLagMs"),
    ("POST", _NAMESPACE + "/maxCompactionLagMs"),
    ("DELETE", _NAMESPACE + "/minCleanableDirtyRatio"),
    ("GET", _NAMESPACE + "/minCleanableDirtyRatio"),
    ("POST", _NAMESPACE + "/minCleanableDirtyRatio"),
    ("DELETE", _NAMESPACE + "/minCompactionLagMs"),
    ("GET", _NAMESPACE + "/minCompactionLagMs"),
    ("POST", _NAMESPACE + "/minCompactionLagMs"),
    *((method, _NAMESPACE + policy) for method in ("DELETE", "GET", "POST", "PUT")
      for policy in ("/offloadDeletionLagMs", "/offloadThreshold")),
    ("GET", _NAMESPACE + "/permissions"),
    ("DELETE", _NAMESPACE + "/permissions/{role}"),
    ("POST", _NAMESPACE + "/permissions/{role}"),
    ("DELETE", _NAMESPACE + "/schemaCompatibilityStrategy"),
    ("GET", _NAMESPACE + "/schemaCompatibilityStrategy"),
    ("POST", _NAMESPACE + "/schemaCompatibilityStrategy"),
    ("PUT", _NAMESPACE + "/schemaCompatibilityStrategy"),
    ("GET", "/admin/v2/persistent/{tenant}/{namespace}"),
    ("GET", "/admin/v2/persistent/{tenant}/{namespace}/partitioned"),
    ("DELETE", _TOPIC),
    ("PUT", _TOPIC),
    ("GET", _TOPIC + "/compaction"),
    ("PUT", _TOPIC + "/compaction"),
    ("DELETE", _TOPIC + "/compactionMaxBytesPerSecond"),
    ("GET", _TOPIC + "/compactionMaxBytesPerSecond"),
    ("POST", _TOPIC + "/compactionMaxBytesPerSecond"),
    ("DELETE", _TOPIC + "/compactionThreshold"),
    ("GET", _TOPIC + "/compactionThreshold"),
    ("POST", _TOPIC + "/compactionThreshold"),
    ("POST", _TOPIC + "/createMissedPartitions"),
    ("DELETE", _TOPIC + "/deduplicationEnabled"),
    ("GET", _TOPIC + "/deduplicationEnabled"),
    ("POST", _TOPIC + "/deduplicationEnabled"),
    ("DELETE", _TOPIC + "/deleteRetentionMs"),
    ("GET", _TOPIC + "/deleteRetentionMs"),
    ("POST", _TOPIC + "/deleteRetentionMs"),
    ("GET", _TOPIC + "/internalStats"),
    ("GET", _TOPIC + "/lastMessageId"),
    ("DELETE", _TOPIC + "/maxCompactionLagMs"),
    ("GET", _TOPIC + "/maxCompactionLagMs"),
    ("POST", _TOPIC + "/maxCompactionLagMs"),
    ("DELETE", _TOPIC + "/minCleanableDirtyRatio"),
    ("GET", _TOPIC + "/minCleanableDirtyRatio"),
    ("POST", _TOPIC + "/minCleanableDirtyRatio"),
    ("DELETE", _TOPIC + "/minCompactionLagMs"),
    ("GET", _TOPIC + "/minCompactionLagMs"),
    ("POST", _TOPIC + "/minCompactionLagMs"),
    ("GET", _TOPIC + "/offload"),
    ("PUT", _TOPIC + "/offload"),
    *((method, _TOPIC + policy) for method in ("DELETE", "GET", "POST", "PUT")
      for policy in ("/offloadDeletionLagMs", "/offloadThreshold")),
    ("GET", _TOPIC + "/partitioned-stats"),
    ("DELETE", _TOPIC + "/partitions"),
    ("POST", _TOPIC + "/partitions"),
    ("PUT", _TOPIC + "/partitions"),
    ("GET", _TOPIC + "/permissions"),
    ("DELETE", _TOPIC + "/permissions/{role}"),
    ("POST", _TOPIC + "/permissions/{role}"),
    ("DELETE", _TOPIC + "/schemaCompatibilityStrategy"),
    ("GET", _TOPIC + "/schemaCompatibilityStrategy"),
    ("POST", _TOPIC + "/schemaCompatibilityStrategy"),
    ("PUT", _TOPIC + "/schemaCompatibilityStrategy"),
    ("GET", _TOPIC + "/stats"),
    ("DELETE", _TOPIC + "/subscription/{subscription}"),
    ("GET", _TOPIC + "/subscription/{subscription}/position/{messagePosition}"),
    ("POST", _TOPIC + "/subscription/{subscription}/resetcursor"),
    ("POST", _TOPIC + "/subscription/{subscription}/resetcursor/{timestamp}"),
    ("POST", _TOPIC + "/subscription/{subscription}/skip_all"),
    ("GET", _TOPIC + "/subscriptions"),
    ("PUT", _TOPIC + "/unload"),
    ("DELETE", "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema"),
    ("GET", "/admin/v2/tenants"),
    ("DELETE", "/admin/v2/tenants/{tenant}"),
    ("GET", "/admin/v2/tenants/{tenant}"),
    ("PUT", "/admin/v2/tenants/{tenant}"),
    )},
}


def _app_routes() -> list[tuple[str, str]]:
    """Every (method, path) the application serves, from the code."""
    app = create_app(Settings())
    found = set()
    for route in app.routes:
        if isinstance(route, Mount):
            found.add(("GET", f"{route.path}/{{path}}"))
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add((method, route.path))
    for router in ROUTERS:  # included routers are not flattened into app.routes
        for route in router.routes:
            found.update((method, route.path) for method in route.methods)
    return sorted(found)


def _url(path: str, params: dict[str, str]) -> str:
    for name, value in params.items():
        path = path.replace("{" + name + "}", value)
    assert "{" not in path, f"no value for a parameter of {path}: add it to _PARAMS"
    return path


def _refusal(role: str | None, needs: str) -> int | None:
    """The status a role gets from a route that admits ``needs`` (None: admitted)."""
    if needs == "everyone":
        return None
    if role is None:
        return 401
    if needs == "any role":
        return None
    if needs == "super-user":
        return None if role == "admin" else 403
    return None if _admitted(role, needs) else 403


# -- the tests -----------------------------------------------------------------------------


def test_every_command_and_route_has_a_row() -> None:
    assert set(HANDLERS) == set(WIRE), "a command handled without a row in WIRE (or a stale row)"
    assert set(NO_TOKEN_PROBES) == set(WIRE)
    routes = _app_routes()
    assert set(routes) == set(REST), "a route without a row in REST (or a stale row)"
    for _, path in routes:
        _url(path, _PARAMS)  # every route can be driven


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("command", sorted(WIRE), ids=lambda c: T.Type.Name(c))
def test_wire_command_admission(broker: Broker, command: int, role: str) -> None:
    row = WIRE[command]
    raw = Raw(broker.port, broker.tokens[role])
    try:
        assert raw.next().type == T.CONNECTED
        verdict = row.drive(raw)
        assert verdict == ("admitted" if _admitted(role, row.needs) else "refused"), (role, row.needs)
    finally:
        raw.close()


@pytest.mark.parametrize("command", sorted(WIRE), ids=lambda c: T.Type.Name(c))
def test_without_a_token_nothing_passes_connect(broker: Broker, command: int) -> None:
    probe = make_command(NO_TOKEN_PROBES[command])
    raw = Raw(broker.port, None, pipelined=encode_payload_command(probe, _entry(0)) if command == T.SEND
              else encode_command(probe))
    try:
        first = raw.next()
        assert first is not None and first.type == T.ERROR and first.error.error == pb.AuthenticationError
        assert raw.next() is None  # closed; the command got no answer
    finally:
        raw.close()


@pytest.mark.parametrize("role", ROLES)
def test_real_client_admission(broker: Broker, role: str) -> None:
    client = pulsar.Client(broker.serve.broker_url, logger=QUIET, operation_timeout_seconds=10,
                           authentication=pulsar.AuthenticationToken(broker.tokens[role]))
    try:
        for command, act in ((T.PARTITIONED_METADATA, lambda: client.get_topic_partitions(TOPIC)),
                             (T.PRODUCER, lambda: client.create_producer(TOPIC).close()),
                             (T.SUBSCRIBE, lambda: client.subscribe(TOPIC, f"real-{role}").close())):
            if _admitted(role, WIRE[command].needs):
                act()
            else:
                started = time.monotonic()
                with pytest.raises(pulsar.AuthorizationError):
                    act()
                assert time.monotonic() - started < 5, "the client retried the refusal"
    finally:
        client.close()


@pytest.mark.parametrize("role", [*ROLES, None])
def test_rest_route_admission(broker: Broker, role: str | None) -> None:
    headers = {} if role is None else {"Authorization": f"Bearer {broker.tokens[role]}"}
    params = _SUPER_PARAMS if role == "admin" else _PARAMS
    wrong = []
    with httpx.Client(base_url=broker.serve.http_url, headers=headers, timeout=10) as http:
        for (method, path), needs in sorted(REST.items()):
            status = http.request(method, _url(path, params)).status_code
            refusal = _refusal(role, needs)
            if (status in (401, 403)) if refusal is None else (status != refusal):
                wrong.append((method, path, needs, status))
    assert not wrong, f"{role}: {wrong}"


def test_an_ungranted_role_cannot_register_a_schema(broker: Broker) -> None:
    fresh = f"persistent://{TENANT}/{NAMESPACE}/fresh"
    stranger = Raw(broker.port, broker.tokens["stranger"])
    try:
        assert stranger.next().type == T.CONNECTED
        stranger.send(make_command(pb.CommandGetOrCreateSchema(
            topic=fresh, request_id=1, schema=pb.Schema(name="Json", schema_data=b'{"type":"int"}',
                                                        type=pb.Schema.Json))))
        answer = _request_answer(stranger, 1)
        assert answer.getOrCreateSchemaResponse.error_code == AUTHZ
    finally:
        stranger.close()
    admin = {"Authorization": f"Bearer {broker.tokens['admin']}"}
    path = f"/admin/v2/schemas/{TENANT}/{NAMESPACE}/fresh/schema"
    assert httpx.get(broker.serve.http_url + path, headers=admin, timeout=10).status_code == 404  # nothing registered
    client = pulsar.Client(broker.serve.broker_url, logger=QUIET, operation_timeout_seconds=10,
                           authentication=pulsar.AuthenticationToken(broker.tokens["admin"]))
    try:
        client.create_producer(fresh, schema=pulsar.schema.StringSchema()).send("owner's")
    finally:
        client.close()
