"""Parallel tool calls on one capsule, through real MCP clients (issue 13 item 5).

Execs on a capsule take turns in arrival order instead of failing with CONFLICT; a
queued exec says so in its progress reports and, cancelled, never runs; a diff and a
file read answer while an exec runs.  Over the SDK's client on stdio and Streamable
HTTP, and as pipelined NDJSON frames on the unix socket.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.support.mcp_process import ServerProcess, server_env

ROOT = Path(__file__).resolve().parent.parent
SLOW = ["sh", "-c", "sleep 3; echo first >> order.txt"]
SECOND = ["sh", "-c", "echo second >> order.txt; cat order.txt"]
NEVER = ["sh", "-c", "echo never >> order.txt"]


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    return ws


def _journaled(state_dir: Path, capsule_id: str) -> list[list[str]]:
    from mcp_server.journal import Journal
    from mcp_server.state import State

    state = State(state_dir)
    try:
        return [ex["argv"] for ex in Journal(state).execs(capsule_id)]
    finally:
        state.close()


def _stdio_client(tmp_path: Path) -> Any:
    """An SDK client of a ccw-mcp it starts on stdio, over the state dir tmp_path/state."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    env.update(CCW_STATE_DIR=str(tmp_path / "state"), MCP_READY_FILE=str(tmp_path / "ready"), CCW_DEBUG="1")
    return Client(StdioServerParameters(command=str(ROOT / ".venv" / "bin" / "ccw-mcp"), env=env), mode="legacy")


# The SDK's HTTP client leaves the response streams of a cancelled call to the garbage
# collector (httpx2 async generators, in this test process): its ResourceWarnings are
# the client's, not the server's.
_CLIENT_LEAKS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.mark.parametrize("transport", ["stdio", pytest.param("http", marks=_CLIENT_LEAKS)])
def test_parallel_calls_through_the_sdk(tmp_path: Path, root_required: None, transport: str) -> None:
    ws = _workspace(tmp_path)
    server: ServerProcess | None = None
    connect: Any
    if transport == "stdio":
        def connect() -> Any:
            return _stdio_client(tmp_path)
    else:
        server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_TOOLSETS="capsule,text"))
        server.wait_ready()
        connect = server.client  # an SDK client that sends the server's bearer token
    finished: list[str] = []  # tool calls in the order their answers arrived
    results: dict[str, Any] = {}
    reports: dict[str, list[str]] = {"second": [], "never": []}

    async def scenario() -> str:
        async with connect() as client:
            cap = (await client.call_tool("capsule_create", {"workspace": str(ws)})).structured_content["capsule_id"]
            first_running, second_queued, never_queued = trio.Event(), trio.Event(), trio.Event()

            async def on_first(progress: float, total: float | None, message: str | None) -> None:
                first_running.set()

            def on_queued(name: str, event: trio.Event) -> Any:
                async def report(progress: float, total: float | None, message: str | None) -> None:
                    reports[name].append(message or "")
                    if "queued" in (message or ""):
                        event.set()
                return report

            async def call(name: str, tool: str, args: dict[str, Any], progress: Any = None) -> None:
                results[name] = await client.call_tool(tool, args, progress_callback=progress)
                finished.append(name)

            never = trio.CancelScope()

            async def cancelled_call() -> None:
                with never:
                    await call("never", "capsule_exec", {"capsule_id": cap, "cmd": NEVER},
                               on_queued("never", never_queued))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "first", "capsule_exec", {"capsule_id": cap, "cmd": SLOW}, on_first)
                await first_running.wait()  # the first exec holds the capsule
                nursery.start_soon(call, "second", "capsule_exec", {"capsule_id": cap, "cmd": SECOND},
                                   on_queued("second", second_queued))
                await second_queued.wait()
                nursery.start_soon(cancelled_call)
                await never_queued.wait()
                never.cancel()  # the SDK sends notifications/cancelled for it
                await call("diff", "capsule_diff", {"capsule_id": cap, "format": "stat"})
                await call("read", "read_text_file", {"path": str(ws / "notes.txt"), "capsule_id": cap})
            listed = await client.call_tool("capsule_list", {})
            assert listed.structured_content["capsules"][0]["execs"] == 2
            return str(cap)

    try:
        capsule_id = trio.run(scenario)
    finally:
        if server is not None:
            assert server.stop() == 0
    # The diff and the read were answered while the first exec still ran; the execs in
    # arrival order, both successful; the cancelled one never answered and never ran.
    assert finished == ["diff", "read", "first", "second"], finished
    assert all(not results[name].is_error for name in finished)
    assert results["second"].structured_content["stdout"] == "first\nsecond\n"
    assert results["second"].structured_content["queued_ms"] > 0
    assert "|hello" in results["read"].structured_content["content"]
    assert any("queued: 1 ahead" in m and "exec `sh -c 'sleep 3" in m for m in reports["second"]), reports
    assert any("queued: 2 ahead" in m for m in reports["never"]), reports
    assert _journaled(tmp_path / "state", capsule_id) == [SLOW, SECOND]


