"""Long runs as MCP tasks (issue 25, item 6; mcp_server/tasks.py), through a real ccw-mcp.

A client that declares ``io.modelcontextprotocol/tasks`` on its 2026-07-28 request gets a
long capsule_exec as a task (``resultType: "task"``) and polls it with ``tasks/get``
until it holds the exec's own CallToolResult; ``tasks/cancel`` ends the jail.  A client
that does not declare it, or one of the 2025-11-25 era, gets ``status: running`` and a
run id, as before.  Over HTTP a task, like a run, is the token's that started it.
The same holds for an unprivileged user with a rootless helper.  The client is raw
JSON-RPC (tests/support/raw_mcp.py over stdio; 2026-era POSTs over HTTP): the SDK's client can
neither declare an extension per request nor send ``tasks/get``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx2

from tests.support.mcp_process import ServerProcess, server_env
from tests.support.processes import running_pids
from tests.support.raw_mcp import MODERN, RawStdio, envelope, structured
from tests.support.users import run_script_as
from tests.support.workspaces import make_workspace

HERE = Path(__file__).resolve().parent
SLOW = ["sh", "-c", "sleep 3; echo first >> order.txt; echo done"]


def _capsule(client: RawStdio, tmp_path: Path) -> str:
    ws = make_workspace(tmp_path / "ws", {"a.txt": "good\n"})
    capsule_id: str = structured(client.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    return capsule_id


def _poll(client: RawStdio, task_id: str, limit_s: float = 60) -> tuple[dict[str, Any], list[str]]:
    """``tasks/get`` until the task is terminal: (its last state, every status seen)."""
    seen = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        answer = client.request("tasks/get", {"taskId": task_id})
        assert "result" in answer, answer
        task: dict[str, Any] = answer["result"]
        assert task["resultType"] == "complete" and task["taskId"] == task_id
        seen.append(task["status"])
        if task["status"] != "working":
            return task, seen
        time.sleep(0.3)  # shorter than pollIntervalMs: the test should not wait for nothing
    raise AssertionError(f"task {task_id} still working after {limit_s} s: {seen[-3:]}")


def test_a_declaring_clients_long_exec_is_a_task_with_the_execs_result(tmp_path: Path, root_required: None) -> None:
    with RawStdio(tmp_path / "state", "capsule", tasks=True) as client:
        cap = _capsule(client, tmp_path)
        created = client.call("capsule_exec", {"capsule_id": cap, "cmd": SLOW, "wait_ms": 1000}, timeout=10)
        working = client.request("tasks/get", {"taskId": created["taskId"]})["result"]
        # Sent while the task runs: it waits its turn behind it (no budget: its plain result).
        after = client.call("capsule_exec", {"capsule_id": cap, "cmd": ["cat", "order.txt"], "wait_ms": None})
        task, seen = _poll(client, created["taskId"])
        again = client.call("capsule_run", {"run_id": created["taskId"], "wait_ms": 0})  # the same run
        quick = client.call("capsule_exec", {"capsule_id": cap, "cmd": ["echo", "quick"]})

    assert created["resultType"] == "task" and created["status"] == "working", created
    assert created["taskId"].startswith("run_") and "content" not in created
    assert created["ttlMs"] is None and created["pollIntervalMs"] > 0 and created["createdAt"].endswith("Z")
    assert after["structuredContent"]["stdout"] == "first\n"  # it ran after the task's exec
    assert working["status"] == "working" and working["taskId"] == created["taskId"]
    assert working["resultType"] == "complete" and "result" not in working
    assert seen[-1] == "completed"
    assert task["ttlMs"] > 0 and task["lastUpdatedAt"] >= task["createdAt"]
    result = task["result"]
    assert result["structuredContent"]["exit_code"] == 0 and result["structuredContent"]["stdout"] == "done\n"
    assert "status" not in result["structuredContent"]  # the exec's own result, not a run summary
    assert json.loads(result["content"][0]["text"].splitlines()[0]) == result["structuredContent"]
    assert not result.get("isError")
    assert again["structuredContent"] == result["structuredContent"]
    # The shape tools/call gives a finished exec (apart from what differs per exec).
    assert set(result) <= set(quick) and set(result["structuredContent"]) == set(quick["structuredContent"])


def test_a_client_that_does_not_declare_never_gets_a_task(tmp_path: Path, root_required: None) -> None:
    answers = {}
    for era, tasks in (("2026", False), ("2025", None)):
        (tmp_path / era).mkdir()
        with RawStdio(tmp_path / era / "state", "capsule", tasks=tasks) as client:
            cap = _capsule(client, tmp_path / era)
            running = client.call("capsule_exec", {"capsule_id": cap, "cmd": SLOW, "wait_ms": 1000}, timeout=10)
            run_id = running["structuredContent"]["run_id"]
            polled = client.request("tasks/get", {"taskId": run_id})
            done = client.call("capsule_run", {"run_id": run_id, "wait_ms": None})
            answers[era] = (running, polled, done)
    for era, (running, polled, done) in answers.items():
        assert running.get("resultType") != "task" and "taskId" not in running, era
        assert running["structuredContent"]["status"] == "running", era
        assert "error" in polled, era  # a run it was never given as a task is no task
        assert done["structuredContent"]["stdout"] == "done\n", era
    assert answers["2026"][1]["error"]["code"] == -32602 and answers["2025"][1]["error"]["code"] == -32601


def test_tasks_cancel_ends_the_jail_and_frees_the_capsule(tmp_path: Path, root_required: None) -> None:
    marker = ["sleep", f"{5000 + os.getpid() % 1000}.25"]  # a command line no one else runs
    with RawStdio(tmp_path / "state", "capsule", tasks=True) as client:
        cap = _capsule(client, tmp_path)
        created = client.call("capsule_exec", {"capsule_id": cap, "cmd": marker, "wait_ms": 800}, timeout=10)
        alive = running_pids(marker)
        began = time.monotonic()
        ack = client.request("tasks/cancel", {"taskId": created["taskId"]})
        took = time.monotonic() - began
        gone = running_pids(marker)
        task = client.request("tasks/get", {"taskId": created["taskId"]})["result"]
        after = client.call("capsule_exec", {"capsule_id": cap, "cmd": ["echo", "after"]}, timeout=10)
    assert created["resultType"] == "task" and alive, "the task's command should be running"
    assert ack["result"]["resultType"] == "complete" and set(ack["result"]) <= {"resultType", "_meta"}  # empty
    assert gone == [] and took < 10  # the jail ended before the ack, not left to sleep
    assert task["status"] == "cancelled" and "result" not in task
    assert after["structuredContent"]["stdout"] == "after\n"


TOKENS = {"tokens": [{"name": "alice", "token": "alice-token-0123456789", "scopes": ["read", "exec"]},
                     {"name": "bob", "token": "bob-token-0123456789ab", "scopes": ["read", "exec"]}]}


class _Http:
    """2026-era requests to a ccw-mcp over HTTP as one token; ``request`` returns the response."""

    def __init__(self, http: httpx2.Client, url: str, token: str) -> None:
        self.http, self.url, self.token = http, url, token

    def request(self, method: str, params: dict[str, Any], tasks: bool = True) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.token}", "accept": "application/json, text/event-stream",
                   "mcp-protocol-version": MODERN, "mcp-method": method}
        if method.startswith("tasks/"):
            headers["mcp-name"] = params["taskId"]  # the routing header the extension asks for
        elif method == "tools/call":
            headers["mcp-name"] = params["name"]
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": envelope(tasks)}}
        answer: dict[str, Any] = self.http.post(self.url, json=body, headers=headers, timeout=60).json()
        return answer

    def call(self, tool: str, args: dict[str, Any], tasks: bool = True) -> dict[str, Any]:
        answer = self.request("tools/call", {"name": tool, "arguments": args}, tasks)
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    def direct(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A direct method (a tool called by name, seed 001 style)."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer: dict[str, Any] = self.http.post(self.url, json=body, timeout=60, headers={
            "authorization": f"Bearer {self.token}"}).json()
        return answer


def test_a_task_and_a_run_are_the_starting_tokens_only(tmp_path: Path, root_required: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    tokens.chmod(0o600)
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", CCW_TOKENS_FILE=str(tokens),
                                      CCW_TOOLSETS="capsule"))
    url = server.wait_ready()
    try:
        with httpx2.Client() as http:
            alice, bob = (_Http(http, url, t["token"]) for t in TOKENS["tokens"])
            cap = alice.call("capsule_create", {"workspace": str(ws)})["structuredContent"]["capsule_id"]
            task = alice.call("capsule_exec", {"capsule_id": cap, "cmd": SLOW, "wait_ms": 800})
            run = alice.call("capsule_exec", {"capsule_id": cap, "cmd": SLOW, "wait_ms": 0}, tasks=False)
            direct = alice.direct("capsule_exec", {"capsule_id": cap, "cmd": SLOW, "wait_ms": 0})["result"]
            ids = [task["taskId"], run["structuredContent"]["run_id"], direct["run_id"]]
            refused = {"tasks/get": bob.request("tasks/get", {"taskId": ids[0]}),
                       "tasks/cancel": bob.request("tasks/cancel", {"taskId": ids[0]}),
                       "capsule_run": [bob.call("capsule_run", {"run_id": i, "cancel": True}) for i in ids],
                       "direct": [bob.direct("capsule_run", {"run_id": i, "cancel": True}) for i in ids]}
            done = [alice.call("capsule_run", {"run_id": i, "wait_ms": None})["structuredContent"] for i in ids]
            polled = alice.request("tasks/get", {"taskId": ids[0]})["result"]
    finally:
        assert server.stop() == 0
    assert task["resultType"] == "task" and run["structuredContent"]["status"] == "running"
    assert refused["tasks/get"]["error"]["code"] == refused["tasks/cancel"]["error"]["code"] == -32602
    for answer in refused["capsule_run"]:
        assert answer["isError"] and answer["structuredContent"]["error"]["code"] == "NOT_FOUND"
    for answer in refused["direct"]:
        assert answer["error"]["data"]["error"]["code"] == "NOT_FOUND"
    # Bob's cancels touched nothing: each of alice's three runs ended as its command did.
    assert [d["stdout"] for d in done] == ["done\n"] * 3
    assert polled["status"] == "completed" and polled["result"]["structuredContent"]["stdout"] == "done\n"


ROOTLESS_SCRIPT = r"""
import json, sys, time
root, ws, state = sys.argv[1:4]
sys.path.insert(0, root)
from tests.support.raw_mcp import RawStdio

