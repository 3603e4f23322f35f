"""ccw-mcp on a unix socket: SDK clients in both eras, many pipelining clients, the guard,
socket permissions, stale sockets, and a graceful SIGTERM with a request in flight."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
from pathlib import Path

import pytest
import trio
from mcp import Client

from mcp_server.transports.unix import connect
from tests.support.mcp_process import ServerProcess, server_env


@pytest.fixture
def socket_server(tmp_path: Path):
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket"))
    server.wait_ready()
    yield server
    server.stop()


async def ndjson_session(path: str, requests: list[dict]) -> list[dict]:
    """Send every request at once (pipelined), then read one answer per request."""
    stream = await trio.open_unix_socket(path)
    async with stream:
        await stream.send_all(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        buffer = b""
        answers: list[dict] = []
        while len(answers) < len(requests):
            chunk = await stream.receive_some(65536)
            assert chunk, f"connection closed after {len(answers)} answers"
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            answers += [json.loads(line) for line in lines if line]
        return answers


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_sdk_client_over_unix_socket(socket_server: ServerProcess, mode: str):
    async def session():
        async with Client(connect(socket_server.path), mode=mode) as client:
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == ["ccw_info"]
            result = await client.call_tool("ccw_info", {"echo": mode})
            assert result.structured_content["endpoint"] == "socket"
            assert result.structured_content["echo"] == mode

    trio.run(session)


def test_socket_mode_default_0600(socket_server: ServerProcess):
    mode = os.stat(socket_server.path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert "mcp:ready mode=socket path=" + socket_server.path in socket_server.log


def test_socket_mode_from_env(tmp_path: Path):
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", MCP_SOCKET_MODE="0660"))
    try:
        assert stat.S_IMODE(os.stat(server.wait_ready()).st_mode) == 0o660
    finally:
        assert server.stop() == 0


def test_ten_pipelining_clients_get_answers_in_their_own_order(socket_server: ServerProcess):
    results: dict[int, list[dict]] = {}

    async def client(n: int) -> None:
        # Earlier requests are slower, so they finish last unless the server keeps order.
        requests = [
            {"jsonrpc": "2.0", "id": f"c{n}-{i}", "method": "ccw_info",
             "params": {"delay_ms": (5 - i) * 30, "echo": f"{n}:{i}"}}
            for i in range(6)
        ]
        requests.insert(3, {"jsonrpc": "2.0", "id": f"c{n}-p", "method": "ping"})  # an MCP method mixed in
        results[n] = await ndjson_session(socket_server.path, requests)

    async def main():
        async with trio.open_nursery() as nursery:
            for n in range(10):
                nursery.start_soon(client, n)

    trio.run(main)
    for n in range(10):
        ids = [a["id"] for a in results[n]]
        # Direct methods in request order (seed 001); the MCP ping whenever it is ready
        # (JSON-RPC matches it by id), but answered exactly once.
        assert [i for i in ids if i != f"c{n}-p"] == [f"c{n}-{i}" for i in range(6)]
        assert ids.count(f"c{n}-p") == 1
        echoes = [a["result"]["echo"] for a in results[n] if a["id"] != f"c{n}-p"]
        assert echoes == [f"{n}:{i}" for i in range(6)]


def test_mcp_answers_are_not_held_behind_a_slower_earlier_request(socket_server: ServerProcess):
    # Regression (issue 13): an MCP client's quick call pipelined behind a slow one was
    # answered only after it, because every answer left in request order.
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}

    def call(request_id: str, delay_ms: int) -> dict:
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": "ccw_info", "arguments": {"delay_ms": delay_ms, "echo": request_id}}}

    async def main() -> list[dict]:
        stream = await trio.open_unix_socket(socket_server.path)
        async with stream:
            await stream.send_all(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                              "params": init}).encode()
                                  + b"\n" + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            buffer = b""
            while b"\n" not in buffer:
                buffer += await stream.receive_some(65536)
            assert json.loads(buffer.split(b"\n")[0])["id"] == 0
            buffer = buffer.split(b"\n", 1)[1]
            await stream.send_all(b"".join(json.dumps(r).encode() + b"\n"
                                           for r in (call("slow", 10_000), call("quick", 0))))
            answers: list[dict] = []
            while not answers:
                chunk = await stream.receive_some(65536)
                assert chunk
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                answers += [json.loads(line) for line in lines if line]
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}}
            await stream.send_all(json.dumps(cancel).encode() + b"\n")
            return answers

    answers = trio.run(main)
    assert answers[0]["id"] == "quick" and answers[0]["result"]["structuredContent"]["echo"] == "quick"


def test_oversized_frame_on_socket_keeps_connection(socket_server: ServerProcess):
    async def main():
        stream = await trio.open_unix_socket(socket_server.path)
        async with stream:
            big = b'{"jsonrpc":"2.0","id":1,"method":"ccw_info","params":{"echo":"' + b"a" * (1 << 20) + b'"}}\n'
            await stream.send_all(big + b'{"jsonrpc":"2.0","id":2,"method":"ccw_info"}\n')
            buffer = b""
            while buffer.count(b"\n") < 2:
                chunk = await stream.receive_some(65536)
                assert chunk
                buffer += chunk
            return [json.loads(line) for line in buffer.splitlines()]

    first, second = trio.run(main)
    assert first == {"jsonrpc": "2.0", "id": 1, "result": {
        "ok": False, "reason": "validation_failed", "errors": [{"path": "", "msg": "payload_too_large"}]}}
    assert second["id"] == 2 and second["result"]["name"] == "ccw"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_in_flight_request_then_exits(tmp_path: Path, signum: signal.Signals):
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket"))
    path = server.wait_ready()

    async def main():
        async with Client(connect(path), mode="legacy") as client:
            await client.list_tools()  # the client checks results against listed schemas
            signalled = []

            async def on_progress(value, total, message):
                if not signalled:  # the request is running in the server now
                    server.signal(signum)
                    signalled.append(value)

            result = await client.call_tool("ccw_info", {"delay_ms": 1500}, progress_callback=on_progress)
            assert signalled
            return result

    result = trio.run(main)
    assert result.is_error is not True
    assert result.structured_content["delayed_ms"] == 1500
    assert server.wait() == 0
    assert not os.path.exists(path)
    assert not (tmp_path / "mcp.ready").exists()
    assert f"mcp:draining mode=socket signal={signum.name}" in server.log
    assert "mcp:shutdown mode=socket" in server.log


def test_stale_socket_is_replaced_and_live_one_is_refused(tmp_path: Path):
    path = tmp_path / "mcp.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a crashed server leaves
    first = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket"))
    try:
        first.wait_ready()
        assert "stale socket" in first.log
        # Another state dir (one state dir has one front end: test_one_state_dir_one_socket_server).
        second = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", MCP_READY_FILE=str(tmp_path / "r2"),
                                          CCW_STATE_DIR=str(tmp_path / "state2")))
        assert second.wait() == 2
        assert "another server is listening" in second.log
        assert path.exists()  # the live server's socket was left alone
    finally:
        assert first.stop() == 0
    assert not path.exists()


def test_one_state_dir_one_socket_server(tmp_path: Path):
    """A socket server on a state dir another ccw-mcp serves exits 2, naming it
    (mcp_server/frontdoor.py); a stdio one would attach instead."""
    first = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket"))
    try:
        first.wait_ready()
        second = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", MCP_READY_FILE=str(tmp_path / "r2"),
                                          MCP_SOCKET_PATH=str(tmp_path / "other.sock")))
        assert second.wait() == 2
        assert f"CONFLICT: state dir {tmp_path / 'state'} is served by ccw-mcp pid {first.proc.pid}" in second.log
        assert not (tmp_path / "other.sock").exists()
    finally:
        assert first.stop() == 0


def test_a_busy_daemon_is_named_with_how_to_end_it(tmp_path: Path):
    """Found in a trial: ``ccw serve`` on a state dir whose ``ccw`` daemon stayed busy said
    "served by ccw-mcp pid N; stop it", naming neither the daemon nor how to stop it."""
    from mcp_server.frontdoor import FrontendPaths

    daemon_socket = FrontendPaths.of(str(tmp_path / "state")).socket
    daemon = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", MCP_SOCKET_PATH=str(daemon_socket)))
    try:
        daemon.wait_ready()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:  # its one client: it stays
            client.connect(str(daemon_socket))
            second = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", MCP_READY_FILE=str(tmp_path / "r2"),
                                              MCP_SOCKET_PATH=str(tmp_path / "other.sock")))
            assert second.wait() == 2
        assert f"served by the ccw command's front end (pid {daemon.proc.pid}), busy with" in second.log, second.log
        assert "`ccw helper stop --force` ends it" in second.log
    finally:
        assert daemon.stop() == 0


def test_path_that_is_not_a_socket_is_never_removed(tmp_path: Path):
    (tmp_path / "mcp.sock").write_text("precious")
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket"))
    assert server.wait() == 2
    assert "is not a socket" in server.log
    assert (tmp_path / "mcp.sock").read_text() == "precious"


def test_cancelled_requests_get_no_answer_and_do_not_block_later_ones(socket_server: ServerProcess):
    def call(id_, delay):
        return {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
                "params": {"name": "ccw_info", "arguments": {"delay_ms": delay}}}

    def cancel(id_):
        return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id_}}

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}

    async def main():
        stream = await trio.open_unix_socket(socket_server.path)
        async with stream:
            frames = [
                init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                call(2, 10_000),  # MCP request, cancelled below
                {"jsonrpc": "2.0", "id": 3, "method": "ccw_info", "params": {"delay_ms": 10_000}},  # direct, cancelled
                call(4, 0),
                {"jsonrpc": "2.0", "id": 5, "method": "ccw_info"},
                cancel(2), cancel(3),
                {"jsonrpc": "2.0", "id": 6, "method": "ccw_info", "params": {"echo": "last"}},
            ]
            await stream.send_all(b"".join(json.dumps(f).encode() + b"\n" for f in frames))
            # End of input: the server answers everything still pending, then closes.  A
            # request that was not really cancelled would be answered before the close.
            await stream.send_eof()
            answers: list[dict] = []
            buffer = b""
            while chunk := await stream.receive_some(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                answers += [json.loads(line) for line in lines if line]
            return answers

    answers = trio.run(main)
    ids = [a["id"] for a in answers]
    assert sorted(ids) == [1, 4, 5, 6]
    assert ids.index(5) < ids.index(6)  # direct methods in request order; MCP answers when ready
    assert answers[ids.index(6)]["result"]["echo"] == "last"


def test_deep_pipeline_beyond_the_pending_limit_stays_in_order(socket_server: ServerProcess):
    from mcp_server.transports.ndjson import MAX_PENDING

    count = MAX_PENDING + 500

    async def main():
        stream = await trio.open_unix_socket(socket_server.path)
        batch = b"".join(
            json.dumps({"jsonrpc": "2.0", "id": i, "method": "ccw_info"}).encode() + b"\n" for i in range(count)
        )
        ids: list[int] = []
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, batch)
            buffer = b""
            while len(ids) < count:
                chunk = await stream.receive_some(1 << 20)
                assert chunk
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                ids += [json.loads(line)["id"] for line in lines if line]
        return ids

    assert trio.run(main) == list(range(count))


def test_second_signal_aborts_in_flight_request(tmp_path: Path):
    from mcp.shared.exceptions import MCPError

    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket"))
    path = server.wait_ready()

    async def main():
        async with Client(connect(path), mode="legacy") as client:
            await client.list_tools()
            signals: list[float] = []

            async def on_progress(value, total, message):
                if len(signals) < 2:  # first: drain; second: abort
                    server.signal(signal.SIGTERM)
                    signals.append(value)
                    if len(signals) == 1:
                        server.wait_for_line("mcp:draining")

            with pytest.raises(MCPError):
                await client.call_tool("ccw_info", {"delay_ms": 10_000}, progress_callback=on_progress)

    trio.run(main)
    assert server.wait() == 1
    assert "mcp:abort mode=socket" in server.log
    assert not os.path.exists(path)
    assert not (tmp_path / "mcp.ready").exists()


def test_client_that_hangs_up_mid_request_does_not_wedge_the_server(tmp_path: Path):
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket"))
    path = server.wait_ready()

    async def hang_up():
        stream = await trio.open_unix_socket(path)
        await stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"ccw_info","params":{"delay_ms":300}}\n')
        await stream.aclose()

    try:
        for _ in range(3):
            trio.run(hang_up)
        answers = trio.run(ndjson_session, path, [{"jsonrpc": "2.0", "id": 2, "method": "ccw_info"}])
        assert answers[0]["result"]["name"] == "ccw"
    finally:
        assert server.stop() == 0