def _call(request_id: Any, tool: str, args: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": args}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def test_pipelined_frames_on_the_unix_socket(tmp_path: Path, root_required: None) -> None:
    ws = _workspace(tmp_path)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", CCW_TOOLSETS="capsule,text"))
    path = server.wait_ready()
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}

    async def main() -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        stream = await trio.open_unix_socket(path)
        buffer = b""

        async def messages() -> list[dict[str, Any]]:
            nonlocal buffer
            while b"\n" not in buffer:
                chunk = await stream.receive_some(1 << 16)
                if not chunk:
                    return []
                buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            return [json.loads(line) for line in lines if line]

        async def send(*frames: dict[str, Any]) -> None:
            await stream.send_all(b"".join(json.dumps(f).encode() + b"\n" for f in frames))

        async with stream:
            await send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
                       {"jsonrpc": "2.0", "method": "notifications/initialized"},
                       _call(1, "capsule_create", {"workspace": str(ws)}))
            answers: list[dict[str, Any]] = []
            while not any(a.get("id") == 1 for a in answers):
                answers += await messages()
            cap = next(a for a in answers if a.get("id") == 1)["result"]["structuredContent"]["capsule_id"]
            # Everything at once, in one write: two execs, one to be cancelled, a destroy
            # and an exec after it, then a diff and a read that must not wait for them.
            await send(_call("first", "capsule_exec", {"capsule_id": cap, "cmd": SLOW}),
                       _call("second", "capsule_exec", {"capsule_id": cap, "cmd": SECOND}, token="second"),
                       _call("never", "capsule_exec", {"capsule_id": cap, "cmd": NEVER}, token="never"),
                       _call("destroy", "capsule_destroy", {"capsule_id": cap}),
                       _call("late", "capsule_exec", {"capsule_id": cap, "cmd": ["true"]}),
                       _call("diff", "capsule_diff", {"capsule_id": cap, "format": "stat"}),
                       _call("read", "read_text_file", {"path": str(ws / "notes.txt"), "capsule_id": cap}))
            seen: list[dict[str, Any]] = []
            cancelled = False
            while not any(m.get("id") == "late" for m in seen):
                batch = await messages()
                assert batch, "the server closed the connection"
                seen += batch
                queued = [m for m in batch if m.get("method") == "notifications/progress"
                          and m["params"]["progressToken"] == "never" and "queued" in m["params"].get("message", "")]
                if queued and not cancelled:
                    cancelled = True
                    await send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                "params": {"requestId": "never"}})
            await stream.send_eof()
            while batch := await messages():  # anything still pending is answered before the close
                seen += batch
            return cap, [m for m in seen if "id" in m], [m for m in seen if m.get("method") == "notifications/progress"]

    try:
        capsule_id, answers, progress = trio.run(main)
    finally:
        assert server.stop() == 0
    order = [a["id"] for a in answers]
    assert order.index("diff") < order.index("first") and order.index("read") < order.index("first"), order
    assert order.index("first") < order.index("second") < order.index("destroy") < order.index("late"), order
    assert "never" not in order  # cancelled while queued: no answer
    by_id = {a["id"]: a["result"] for a in answers}
    assert by_id["second"]["structuredContent"]["stdout"] == "first\nsecond\n"
    assert by_id["destroy"]["structuredContent"] == {"capsule_id": capsule_id, "destroyed": True}
    assert by_id["late"]["isError"] and by_id["late"]["structuredContent"]["error"]["code"] == "NOT_FOUND"
    assert not by_id["diff"]["isError"] and not by_id["read"]["isError"]
    second = [p["params"]["message"] for p in progress if p["params"]["progressToken"] == "second"]
    assert any(m.startswith("queued: 1 ahead") for m in second), second
    assert _journaled(tmp_path / "state", capsule_id) == [SLOW, SECOND]


