"""ccw-mcp over stdio, driven by the SDK's own client (both protocol eras) and by raw NDJSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from mcp_server.config import Config
from mcp_server.server import CcwServer
from mcp_server.state import State
from mcp_server.tools.registry import Registry, ToolSpec
from mcp_server.transports.ndjson import NdjsonConnection
from tests.support.mcp_process import CCW_MCP, ServerProcess, server_env

ERAS = ["legacy", "2026-07-28", "auto"]  # auto: the client probes server/discover


def check_output(tools: dict[str, dict], name: str, result) -> dict:
    """A successful result's structuredContent, checked against the tool's output schema."""
    assert result.is_error is not True, result
    jsonschema.validate(result.structured_content, tools[name])
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


@pytest.mark.parametrize("mode", ERAS)
def test_sdk_client_over_stdio(tmp_path: Path, mode: str):
    params = StdioServerParameters(command=str(CCW_MCP), env=server_env(tmp_path))

    async def session():
        async with Client(params, mode=mode) as client:
            listed = await client.list_tools()
            tools = {t.name: t.output_schema for t in listed.tools}
            assert "ccw_info" in tools
            tool = next(t for t in listed.tools if t.name == "ccw_info")
            assert tool.annotations.read_only_hint is True
            assert tool.input_schema["additionalProperties"] is False

            progress: list[float] = []

            async def on_progress(value, total, message):
                progress.append(value)

            info = check_output(tools, "ccw_info", await client.call_tool("ccw_info", {"delay_ms": 250},
                                                                          progress_callback=on_progress))
            assert info["endpoint"] == "stdio" and info["state_dir"] == str(tmp_path / "state")
            assert info["families"] == ["server"] and info["delayed_ms"] == 250
            assert progress and progress[-1] == 250

            aliased = await client.call_tool("server.info", {"echo": "via alias"})
            assert aliased.structured_content["echo"] == "via alias"

            # Both eras negotiate 2025-11-25 or later: bad arguments are a tool error the model reads.
            bad_args = await client.call_tool("ccw_info", {"delay_ms": 10_001})
            assert bad_args.is_error is True
            error = bad_args.structured_content["error"]
            assert error["code"] == "INVALID_ARGUMENT" and "/delay_ms" in error["message"], error
            assert error["details"] == {"errors": [{"path": "/delay_ms", "msg": "10001 is greater than the maximum "
                                                    "of 10000"}], "schema": "tool.ccw_info.input"}
            assert json.loads(bad_args.content[0].text) == bad_args.structured_content

            with pytest.raises(MCPError) as unknown:
                await client.call_tool("no_such_tool", {})
            assert unknown.value.error.code == -32602

    trio.run(session)


def run_raw(tmp_path: Path, lines: list[bytes]) -> tuple[list[dict], str, int]:
    proc = subprocess.run(
        [str(CCW_MCP)], input=b"".join(line + b"\n" for line in lines),
        capture_output=True, env=server_env(tmp_path), timeout=60,
    )
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    return answers, proc.stderr.decode(), proc.returncode


def test_raw_ndjson_direct_methods_in_request_order(tmp_path: Path):
    big = b'{"jsonrpc":"2.0","id":"big","method":"ccw_info","params":{"echo":"' + b"x" * (1 << 20) + b'"}}'
    answers, log, code = run_raw(
        tmp_path,
        [
            b'{"jsonrpc":"2.0","id":1,"method":"ccw_info"}',
            b'{"jsonrpc":"2.0","id":2,"method":"ccw_info","params":{"delay_ms":400,"echo":"slow"}}',
            b'{"jsonrpc":"2.0","id":3,"method":"ccw/info","params":{"echo":"fast"}}',
            big,
            b"{not json",
            b'{"jsonrpc":"2.0","id":4,"method":"ccw_info","params":{"nope":1}}',
            b'{"jsonrpc":"2.0","id":5,"method":"ccw_info","params":{"echo":"after"}}',
        ],
    )
    assert code == 0, log
    assert [a["id"] for a in answers] == [1, 2, 3, "big", None, 4, 5]
    assert answers[0]["result"]["name"] == "ccw"
    assert answers[1]["result"]["echo"] == "slow"  # answered before the fast one that followed it
    assert answers[2]["result"]["echo"] == "fast"
    assert answers[3]["result"] == {
        "ok": False, "reason": "validation_failed", "errors": [{"path": "", "msg": "payload_too_large"}]
    }
    assert answers[4]["error"]["code"] == -32700
    assert answers[5]["error"]["code"] == -32602
    assert answers[5]["error"]["data"]["errors"][0]["path"] == ""
    assert answers[6]["result"]["echo"] == "after"  # the connection kept working
    assert re.search(r"^mcp:ready mode=stdio path=- state_dir=\S+ schemas_dir=\S+", log, re.M), log
    assert re.search(r"^mcp:shutdown mode=stdio", log, re.M), log
    assert not (tmp_path / "mcp.ready").exists()


def test_an_id_still_in_flight_is_refused_and_the_first_request_keeps_it(tmp_path: Path):
    # Found in a trial: a second request under the id of one still running was taken, so the
    # SDK's table of requests in flight lost the first, and a cancellation of the id no
    # longer stopped its command (the capsule stayed held until its timeout).
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    slow = {"name": "ccw_info", "arguments": {"delay_ms": 400, "echo": "first"}}
    answers, log, code = run_raw(tmp_path, [
        json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}).encode(),
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": slow}).encode(),
        b'{"jsonrpc":"2.0","id":7,"method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":"d","method":"ccw_info","params":{"delay_ms":400,"echo":"direct"}}',
        b'{"jsonrpc":"2.0","id":"d","method":"ccw/info","params":{"echo":"again"}}',
        b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"ccw_info","arguments":"{}"}}',
    ])
    assert code == 0, log
    assert sorted(map(str, (a["id"] for a in answers))) == ["0", "7", "7", "8", "d", "d"], answers
    [text] = [a["error"] for a in answers if a["id"] == 8]  # arguments sent as JSON text: said so
    assert text["code"] == -32602 and "params.arguments must be a JSON object, not JSON text" in text["message"]
    [result] = [a["result"] for a in answers if a["id"] == 7 and "result" in a]  # the first kept its id
    [refused] = [a["error"] for a in answers if a["id"] == 7 and "error" in a]
    assert result["structuredContent"]["echo"] == "first"
    assert refused["code"] == -32600 and refused["message"].startswith("id 7 is in use by a request still running")
    direct = [a for a in answers if a["id"] == "d"]  # direct methods answer in request order
    assert direct[0]["result"]["echo"] == "direct"
    assert direct[1]["error"]["message"].startswith('id "d" is in use'), direct


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_bad_tool_arguments_are_a_tool_error_from_2025_11_25(tmp_path: Path, version: str):
    init = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    bad = {"name": "ccw_info", "arguments": {"delay_ms": -1, "nope": 1}}
    answers, log, code = run_raw(tmp_path, [
        json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}).encode(),
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": bad}).encode(),
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}',
    ])
    assert code == 0, log
    assert answers[0]["result"]["protocolVersion"] == version
    errors = [{"path": "", "msg": "Additional properties are not allowed ('nope' was unexpected)"},
              {"path": "/delay_ms", "msg": "-1 is less than the minimum of 0"}]
    if version == "2025-06-18":
        assert answers[1]["error"]["code"] == -32602 and answers[1]["error"]["data"] == {"errors": errors}
    else:
        result = answers[1]["result"]
        assert result["isError"] is True and json.loads(result["content"][0]["text"]) == result["structuredContent"]
        error = result["structuredContent"]["error"]
        assert error["code"] == "INVALID_ARGUMENT"
        assert error["details"] == {"errors": errors, "schema": "tool.ccw_info.input"}
        assert "/delay_ms: -1 is less than the minimum of 0" in error["message"]
        assert "inputSchema in tools/list" in error["message"]
    assert answers[2]["error"]["code"] == -32602  # an unknown tool stays a protocol error in every version


def test_oversized_mcp_request_is_a_jsonrpc_error(tmp_path: Path):
    big = (b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"ccw_info","arguments":{"echo":"'
           + b"y" * (2 << 20) + b'"}}}')
    answers, log, code = run_raw(tmp_path, [big, b'{"jsonrpc":"2.0","id":10,"method":"ccw_info"}'])
    assert code == 0, log
    assert answers[0]["id"] == 9 and answers[0]["error"]["code"] == -32600
    assert answers[0]["error"]["data"]["errors"] == [{"path": "", "msg": "payload_too_large"}]
    assert answers[1]["id"] == 10 and "result" in answers[1]


def test_ready_file_and_exit_when_stdin_closes(tmp_path: Path):
    server = ServerProcess(server_env(tmp_path), stdin=subprocess.PIPE)
    try:
        server.wait_ready()
        content = (tmp_path / "mcp.ready").read_text()
        assert re.fullmatch(rf"{server.proc.pid} \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\n", content), content
        assert server.proc.stdin is not None
        server.proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ccw_info","params":{"delay_ms":200}}\n')
        server.proc.stdin.close()  # EOF with a request still running: it is answered first
        assert server.proc.stdout is not None
        out = server.proc.stdout.read()
        assert server.wait() == 0
    finally:
        server.stop()
    assert json.loads(out)["result"]["delayed_ms"] == 200
    assert not (tmp_path / "mcp.ready").exists()
    assert "mcp:shutdown mode=stdio" in server.log


@pytest.mark.parametrize("stdout_first", [True, False])
def test_a_killed_client_ends_its_calls_in_flight_though_they_write_nothing(tmp_path: Path, stdout_first: bool):
    # Found in a trial: the client of a stdio ccw-mcp was killed while an exec with wait_ms null
    # ran, and the server went on until the run ended: a call without a progress token writes
    # nothing, and end of input alone is a client that still reads (printf ... | ccw-mcp).  A
    # killed client's end of our output pipe goes too, in either order with its end of our input.
    started, cancelled = trio.Event(), trio.Event()

    async def waits(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    config = Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state"), "CCW_TOOLSETS": "server"})
    registry = Registry()
    registry.add(ToolSpec("waits", "server", "waits for ever", {"type": "object", "additionalProperties": False},
                          {"type": "object"}, waits))
    server = CcwServer(config, State(config.state_dir), registry)
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    frames = [{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "waits", "arguments": {}}}]

    async def client() -> None:
        os.write(in_write, b"".join(json.dumps(f).encode() + b"\n" for f in frames))
        answer = b""
        while not answer.endswith(b"\n"):  # the initialize answer: nothing else is written
            answer += await trio.to_thread.run_sync(os.read, out_read, 65536)
        assert json.loads(answer)["id"] == 0
        await started.wait()
        for fd in (out_read, in_write) if stdout_first else (in_write, out_read):  # the client is killed
            os.close(fd)
            await trio.sleep(0.3)

    async def main() -> None:
        with trio.fail_after(20):  # the old server waited for ever
            async with (trio.lowlevel.FdStream(in_read) as reader, trio.lowlevel.FdStream(out_write) as writer,
                        trio.open_nursery() as nursery):
                nursery.start_soon(client)
                await NdjsonConnection(server, reader, writer, trio.Event()).run()
            assert cancelled.is_set()

    trio.run(main)


def test_a_ready_file_it_cannot_write_is_a_warning_and_it_serves(tmp_path: Path):
    # As a second user meets root's /tmp/mcp.ready in the sticky /tmp: here the path is a
    # directory, which os.replace cannot replace with a file.
    (tmp_path / "taken.ready").mkdir()
    proc = subprocess.run([str(CCW_MCP)], input=b'{"jsonrpc":"2.0","id":1,"method":"ccw_info"}\n',
                          capture_output=True, timeout=60,
                          env=server_env(tmp_path, MCP_READY_FILE=str(tmp_path / "taken.ready")))
    log = proc.stderr.decode()
    assert proc.returncode == 0, log
    assert "result" in json.loads(proc.stdout)
    assert re.search(r"^mcp:ready_file_failed path=\S+taken\.ready error=.*MCP_READY_FILE", log, re.M), log
    assert re.search(r"^mcp:ready mode=stdio", log, re.M), log
    assert (tmp_path / "taken.ready").is_dir() and not list(tmp_path.glob("taken.ready.*.tmp"))


def test_children_and_prints_never_reach_the_wire(tmp_path: Path):
    code = (
        "import os, subprocess\n"
        "from mcp_server.transports.stdio import claim_stdio\n"
        "with claim_stdio() as (wire_in, wire_out):\n"
        "    subprocess.run(['sh', '-c', 'echo child-stdout; cat'], check=True)\n"
        "    print('python-print')\n"
        "    os.write(wire_out, b'frame\\n')\n"
        "    os.write(wire_out, os.read(wire_in, 100))\n"
    )
    proc = subprocess.run(
        [str(CCW_MCP.parent / "python"), "-c", code], input=b"hello\n", capture_output=True,
        cwd=CCW_MCP.parent.parent.parent, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"frame\nhello\n"  # the child's cat saw /dev/null, not our frames
    assert b"child-stdout" in proc.stderr and b"python-print" in proc.stderr


def test_the_output_pipe_is_enlarged_for_large_answers(tmp_path: Path):
    # The pipe is shared: the server's F_SETPIPE_SZ shows on our end of it.
    import fcntl

    from mcp_server.transports.stdio import PIPE_SIZE

    server = ServerProcess(server_env(tmp_path), stdin=subprocess.PIPE)
    try:
        server.wait_ready()
        assert server.proc.stdout is not None
        size = fcntl.fcntl(server.proc.stdout.fileno(), fcntl.F_GETPIPE_SZ)
        if int(Path("/proc/sys/fs/pipe-max-size").read_text()) >= PIPE_SIZE:
            assert size == PIPE_SIZE
        else:  # the kernel may refuse (unprivileged): the pipe keeps working as it was
            assert size >= 4096
    finally:
        server.stop()
