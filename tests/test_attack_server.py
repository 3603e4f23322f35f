"""Hostile paths sent as raw JSON to a real ccw-mcp (issue 9), so the JSON decoder's view of
``"\\ud800"``, ``"\\u0000"`` and friends is what the tools see.

Each direct-method call must come back as a JSON-RPC answer whose error, if any, is a
structured tool error or a params error, never INTERNAL (-32603) and never a traceback;
the server must keep serving and the canary beside the workspace must stay unchanged.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.framing import INTERNAL_ERROR, INVALID_PARAMS
from mcp_server.server import TOOL_ERROR
from tests.support.canary import SECRET, plant, tree_digest
from tests.support.mcp_process import ServerProcess, server_env

# JSON text of each hostile path (escapes decoded by the server's JSON parser).
RAW_PATHS = [
    r'"\ud800"', r'"\udfff/x"', r'"\udc80"', r'"a\u0000b"', r'"\u0000"', r'"../canary/secret.txt"',
    r'"out/secret.txt"', r'"outfile"', r'"~/x"', r'"C:\\x"', r'"\\\\server\\share"', '"' + "n" * 300 + '"',
    '"' + "/".join(["d" * 255] * 17) + '"', r'"src/\u002e\u002e/\u002e\u002e/canary"', r'"\ud83d\ude00"',
]
CALLS = {
    "snapshot_file": '{{"path":{p}}}',
    "snapshot_list": '{{"path":{p}}}',
    "snapshot_grep": '{{"pattern":{p},"paths":[{p}]}}',
    "workspace_write_file": '{{"path":{p},"content":{p}}}',
    "workspace_delete": '{{"path":{p}}}',
    "read_text_file": '{{"path":{p}}}',
    "text_read": '{{"path":{p}}}',
    "file_create": '{{"path":{p},"content":{p}}}',
    "text_append": '{{"path":{p},"hash":"' + "0" * 64 + '","content":{p}}}',
    "get_schema": '{{"name":{p}}}',
    "get_example": '{{"path":{p}}}',
    "witness_verify": '{{"path":{p}}}',
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    tmp = tmp_path_factory.mktemp("attack-server")
    ws = tmp / "ws"
    ws.mkdir()
    plant(ws, tmp / "canary")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_SYSTEM="/dev/null")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "i"]):
        subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True, env=env)
    server = ServerProcess(server_env(tmp, MCP_ENDPOINT="socket", CCW_WORKSPACE=str(ws),
                                      CCW_TOOLSETS="snapshot,workspace,text,file,schema,witness,server"))
    server.wait_ready()
    yield server, tmp
    assert server.stop() == 0
    assert "mcp:bug" not in server.log, server.log


def _pipelined(path: str, frames: list[str], expected: int) -> list[Any]:
    """Send every frame at once over one connection; the first ``expected`` answers, in order."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(path)
        sock.sendall("\n".join(frames).encode() + b"\n")
        buffer = b""
        answers: list[Any] = []
        while len(answers) < expected:
            chunk = sock.recv(1 << 16)
            assert chunk, f"server hung up after {len(answers)} answers"
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            answers += [json.loads(line) for line in lines if line]
    return answers


def test_hostile_raw_json_paths_through_the_server(served: tuple[ServerProcess, Path]) -> None:
    server, tmp = served
    before = tree_digest(tmp / "canary")
    frames: list[str] = []
    for tool, template in sorted(CALLS.items()):
        for raw in RAW_PATHS:
            frames.append(f'{{"jsonrpc":"2.0","id":{len(frames)},"method":"{tool}","params":{template.format(p=raw)}}}')
    frames.append('{"jsonrpc":"2.0","id":"last","method":"ccw_info"}')
    answers = _pipelined(server.path, frames, len(frames))
    assert [a["id"] for a in answers] == [*range(len(frames) - 1), "last"]  # in order, none lost
    for frame, answer in zip(frames, answers, strict=True):
        error = answer.get("error")
        if error is not None:
            assert error["code"] != INTERNAL_ERROR and "unexpectedly" not in error["message"], (frame[:200], error)
        assert SECRET not in json.dumps(answer)
    assert tree_digest(tmp / "canary") == before
    codes = {a["error"]["code"] for a in answers if "error" in a}
    assert TOOL_ERROR in codes and INVALID_PARAMS in codes, codes  # both layers were reached
    assert len(frames) - 1 == len(CALLS) * len(RAW_PATHS)


def test_hostile_paths_through_tools_call_and_resources_read(served: tuple[ServerProcess, Path]) -> None:
    """The same through the MCP SDK path (initialize, tools/call, resources/read list://)."""
    server, tmp = served
    before = tree_digest(tmp / "canary")
    frames = [
        '{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25",'
        '"capabilities":{},"clientInfo":{"name":"attack","version":"0"}}}',
        '{"jsonrpc":"2.0","method":"notifications/initialized"}',
    ]
    ids: list[Any] = ["init"]
    for tool, template in sorted(CALLS.items()):
        for raw in RAW_PATHS:
            ids.append(len(ids))
            frames.append(f'{{"jsonrpc":"2.0","id":{ids[-1]},"method":"tools/call",'
                          f'"params":{{"name":"{tool}","arguments":{template.format(p=raw)}}}}}')
    for raw in RAW_PATHS:
        ids.append(len(ids))
        inner = raw[1:-1]  # the JSON string's escaped text, spliced after the scheme
        frames.append(f'{{"jsonrpc":"2.0","id":{ids[-1]},"method":"resources/read","params":{{"uri":"list://{inner}"}}}}')
    answers = _pipelined(server.path, frames, len(ids))
    # Every request answered once; MCP answers leave as they are ready, in any order.
    assert sorted((a["id"] for a in answers), key=str) == sorted(ids, key=str)
    for answer in (a for a in answers if a["id"] != "init"):
        error = answer.get("error") or (answer["result"].get("structuredContent") or {}).get("error")
        if isinstance(error, dict):
            assert error.get("code") not in (INTERNAL_ERROR, "INTERNAL"), answer
        assert SECRET not in json.dumps(answer)
    assert tree_digest(tmp / "canary") == before