def test_cancelling_a_running_exec_hands_the_capsule_to_the_next(tmp_path: Path, root_required: None) -> None:
    ws = _workspace(tmp_path)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", CCW_TOOLSETS="capsule"))
    path = server.wait_ready()

    async def main() -> tuple[list[dict[str, Any]], str]:
        stream = await trio.open_unix_socket(path)
        buffer = b""
        seen: list[dict[str, Any]] = []

        async def until(request_id: str) -> dict[str, Any]:
            nonlocal buffer
            while not any(m.get("id") == request_id for m in seen):
                while b"\n" not in buffer:
                    chunk = await stream.receive_some(1 << 16)
                    assert chunk, "the server closed the connection"
                    buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                seen.extend(json.loads(line) for line in lines if line)
            return next(m for m in seen if m.get("id") == request_id)

        async def send(*frames: dict[str, Any]) -> None:
            await stream.send_all(b"".join(json.dumps(f).encode() + b"\n" for f in frames))

        async with stream:
            await send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                _call("create", "capsule_create", {"workspace": str(ws)}))
            cap = (await until("create"))["result"]["structuredContent"]["capsule_id"]
            # A long exec that writes as it starts, then an exec queued behind it.
            await send(_call("long", "capsule_exec",
                             {"capsule_id": cap, "cmd": ["sh", "-c", "echo x > out.txt; sleep 60"]}, token="long"),
                       _call("next", "capsule_exec", {"capsule_id": cap, "cmd": ["cat", "out.txt"]}))
            while not any(m.get("method") == "notifications/progress" and m["params"]["progressToken"] == "long"
                          for m in seen):  # it runs
                await send(_call("probe", "capsule_list", {}))
                await until("probe")
                seen[:] = [m for m in seen if m.get("id") != "probe"]
            await send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "long"}})
            following = await until("next")
            await send(_call("list", "capsule_list", {}))
            listed = await until("list")
            return [following, listed], cap

    try:
        (following, listed), capsule_id = trio.run(main)
    finally:
        assert server.stop() == 0
    # The cancelled exec's jail was ended, so the next one ran instead of meeting CONFLICT;
    # what the cancelled one wrote counts as a change (generation advanced), and it is
    # journaled cut short, with what is known of it.
    assert not following["result"]["isError"], following
    result = following["result"]["structuredContent"]
    assert result["stdout"] == "x\n" and result["started_generation"] == 1
    assert listed["result"]["structuredContent"]["capsules"][0]["execs"] == 2
    long = ["sh", "-c", "echo x > out.txt; sleep 60"]
    assert _journaled(tmp_path / "state", capsule_id) == [long, ["cat", "out.txt"]]


def test_a_race_past_wait_ms_keeps_its_place_in_the_capsules_still_waiting_for_a_core(tmp_path: Path,
                                                                                      root_required: None) -> None:
    # Found in a trial: 3 capsules raced on 2 cores, answered "running" after wait_ms; an exec sent
    # then to the capsule still waiting for a core ran first, and the race's command saw its write.
    assert os.cpu_count() == 2, "the VM has 2 cores: the third capsule waits for one"
    ws = _workspace(tmp_path)
    race_cmd = ["sh", "-c", "sleep 2; test ! -e late.txt"]

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
        async with _stdio_client(tmp_path) as client:
            async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
                result = await client.call_tool(tool, args)
                assert not result.is_error, result
                return dict(result.structured_content or {})

            parent = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            forks = (await call("capsule_fork", {"capsule_id": parent, "count": 3}))["capsule_ids"]
            started = await call("capsule_race", {"capsule_ids": forks, "cmd": race_cmd, "wait_ms": 500})
            assert started["status"] == "running", started
            late: list[dict[str, Any]] = []
            async with trio.open_nursery() as nursery:  # one exec in each, sent after the answer
                for fork in forks:
                    nursery.start_soon(lambda fork=fork: _append(late, call("capsule_exec", {
                        "capsule_id": fork, "cmd": ["sh", "-c", "echo late > late.txt"]})))
            fetched = await call("capsule_run", {"run_id": started["run_id"], "wait_ms": None})
            return fetched, late, forks

    race, late, forks = trio.run(scenario)
    assert [(row["capsule_id"] in forks, row["exit_code"]) for row in race["rows"]] == [(True, 0)] * 3, race
    assert race["parallel"] == 2
    assert all(one["exit_code"] == 0 for one in late), late
    for fork in forks:
        assert _journaled(tmp_path / "state", fork) == [race_cmd, ["sh", "-c", "echo late > late.txt"]]


