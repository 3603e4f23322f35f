"""The schema tools answer identically over stdio, the unix socket and HTTP (direct methods)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from mcp_server.config import Config
from mcp_server.tools import schema as schema_tools
from tests.support.mcp_process import ServerProcess, server_env

FIXTURES = Path(__file__).parent / "schema_fixtures"
ASSET = {"$schemaRef": "jsonschema/synesthetic-asset.schema.json", "name": "circle"}
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("list_schemas", {}),
    ("get_schema", {"name": "shader"}),
    ("get_schema", {"name": "missing"}),
    ("get_schema", {"name": "../examples/Shader_Example.json"}),
    ("list_examples", {"component": "all"}),
    ("list_examples", {"component": "shader"}),
    ("get_example", {"path": "SynestheticAsset_Example1.json"}),
    ("get_example", {"path": "Shader_Broken.json"}),
    ("get_example", {"path": "../jsonschema/tone.schema.json"}),
    ("validate_asset", {"asset": ASSET, "schema": "nested-synesthetic-asset"}),
    ("validate_asset", {"asset": ASSET, "schema": "synesthetic-asset"}),
    ("validate_asset", {"asset": {"name": 3, "shader": {}}, "schema": "synesthetic-asset"}),
    ("validate_asset", {"asset": ASSET}),
    ("validate", {"asset": {"name": ""}, "schema": "synesthetic-asset"}),
    ("validate", {"asset": {"thing": 1}, "schema": "remote"}),
    ("validate_many", {"assets": [ASSET, {"name": ""}], "schema": "nested-synesthetic-asset"}),
    ("validate_many", {"assets": [{}, {}, {}], "schema": "shader"}),
    ("diff_assets", {"base": {"a": {"x": 1, "y": [1]}, "b": 1}, "new": {"a": {"x": 2, "y": [2]}, "c": None}}),
    ("populate_backend", {"asset": ASSET}),
]
REQUESTS = [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(CALLS, start=1)]


def env_for(tmp: Path, mode: str) -> dict[str, str]:
    return server_env(
        tmp,
        MCP_ENDPOINT=mode,
        CCW_TOOLSETS="schema",
        CCW_SCHEMAS_DIR=str(FIXTURES / "jsonschema"),
        CCW_EXAMPLES_DIR=str(FIXTURES / "examples"),
        MCP_MAX_BATCH="2",
    )


def close(server: ServerProcess) -> None:
    """Stop the server and close its pipes (ServerProcess leaves them open)."""
    server.stop()
    for pipe in (server.proc.stdin, server.proc.stdout, server.proc.stderr):
        if pipe is not None:
            pipe.close()


def over_stdio(tmp: Path) -> tuple[list[dict[str, Any]], str]:
    server = ServerProcess(env_for(tmp, "stdio"), stdin=subprocess.PIPE)
    assert server.proc.stdin is not None and server.proc.stdout is not None
    server.wait_ready()
    server.proc.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in REQUESTS))
    server.proc.stdin.close()
    out = server.proc.stdout.read()
    assert server.wait() == 0, server.log
    close(server)
    return [json.loads(line) for line in out.splitlines()], server.log


def over_socket(tmp: Path) -> tuple[list[dict[str, Any]], str]:
    server = ServerProcess(env_for(tmp, "socket"))
    try:
        path = server.wait_ready()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(path)
            sock.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in REQUESTS))
            buffer = b""
            while buffer.count(b"\n") < len(REQUESTS):
                chunk = sock.recv(65536)
                assert chunk, "server closed the socket early"
                buffer += chunk
    finally:
        close(server)
    return [json.loads(line) for line in buffer.splitlines()], server.log


def over_http(tmp: Path) -> tuple[list[dict[str, Any]], str]:
    server = ServerProcess(env_for(tmp, "http"))
    try:
        url = server.wait_ready()
        with httpx2.Client(timeout=30, trust_env=False, headers=server.bearer()) as client:
            answers = []
            for request in REQUESTS:
                response = client.post(url, json=request)
                assert response.status_code == 200, response.text
                answers.append(response.json())
    finally:
        close(server)
    return answers, server.log


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[dict[str, Any]], str]]:
    return {
        mode: run(tmp_path_factory.mktemp(mode))
        for mode, run in (("stdio", over_stdio), ("socket", over_socket), ("http", over_http))
    }


def test_same_answers_on_every_transport(answers: dict[str, tuple[list[dict[str, Any]], str]]) -> None:
    stdio = answers["stdio"][0]
    assert [a["id"] for a in stdio] == [r["id"] for r in REQUESTS]
    assert all("result" in a for a in stdio), stdio
    assert answers["socket"][0] == stdio
    assert answers["http"][0] == stdio


def test_answers_are_what_the_handlers_return(answers: dict[str, tuple[list[dict[str, Any]], str]]) -> None:
    class Ctx:
        config = Config.from_env(
            {
                "CCW_SCHEMAS_DIR": str(FIXTURES / "jsonschema"),
                "CCW_EXAMPLES_DIR": str(FIXTURES / "examples"),
                "MCP_MAX_BATCH": "2",
            }
        )

    specs = {name: spec for spec in schema_tools.TOOLS for name in (spec.name, *spec.deprecated_aliases)}
    for (method, params), answer in zip(CALLS, answers["stdio"][0], strict=True):
        assert answer["result"] == trio.run(specs[method].handler, Ctx(), params), method
    results = [a["result"] for a in answers["stdio"][0]]
    assert results[2] == {"ok": False, "reason": "not_found"}
    assert results[13]["reason"] == "validation_failed"
    assert results[16]["reason"] == "unsupported"
    assert results[18]["reason"] == "unsupported"


def test_deprecated_alias_warns_on_stderr_each_time(answers: dict[str, tuple[list[dict[str, Any]], str]]) -> None:
    uses = sum(1 for method, _ in CALLS if method == "validate")
    for mode, (_, log) in answers.items():
        warnings = [line for line in log.splitlines() if "deprecated" in line and "'validate'" in line]
        assert len(warnings) == uses, (mode, log)
        assert "validate_asset" in warnings[0]
