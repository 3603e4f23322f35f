"""Load: many concurrent clients over the unix socket and over HTTP, and exec latency
beside an abusive capsule.

``python bench/run.py load`` runs, against a real ``ccw-mcp`` per transport:

* 50 clients x 2,000 requests (``--quick``: 50 x 10) over the unix socket, each client
  on its own connection pipelining up to ``WINDOW`` requests; half the clients use
  direct methods, half an initialized MCP session (``tools/call``).  Over HTTP (loopback,
  keep-alive, one connection per client) the same mix, one request at a time per client
  (HTTP/1.1 has no pipelining in httpx2).  The mix is side-effect free: ccw_info,
  policy_list, list_schemas, validate_asset, diff_assets, read_text_file of a small
  file, snapshot_info of a snapshot of a small git repo.  Every answer's id is checked:
  none lost or duplicated, direct methods' answers in request order on their connection
  (MCP answers may overtake each other: JSON-RPC matches them by id).  Reported: p50 and
  p99 latency of a request (send to answer) and requests/s over the whole run.
* The resource-abuse clause of issue 9 (needs root): the median latency of
  ``capsule_exec /bin/true`` on one capsule while a fork bomb, a memory bomb or an
  output flood runs in another capsule, beside the same median on an idle server, as
  a ratio (target <= 2x).

``vm-tests/test_load_transports.py`` runs ``run_load`` smaller (still 50 concurrent
clients) and asserts the correctness half; latencies are only printed there.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import trio

from bench.common import Report, Row, timed_requests
from mcp_server.auth import TokenTable

ROOT = Path(__file__).resolve().parents[2]
CCW_MCP = ROOT / ".venv" / "bin" / "ccw-mcp"
WINDOW = 8  # requests a unix-socket client keeps in flight
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INIT_PARAMS = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "load", "version": "0"}}


class LoadError(AssertionError):
    """A lost, duplicated or reordered answer, or an error answer."""


class Server:
    """A ccw-mcp child; stderr is drained by a thread (the tail is kept for errors)."""

    def __init__(self, tmp: Path, endpoint: str, toolsets: str, workspace: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_", "SYN_"))}
        self.state_dir = str(tmp / f"state-{endpoint}")
        env.update(
            MCP_ENDPOINT=endpoint, MCP_SOCKET_PATH=str(tmp / f"{endpoint}.sock"),
            MCP_READY_FILE=str(tmp / f"{endpoint}.ready"),
            CCW_STATE_DIR=self.state_dir, CCW_HTTP_ADDR="127.0.0.1:0", CCW_TOOLSETS=toolsets,
            CCW_WORKSPACE=str(workspace),
        )  # fmt: skip
        self.proc = subprocess.Popen([str(CCW_MCP)], env=env, cwd=workspace, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.path = ""
        ready = threading.Event()

        def drain() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines = [*self.lines[-200:], line]
                match = re.match(r"mcp:ready mode=\S+ path=(\S+)", line)
                if match:
                    self.path = match.group(1)
                    ready.set()
            ready.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        if not ready.wait(60) or not self.path:
            self.stop()
            raise RuntimeError("ccw-mcp did not become ready:\n" + "\n".join(self.lines))

    def bearer(self) -> dict[str, str]:
        """The ``Authorization`` header HTTP needs: the token the server generated in its state dir."""
        return {"authorization": f"Bearer {TokenTable.generated(self.state_dir).token_named(None)}"}

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._drain.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


def make_workspace(tmp: Path) -> Path:
    """A small git repo with a text file and a schema-checked asset."""
    ws = tmp / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "small.py").write_text("".join(f"line_{i} = {i}\n" for i in range(40)))
    (ws / "README").write_text("load test workspace\n")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "l",
           "GIT_AUTHOR_EMAIL": "l@l", "GIT_COMMITTER_NAME": "l", "GIT_COMMITTER_EMAIL": "l@l"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=ws, env=env, check=True, capture_output=True)
    return ws


def request_mix(snapshot_id: str, workspace: Path) -> list[tuple[str, dict[str, Any]]]:
    """The side-effect-free calls a client cycles through."""
    return [
        ("ccw_info", {}),
        ("policy_list", {}),
        ("list_schemas", {}),
        ("validate_asset", {"asset": {"name": "strict", "rules": {"deny_paths": ["x"]}}, "schema": "policy"}),
        ("diff_assets", {"base": {"k": 1, "l": [1, 2]}, "new": {"k": 2, "l": [1]}}),
        ("read_text_file", {"path": str(workspace / "src" / "small.py")}),
        ("snapshot_info", {"snapshot_id": snapshot_id}),
    ]


@dataclass
class LoadResult:
    """Latencies (seconds) of every request, and the wall time of the run."""

    transport: str
    clients: int
    per_client: int
    latencies: list[float]
    wall_s: float
    tool_errors: int

    def quantile_ms(self, q: float) -> float:
        """The q-quantile of the latencies, in ms."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0

    @property
    def rate(self) -> float:
        """Requests answered per second."""
        return len(self.latencies) / self.wall_s