def test_a_race_cut_short_by_its_servers_end_is_in_each_capsules_log(tmp_path: Path, root_required: None) -> None:
    # Found in a trial: a race answered "running", then the client closed and its stdio server
    # ended, killing the racing commands; none of them was in `ccw capsule log`.
    from mcp_server.capsules.exec import CANCELLED
    from tests.support.cli_process import ccw

    ws = _workspace(tmp_path)
    race_cmd = ["sh", "-c", "echo started > r.txt; sleep 60"]

    async def scenario() -> list[str]:
        with trio.fail_after(60):
            return await cut_race()

    async def cut_race() -> list[str]:
        async with _stdio_client(tmp_path) as client:
            parent = (await client.call_tool("capsule_create", {"workspace": str(ws)})).structured_content
            forks = (await client.call_tool("capsule_fork", {"capsule_id": parent["capsule_id"], "count": 2}))
            ids = list(forks.structured_content["capsule_ids"])
            started = await client.call_tool("capsule_race", {"capsule_ids": ids, "cmd": race_cmd, "wait_ms": 1500})
            assert started.structured_content["status"] == "running", started
            return ids  # the client closes: its server ends, and the race with it

    forks = trio.run(scenario)
    for fork in forks:
        listed = json.loads(ccw(tmp_path / "state", "capsule", "log", fork, "--json").stdout)["runs"]
        assert [(run["argv"], run["cut_short"], run["exit_code"], run["generation"]) for run in listed] == [
            (race_cmd, CANCELLED, None, None)], listed
        assert listed[0]["duration_ms"] >= 1000 and listed[0]["generation_out"] == 1  # what it wrote is unknown
        shown = ccw(tmp_path / "state", "capsule", "show", fork, "1").stdout
        assert "exit cut after" in shown and f"cut short: {CANCELLED}" in shown, shown


async def _append(into: list[dict[str, Any]], answer: Any) -> None:
    into.append(await answer)


def test_fork_waits_for_the_running_exec(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(t.call, "capsule_exec",
                               {"capsule_id": cap, "cmd": ["sh", "-c", "sleep 2; echo done > made.txt"]})
            await trio.testing.wait_all_tasks_blocked(0.05)  # the exec waits for the helper's reply
            assert ([ticket.label for ticket in t.runtime.capsule_queue.line(cap)]
                    == ["exec `sh -c 'sleep 2; echo done > made.txt'`"])
            # Before turns: CONFLICT "capsule … is running a command; fork it when that ends".
            fork = await t.call("capsule_fork", {"capsule_id": cap})
        seen = await t.call("capsule_exec", {"capsule_id": fork["capsule_id"], "cmd": ["cat", "made.txt"]})
        await t.call("capsule_destroy", {"capsule_id": fork["capsule_id"]})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return fork, seen

    fork, seen = tools.run(scenario)
    assert fork["generation"] == 0 and fork["parent"]
    assert seen["stdout"] == "done\n"  # the fork was made after the exec had finished


def test_witness_and_promote_wait_for_the_running_exec(tools: Any, tmp_path: Path) -> None:
    # Sent while an exec runs, a witness must hold that run whole and a promotion must
    # write what it wrote, not a half-done tree or a journal without it.
    ws = _workspace(tmp_path)
    slow = ["sh", "-c", "sleep 2; echo done > made.txt"]

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(t.call, "capsule_exec", {"capsule_id": cap, "cmd": slow})
            await trio.testing.wait_all_tasks_blocked(0.05)
            witness = await t.call("capsule_witness", {"capsule_id": cap})
            nursery.start_soon(t.call, "capsule_exec",
                               {"capsule_id": cap, "cmd": ["sh", "-c", "sleep 1; echo more > more.txt"]})
            await trio.testing.wait_all_tasks_blocked(0.05)
            promoted = await t.call("capsule_promote", {"capsule_id": cap})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return witness, promoted

    witness, promoted = tools.run(scenario)
    from mcp_server.fs.witness import read_archive

    with open(witness["path"], "rb") as archive:
        manifest = read_archive(archive)[0]
    assert [ex["argv"] for ex in manifest["execs"]] == [slow]
    assert promoted["promoted"] is True
    assert (ws / "made.txt").read_text() == "done\n" and (ws / "more.txt").read_text() == "more\n"
