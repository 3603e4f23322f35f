"""The MCP front end over its unix socket: latency and throughput of a trivial tool.

Measured in one run, against a real ``ccw-mcp`` process (``MCP_ENDPOINT=socket``):

* ``ccw_info`` as a direct method, one request at a time: median round trip, beside
  the same call made in process on ``CcwServer.run_direct`` (the transport's share is
  the ratio);
* ``ccw_info`` through ``tools/call`` with the SDK's client (2025-11-25 handshake era);
* requests/s with 4 connections each pipelining direct-method requests.

* ``capsule_create`` and ``capsule_exec`` of /bin/true end to end (direct methods over
  the unix socket), each beside the same operation sent straight to the helper the
  front end started (its IPC socket), in the same run: the front end's overhead as a
  ratio.  The execs are interleaved round by round with ``bwrap --unshare-all`` of
  /bin/true, the issue's baseline.  Targets: exec <= 2x the helper's own and <= 1.5x
  bwrap, create <= 10 ms median.  Needs root.
* ``capsule_exec`` of /bin/true with one ``ccw watch`` following the state dir against
  none (bench/parts/watcher.py; target <= 1.05x).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import Report, Row, timed_requests

ROOT = Path(__file__).resolve().parents[2]
CCW_MCP = ROOT / ".venv" / "bin" / "ccw-mcp"


def _start(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    env.update(
        MCP_ENDPOINT="socket", MCP_SOCKET_PATH=str(tmp / "mcp.sock"), MCP_READY_FILE=str(tmp / "ready"),
        CCW_STATE_DIR=str(tmp / "state"), CCW_TOOLSETS="server,capsule",
    )
    proc = subprocess.Popen([str(CCW_MCP)], env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    for raw in proc.stderr:
        match = re.match(r"mcp:ready mode=socket path=(\S+)", raw.decode())
        if match:
            return proc, match.group(1)
    raise RuntimeError("ccw-mcp did not become ready")


async def _sequential(path: str, count: int) -> list[float]:
    return await timed_requests(path, "ccw_info", {}, count)


async def _pipelined(path: str, connections: int, per_connection: int) -> float:
    async def one() -> None:
        stream = await trio.open_unix_socket(path)
        batch = b"".join(
            json.dumps({"jsonrpc": "2.0", "id": i, "method": "ccw_info"}).encode() + b"\n"
            for i in range(per_connection)
        )
        async with stream, trio.open_nursery() as nursery:
            # Send while reading, as a pipelining client must (the server stops reading
            # a connection whose answers are not being read).
            nursery.start_soon(stream.send_all, batch)
            seen = 0
            while seen < per_connection:
                seen += (await stream.receive_some(1 << 20)).count(b"\n")

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    return connections * per_connection / (time.perf_counter() - start)


async def _sdk_calls(path: str, count: int) -> list[float]:
    from mcp import Client

    from mcp_server.transports.unix import connect

    times = []
    async with Client(connect(path), mode="legacy") as client:
        await client.list_tools()
        for _ in range(count):
            start = time.perf_counter()
            await client.call_tool("ccw_info", {})
            times.append(time.perf_counter() - start)
    return times


async def _in_process(state_dir: Path, count: int) -> list[float]:
    from mcp_server.config import Config
    from mcp_server.server import CcwServer
    from mcp_server.state import State

    config = Config.from_env({"CCW_STATE_DIR": str(state_dir), "CCW_TOOLSETS": "server"})
    server = CcwServer(config, State(config.state_dir))
    times = []
    for i in range(count):
        start = time.perf_counter()
        await server.run_direct(i, "ccw_info", {})
        times.append(time.perf_counter() - start)
    server.state.close()
    return times


async def _call(stream: Any, buffer: list[bytes], request_id: int, method: str,
                params: dict[str, Any]) -> dict[str, Any]:
    await stream.send_all(
        json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n")
    while b"\n" not in buffer[0]:
        buffer[0] += await stream.receive_some(1 << 20)
    line, buffer[0] = buffer[0].split(b"\n", 1)
    reply: dict[str, Any] = json.loads(line)
    if "result" not in reply:
        raise RuntimeError(f"{method} failed: {reply}")
    return reply["result"]


async def _capsules(path: str, state_dir: Path, workspace: Path, count: int) -> dict[str, list[float]]:
    """capsule_create through the front end then on the helper; capsule_exec, the helper's
    exec and bwrap interleaved (``_execs``)."""
    from sandbox.client import HelperClient
    from sandbox.ops import CreateRequest, DestroyRequest
    from sandbox.spec import CapsuleSpec

    out: dict[str, list[float]] = {"create": [], "helper_create": []}
    stream = await trio.open_unix_socket(path)
    buffer = [b""]
    created = []
    async with stream:
        for i in range(count):
            start = time.perf_counter()
            cap = await _call(stream, buffer, i, "capsule_create", {"workspace": str(workspace)})
            out["create"].append(time.perf_counter() - start)
            created.append(cap["capsule_id"])
        helper = HelperClient(str(state_dir / "helper" / "helper.sock"))
        try:
            out.update(await _execs(stream, buffer, helper, created[0], workspace, count))
            for _ in range(count):
                start = time.perf_counter()
                made = await helper.call(CreateRequest(CapsuleSpec(str(workspace))))
                out["helper_create"].append(time.perf_counter() - start)
                created.append(made.capsule_id)
            for capsule_id in created:
                await helper.call(DestroyRequest(capsule_id))
        finally:
            await helper.aclose()
    return out


async def _execs(stream: Any, buffer: list[bytes], helper: Any, target: str, workspace: Path,
                 count: int) -> dict[str, list[float]]:
    """/bin/true by capsule_exec end to end, by the helper's own exec over its IPC, and in
    ``bwrap --unshare-all`` (bench/parts/jail_exec.py) where it is installed: one warm-up
    each, then a new order every round (as bench.common.interleaved), so load on the
    2-core VM hits all three alike."""
    from bench.parts.jail_exec import BWRAP, BWRAP_ARGS
    from sandbox.ops import ExecRequest

    ids = iter(range(10_000, 1_000_000))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

    async def capsule_exec() -> None:
        ran = await _call(stream, buffer, next(ids), "capsule_exec", {"capsule_id": target, "cmd": ["/bin/true"]})
        assert ran["exit_code"] == 0

    async def helper_exec() -> None:
        await helper.call(ExecRequest(target, ("/bin/true",), cwd=str(workspace), env=env, timeout_ms=60_000))

    async def bwrap() -> None:
        # The capsule suite's very call, so both ratios share a baseline; nothing else runs
        # on the loop meanwhile.
        subprocess.run(BWRAP_ARGS, check=True)  # noqa: ASYNC221

    runners = {"exec": capsule_exec, "helper_exec": helper_exec}
    if os.access(BWRAP, os.X_OK):
        runners["bwrap"] = bwrap
    for runner in runners.values():
        await runner()
    times: dict[str, list[float]] = {name: [] for name in runners}
    shuffler, order = random.Random(0), list(runners)
    for _ in range(count):
        shuffler.shuffle(order)
        for name in order:
            start = time.perf_counter()
            await runners[name]()
            times[name].append(time.perf_counter() - start)
    return times


async def _watched(path: str, state_dir: Path, workspace: Path, blocks: int, per_block: int) -> Row:
    """capsule_exec end to end with a ``ccw watch`` attached against none (bench/parts/watcher.py)."""
    from bench.parts import watcher

    stream = await trio.open_unix_socket(path)
    buffer, ids = [b""], iter(range(20_000, 1_000_000))
    async with stream:
        target = (await _call(stream, buffer, next(ids), "capsule_create", {"workspace": str(workspace)}))["capsule_id"]

        async def exec_once() -> float:
            start = time.perf_counter()
            ran = await _call(stream, buffer, next(ids), "capsule_exec", {"capsule_id": target, "cmd": ["/bin/true"]})
            elapsed = time.perf_counter() - start
            assert ran["exit_code"] == 0
            return elapsed

        return await watcher.measure(exec_once, state_dir, blocks, per_block)


def _median_ms(times: list[float]) -> float:
    return statistics.median(times[len(times) // 10 :]) * 1000  # first 10%: warm-up


def run(quick: bool = False) -> Report:
    """Measure the front end's transport overhead and throughput."""
    report = Report("mcp")
    count = 100 if quick else 2000  # quick: a smoke run (CI)
    with tempfile.TemporaryDirectory(prefix="ccw-bench-mcp-") as tmp_name:
        tmp = Path(tmp_name)
        proc, path = _start(tmp)
        try:
            direct = trio.run(_sequential, path, count)
            local = trio.run(_in_process, tmp / "state-local", count)
            sdk = trio.run(_sdk_calls, path, count // 4)
            rate = trio.run(_pipelined, path, 4, count)
            workspace = tmp / "ws"
            workspace.mkdir()
            (workspace / "file.txt").write_text("x\n")
            capsules = trio.run(_capsules, path, tmp / "state", workspace, 10 if quick else 100)
            watched = trio.run(_watched, path, tmp / "state", workspace, 2 if quick else 10, 5 if quick else 25)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            if proc.stderr is not None:
                proc.stderr.close()
    report.add(Row("ccw_info direct method, unix socket", _median_ms(direct),
                   baseline="in-process run_direct", baseline_ms=_median_ms(local)))
    report.add(Row("ccw_info tools/call, SDK client, unix socket", _median_ms(sdk),
                   baseline="direct method, unix socket", baseline_ms=_median_ms(direct)))
    extra: dict[str, Any] = {"requests_per_s": round(rate), "connections": 4, "pipelined_per_connection": count}
    report.add(Row("pipelined ccw_info (ms per request)", 1000.0 / rate, extra=extra))
    report.add(Row("capsule_create end to end, unix socket", _median_ms(capsules["create"]),
                   baseline="helper create over its IPC", baseline_ms=_median_ms(capsules["helper_create"]),
                   target="<= 10 ms"))
    report.add(Row("capsule_exec /bin/true end to end, unix socket", _median_ms(capsules["exec"]),
                   baseline="helper exec over its IPC", baseline_ms=_median_ms(capsules["helper_exec"]),
                   target="<= 2x"))
    if "bwrap" in capsules:  # the target for exec over MCP, from the same interleaved rounds
        report.add(Row("capsule_exec /bin/true end to end, unix socket", _median_ms(capsules["exec"]),
                       baseline="bwrap --unshare-all", baseline_ms=_median_ms(capsules["bwrap"]),
                       target="<= 1.5x"))
    report.add(watched)
    report.notes.append("medians over the run after a 10% warm-up; ratios compare figures from this run")
    return report