def _frame(request_id: int, method: str, params: dict[str, Any], session: bool) -> dict[str, Any]:
    if session:
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": method, "arguments": params}}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _failed(answer: dict[str, Any], session: bool) -> bool:
    if "error" in answer:
        return True
    return bool(session and answer.get("result", {}).get("isError"))


async def _unix_client(path: str, count: int, mix: list[tuple[str, dict[str, Any]]], session: bool,
                       offset: int, out: list[float], errors: list[int]) -> None:
    stream = await trio.open_unix_socket(path)
    buffer = b""

    async def answer() -> dict[str, Any]:
        nonlocal buffer
        while b"\n" not in buffer:
            chunk = await stream.receive_some(1 << 16)
            if not chunk:
                raise LoadError("the server closed a connection with requests in flight")
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async with stream:
        if session:
            await stream.send_all(
                json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS}).encode() + b"\n")
            if (await answer()).get("id") != 0:
                raise LoadError("initialize was not answered first")
            await stream.send_all(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        sent_at: dict[int, float] = {}
        next_send, answered = 1, 0
        while answered < count:
            while next_send <= count and len(sent_at) < WINDOW:
                method, params = mix[(offset + next_send) % len(mix)]
                sent_at[next_send] = time.perf_counter()
                await stream.send_all(json.dumps(_frame(next_send, method, params, session)).encode() + b"\n")
                next_send += 1
            message = await answer()
            # Direct methods are answered in request order (seed 001); MCP requests as
            # they finish (JSON-RPC matches by id), each exactly once.
            expected = min(sent_at)
            if message.get("id") not in sent_at or (not session and message.get("id") != expected):
                raise LoadError(f"expected the answer to id {expected if not session else sorted(sent_at)}, "
                                f"got {str(message)[:200]}")
            out.append(time.perf_counter() - sent_at.pop(message["id"]))
            errors[0] += _failed(message, session)
            answered += 1


def _decode(response: httpx2.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                message: dict[str, Any] = json.loads(line[5:])
                return message
        raise LoadError(f"an event stream without a message: {response.text[:200]}")
    decoded: dict[str, Any] = response.json()
    return decoded


async def _http_client(url: str, count: int, mix: list[tuple[str, dict[str, Any]]], session: bool,
                       offset: int, out: list[float], errors: list[int], bearer: dict[str, str]) -> None:
    limits = httpx2.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx2.AsyncClient(timeout=120, limits=limits, headers=bearer) as http:
        headers = dict(ACCEPT)
        if session:
            opened = await http.post(
                url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS}, headers=headers)
            headers.update({"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"})
            await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        for request_id in range(1, count + 1):
            method, params = mix[(offset + request_id) % len(mix)]
            start = time.perf_counter()
            response = await http.post(url, json=_frame(request_id, method, params, session), headers=headers)
            message = _decode(response)
            out.append(time.perf_counter() - start)
            if message.get("id") != request_id:
                raise LoadError(f"HTTP answer to id {request_id} carries {str(message)[:200]}")
            errors[0] += _failed(message, session)
        if session:
            await http.delete(url, headers=headers)


async def _drive(server: Server, transport: str, clients: int, count: int,
                 mix: list[tuple[str, dict[str, Any]]]) -> LoadResult:
    latencies: list[float] = []
    errors = [0]
    bearer = server.bearer() if transport == "http" else {}
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for n in range(clients):
            if transport == "socket":
                nursery.start_soon(_unix_client, server.path, count, mix, n % 2 == 1, n, latencies, errors)
            else:
                nursery.start_soon(_http_client, server.path, count, mix, n % 2 == 1, n, latencies, errors, bearer)
    wall = time.perf_counter() - start
    if len(latencies) != clients * count:
        raise LoadError(f"{len(latencies)} answers for {clients * count} requests")
    return LoadResult(transport, clients, count, latencies, wall, errors[0])


def run_load(tmp: Path, transport: str, clients: int, count: int) -> LoadResult:
    """Start a ccw-mcp on ``transport`` (socket | http), load it, check it survived, stop it."""
    workspace = tmp / "ws" if (tmp / "ws").exists() else make_workspace(tmp)
    server = Server(tmp, transport, "server,policy,schema,snapshot,text", workspace)
    try:
        snapshot_id = _snapshot(server, transport, workspace)
        result = trio.run(_drive, server, transport, clients, count, request_mix(snapshot_id, workspace))
        if not server.alive():
            raise LoadError("ccw-mcp died under load:\n" + "\n".join(server.lines[-20:]))
    finally:
        code = server.stop()
    if code != 0:
        raise LoadError(f"ccw-mcp exited {code} after the load:\n" + "\n".join(server.lines[-20:]))
    return result


def _snapshot(server: Server, transport: str, workspace: Path) -> str:
    frame = {"jsonrpc": "2.0", "id": 1, "method": "snapshot_create", "params": {}}
    if transport == "http":
        answer = _decode(httpx2.post(server.path, json=frame, headers={**ACCEPT, **server.bearer()}, timeout=60))
    else:
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(server.path)
            sock.sendall(json.dumps(frame).encode() + b"\n")
            with sock.makefile("rb") as reader:
                answer = json.loads(reader.readline())
    snapshot_id: str = answer["result"]["snapshot_id"]
    return snapshot_id


# --- exec latency beside an abusive capsule ------------------------------------------

# Each script lasts about {s} seconds (the fork bomb's parent counts to {n} instead):
# ABUSE_S and ABUSE_COUNT, or the SMOKE_ figures in --smoke.
ABUSES = {
    # In a subshell, and the parent waits with builtins: dash exits when its own fork fails.
    "fork bomb": ("(f() { f | f & }; f); i=0; while [ $i -lt {n} ]; do i=$((i+1)); done", {"pids_max": 64}),
    "memory bomb": ("python3 -c 'a=[]\nwhile True: a.append(bytearray(1<<20))'; sleep {s}", {"memory_mb": 64}),
    "output flood": ("timeout {s} yes", None),
    # Fill the capsule's disk, free it, fill it again: ENOSPC over and over, and the
    # loop device's writeback competing with everything else for the host's disk.
    "disk fill": ("timeout {s} sh -c 'while :; do dd if=/dev/zero of=fill bs=1M count=512 status=none; "
                  "rm -f fill; done'", {"disk_mb": 256}),
}
ABUSE_S, ABUSE_COUNT, SETTLE_S = 8, 4_000_000, 1.0
SMOKE_ABUSE_S, SMOKE_ABUSE_COUNT, SMOKE_SETTLE_S = 1, 200_000, 0.2


async def _exec_latencies(path: str, capsule: str, count: int) -> list[float]:
    return await timed_requests(path, "capsule_exec", {"capsule_id": capsule, "cmd": ["/bin/true"]}, count)


async def _under_abuse(path: str, victim: str, abuser: str, script: str, settle_s: float, count: int) -> list[float]:
    result: list[float] = []

    async def abuse() -> None:
        stream = await trio.open_unix_socket(path)
        async with stream:
            frame = {"jsonrpc": "2.0", "id": 1, "method": "capsule_exec",
                     "params": {"capsule_id": abuser, "cmd": ["sh", "-c", script], "timeout_ms": 30_000}}
            await stream.send_all(json.dumps(frame).encode() + b"\n")
            while not (await stream.receive_some(1 << 16)).endswith(b"\n"):
                pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(abuse)
        await trio.sleep(settle_s)  # let the abuse get going
        result = await _exec_latencies(path, victim, count)
    return result


def _call(path: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode() + b"\n")
        with sock.makefile("rb") as reader:
            answer = json.loads(reader.readline())
    if "error" in answer:
        raise LoadError(f"{method} failed: {answer['error']}")
    result: dict[str, Any] = answer["result"]
    return result


def abuse_latency(tmp: Path, count: int, smoke: bool = False) -> dict[str, tuple[float, float]]:
    """Median capsule_exec /bin/true (ms) idle and under each abuse: {abuse: (idle, busy)};
    ``smoke``: each abuse a second long."""
    seconds, loops, settle_s = ((SMOKE_ABUSE_S, SMOKE_ABUSE_COUNT, SMOKE_SETTLE_S) if smoke
                                else (ABUSE_S, ABUSE_COUNT, SETTLE_S))
    workspace = tmp / "ws" if (tmp / "ws").exists() else make_workspace(tmp)
    server = Server(tmp, "socket", "server,capsule", workspace)
    figures = {}
    try:
        for name, (template, limits) in ABUSES.items():
            script = template.replace("{s}", str(seconds)).replace("{n}", str(loops))
            victim = _call(server.path, "capsule_create", {"workspace": str(workspace)})["capsule_id"]
            create: dict[str, Any] = {"workspace": str(workspace)}
            if limits:
                create["limits"] = limits
            abuser = _call(server.path, "capsule_create", create)["capsule_id"]
            trio.run(_exec_latencies, server.path, victim, 5)  # warm up
            idle = statistics.median(trio.run(_exec_latencies, server.path, victim, count))
            busy = statistics.median(trio.run(_under_abuse, server.path, victim, abuser, script, settle_s, count))
            figures[name] = (idle * 1000.0, busy * 1000.0)
            for capsule in (victim, abuser):
                _call(server.path, "capsule_destroy", {"capsule_id": capsule})
    finally:
        server.stop()
    return figures


def run(quick: bool = False, smoke: bool = False) -> Report:
    """Load both transports; measure exec latency beside abusive capsules (as root)."""
    report = Report("load")
    clients, count = 50, (10 if quick else 2000)  # quick: 100 each took 86 s and 150 s under load
    if smoke:  # two clients of each kind (direct methods, MCP session), the mix seen once or more
        clients, count = 4, len(request_mix("", ROOT))
    with tempfile.TemporaryDirectory(prefix="ccw-bench-load-") as tmp_name:
        tmp = Path(tmp_name)
        for transport in ("socket", "http"):
            result = run_load(tmp, transport, clients, count)
            report.add(Row(
                f"{transport}: {clients} clients x {count} mixed requests, p50", result.quantile_ms(0.5),
                extra={"p99_ms": round(result.quantile_ms(0.99), 2), "requests_per_s": round(result.rate, 1),
                       "wall_s": round(result.wall_s, 1), "tool_errors": result.tool_errors},
            ))  # fmt: skip
        if os.geteuid() == 0:
            for name, (idle, busy) in abuse_latency(tmp, 2 if smoke else 10 if quick else 60, smoke).items():
                report.add(Row(f"exec /bin/true beside a {name}", busy, "same, idle server", idle, "<= 2x"))
        else:
            report.notes.append("exec latency beside abusive capsules needs root (the helper runs privileged)")
    report.notes.append("no lost or duplicated answers on any connection, direct methods' in order "
                        "(checked per request id)")
    return report