with RawStdio(state, "capsule", tasks=True) as client:
    cap = client.call("capsule_create", {"workspace": ws})["structuredContent"]["capsule_id"]
    created = client.call("capsule_exec", {"capsule_id": cap, "wait_ms": 1000,
                                           "cmd": ["sh", "-c", "sleep 3; echo done"]}, timeout=10)
    task = created
    while task["status"] == "working":
        time.sleep(0.3)
        task = client.request("tasks/get", {"taskId": created["taskId"]})["result"]
    sleeper = client.call("capsule_exec", {"capsule_id": cap, "cmd": ["sleep", "60"], "wait_ms": 500}, timeout=10)
    ack = client.request("tasks/cancel", {"taskId": sleeper["taskId"]}, timeout=20)
    cancelled = client.request("tasks/get", {"taskId": sleeper["taskId"]})["result"]
    after = client.call("capsule_exec", {"capsule_id": cap, "cmd": ["echo", "after"]}, timeout=10)
print(json.dumps({"created": created, "task": task, "ack": ack, "cancelled": cancelled, "after": after}))
"""


def test_tasks_as_an_unprivileged_user(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    ws = make_workspace(home / "ws", {"a.txt": "good\n"}, owner=(uid, gid))
    out = run_script_as(uid, gid, [sys.executable, "-c", ROOTLESS_SCRIPT, str(HERE.parent), str(ws),
                                   str(home / "state")], home)
    assert out["created"]["resultType"] == "task", json.dumps(out)
    assert out["task"]["status"] == "completed" and out["task"]["result"]["structuredContent"]["stdout"] == "done\n"
    assert "result" in out["ack"] and out["cancelled"]["status"] == "cancelled"
    assert out["after"]["structuredContent"]["stdout"] == "after\n"
