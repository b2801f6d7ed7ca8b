"""``compactd admin schemas`` and the strategy verbs: the requests they make (against a
recording transport), usage errors naming the bad value, and once end to end through the
real application on a real broker core.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from api.admin_cli_schemas import read_schema_file
from api.broker.service import BrokerService
from api.http import create_app
from tests.unit.api.test_admin_cli import Recorder, _admin
from tests.unit.api.test_rest import run

SCHEMA = "/admin/v2/schemas/public/default/t/schema"
RECORD = {"type": "record", "name": "R", "fields": [{"name": "a", "type": ["null", "string"]}]}


@pytest.mark.parametrize(("args", "call"), [
    (["schemas", "get", "t"], ("GET", SCHEMA, None)),
    (["schemas", "get", "--version", "3", "persistent://a/b/t"], ("GET", "/admin/v2/schemas/a/b/t/schema/3", None)),
    (["schemas", "delete", "t"], ("DELETE", SCHEMA, None)),
    (["namespaces", "set-schema-compatibility-strategy", "-c", "backward", "public/default"],
     ("PUT", "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy", "BACKWARD")),
    (["topics", "set-schema-compatibility-strategy", "--compatibility", "ALWAYS_COMPATIBLE", "t"],
     ("PUT", "/admin/v2/persistent/public/default/t/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")),
    (["topics", "get-schema-compatibility-strategy", "t"],
     ("GET", "/admin/v2/persistent/public/default/t/schemaCompatibilityStrategy", None)),
    (["namespaces", "remove-schema-compatibility-strategy", "public/default"],
     ("DELETE", "/admin/v2/namespaces/public/default/schemaCompatibilityStrategy", None)),
])
def test_each_schema_verb_makes_its_one_request(args: list[str], call: tuple[str, str, object]) -> None:
    recorder = Recorder()
    result = _admin(recorder, *args)
    assert result.exit_code == 0, result.output
    assert recorder.calls == [call]


def test_upload_sends_the_schema_file_and_prints_the_version(tmp_path: Path) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "AVRO", "schema": RECORD, "properties": {"k": "v"}}))
    recorder = Recorder(httpx.Response(200, json={"version": 0}))
    result = _admin(recorder, "schemas", "upload", "-f", str(path), "t")
    assert result.exit_code == 0, result.output
    assert recorder.calls == [("POST", SCHEMA, {"type": "AVRO", "schema": json.dumps(RECORD), "properties": {"k": "v"}})]
    assert json.loads(result.stdout) == {"version": 0}


@pytest.mark.parametrize(("content", "named"), [
    (None, "cannot read"), ("{not json", "cannot read"), ("[1]", "\"type\""),
    (json.dumps({"type": "JSON", "properties": {"k": 1}}), "properties"),
])
def test_a_bad_schema_file_is_a_usage_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, named: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # a short relative path: the usage box (80 columns) never wraps it
    path = Path("bad.json")
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=named):
        read_schema_file(path)
    recorder = Recorder()
    result = _admin(recorder, "schemas", "upload", "-f", str(path), "t")
    assert result.exit_code == 2 and "bad.json" in result.output
    assert recorder.calls == []


def test_a_bad_strategy_or_version_is_a_usage_error(tmp_path: Path) -> None:
    recorder = Recorder()
    result = _admin(recorder, "namespaces", "set-schema-compatibility-strategy", "-c", "SIDEWAYS", "public/default")
    assert result.exit_code == 2 and "SIDEWAYS" in result.output
    assert _admin(recorder, "schemas", "get", "--version", "-1", "t").exit_code == 2
    assert recorder.calls == []


def test_the_verbs_work_against_the_real_application(tmp_path: Path) -> None:
    """upload, get, delete through the CLI, its requests served by the real application."""
    pytest.importorskip("fastavro")  # the JSON schema is checked
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "JSON", "schema": json.dumps(RECORD)}))

    async def body(broker: BrokerService, _client: httpx.AsyncClient) -> None:
        app = create_app(broker.settings, broker=broker)
        loop = asyncio.get_running_loop()

        def cli(*args: str) -> tuple[int, str]:
            async def call(request: httpx.Request) -> httpx.Response:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://compactd") as client:
                    answer = await client.request(request.method, request.url.path, content=request.content,
                                              headers=dict(request.headers))
                    return httpx.Response(answer.status_code, content=await answer.aread(), headers=answer.headers)
            recorder = Recorder(lambda request: asyncio.run_coroutine_threadsafe(call(request), loop).result(10))
            result = _admin(recorder, *args)
            return result.exit_code, result.output

        async def run_cli(*args: str) -> tuple[int, str]:
            return await asyncio.to_thread(cli, *args)

        assert await run_cli("schemas", "upload", "-f", str(path), "t") == (0, '{\n  "version": 0\n}\n')
        code, output = await run_cli("schemas", "get", "t")
        assert code == 0 and json.loads(json.loads(output)["data"]) == RECORD
        assert (await run_cli("schemas", "delete", "t"))[0] == 0
        code, output = await run_cli("schemas", "get", "--version", "0", "t")
        assert code == 1 and "HTTP 404" in output

    run(tmp_path, body)
