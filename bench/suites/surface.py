"""``python bench/run.py surface``: what ccw's tool surface costs an agent, in bytes.

Bytes, not time: every byte of ``tools/list`` sits in an agent's context on every turn,
and every byte of a tool result once.  Two measures, each beside the reference
filesystem server (``@modelcontextprotocol/server-filesystem``, installed by ``./dev test``
under ``.cache/npm``):

1. ``tools/list``: the bytes of the response line for the whole list, for the ``agent``
   profile and for each family (``CCW_TOOLSETS``; ``--quick``: the whole list and the
   ``agent`` profile only), and per tool; and the part an LLM API
   is given (name, description, input schema: clients keep output schemas and
   annotations to themselves), "model-visible bytes".
2. A scripted agent loop over a 500-line Python module and its test: read the file, edit
   one line, run the test, see the diff, promote.  ccw (the ``agent`` profile) does it in
   a capsule; the reference server reads and edits in place and has no way to run
   anything, so its side adds a shell: the reference has none, so the shell is modelled
   as the smallest honest tool result (the command's output and exit status as one text
   block, the same JSON-RPC envelope), and its "diff" is ``git diff`` through that shell.
   "Promote" costs it nothing (the edit was made in place, which is what ccw avoids).
   Every byte the agent receives counts: initialize, tools/list and each result line.

ccw's capsule tools need root (or a rootless-capable kernel) like any capsule suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from bench.common import Report, Row

ROOT = Path(__file__).resolve().parent.parent.parent
CCW_MCP = ROOT / ".venv" / "bin" / "ccw-mcp"
REFERENCE = (ROOT / ".cache" / "npm" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist"
             / "index.js")
LINES = 500
EDIT_LINE = 250  # 1-based line of the module the loop changes
TARGETS = {"all": "<= 1 KB/tool", "agent": "< 15 KB"}
# The system's Python: a capsule binds the host's system directories, not this venv.
TEST_COMMAND = ["/usr/bin/python3", "-B", "test_mod.py"]


class StdioSession:
    """A newline-delimited JSON-RPC client on a server's stdin/stdout that counts received bytes."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=cwd)
        self.received = 0
        self._next_id = 0
        self.output_schemas: dict[str, dict[str, Any]] = {}  # tool name -> advertised output schema to check

    def request(self, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Send one request; (its result, bytes received until its answer, notifications included)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._next_id += 1
        frame = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        self.proc.stdin.flush()
        got = 0
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{method}: the server closed its stdout")
            got += len(line)
            message = json.loads(line)
            if message.get("id") == self._next_id:
                break
        self.received += got
        if "error" in message:
            raise RuntimeError(f"{method} failed: {message['error']}")
        return message["result"], got

    def notify(self, method: str) -> None:
        """Send a notification (no answer)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")
        self.proc.stdin.flush()

    def open(self) -> int:
        """The initialize handshake; bytes received."""
        _, got = self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                             "clientInfo": {"name": "ccw-bench-surface", "version": "1"}})
        self.notify("notifications/initialized")
        return got

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """tools/call; (the result, bytes received)."""
        result, got = self.request("tools/call", {"name": name, "arguments": arguments})
        if result.get("isError"):
            raise RuntimeError(f"{name} failed: {json.dumps(result)[:500]}")
        if name in self.output_schemas:
            Draft202012Validator(self.output_schemas[name]).validate(result["structuredContent"])
        return result, got

    def close(self) -> None:
        """Close stdin and wait for the server to end."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ccw_env(state: Path, toolsets: str | None, workspace: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_", "SYN_"))}
    env.update(CCW_STATE_DIR=str(state), MCP_READY_FILE=str(state.parent / "mcp.ready"), CCW_WORKSPACE=str(workspace))
    if toolsets:
        env["CCW_TOOLSETS"] = toolsets
    return env


def _listed(session: StdioSession) -> tuple[int, int, list[dict[str, Any]]]:
    result, got = session.request("tools/list", {})
    return got, len(result["tools"]), result["tools"]


def _model_visible(tools: list[dict[str, Any]]) -> int:
    """What an LLM API is given of a tool list: name, description and input schema of each
    (clients keep output schemas and annotations to themselves)."""
    return sum(len(json.dumps({k: tool.get(k) for k in ("name", "description", "inputSchema")},
                              separators=(",", ":"), ensure_ascii=False).encode()) for tool in tools)


def _make_project(directory: Path) -> Path:
    """A git repository with a 500-line module and a test that checks one of its lines."""
    directory.mkdir()
    body = "".join(f"VALUE_{i} = {i} * 2  # constant {i} of the module, kept for the benchmark\n"
                   for i in range(1, LINES + 1))
    (directory / "mod.py").write_text(body)
    (directory / "test_mod.py").write_text(
        "import mod\n\n"
        f"assert mod.VALUE_{EDIT_LINE} == {EDIT_LINE * 3}, mod.VALUE_{EDIT_LINE}\n"
        "print('ok')\n")
    for argv in (["git", "init", "-q"], ["git", "add", "."],
                 ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "base"]):
        subprocess.run(argv, cwd=directory, check=True, capture_output=True)
    return directory


def _tagged_anchor(content: str, line: int) -> str:
    """The ``LINE:HASH`` tag of ``line`` in read_text_file's tagged text."""
    for text in content.splitlines():
        tag = text.split("|", 1)[0]
        if tag.split(":", 1)[0] == str(line):
            return tag
    raise RuntimeError(f"line {line} not in the read")


def _shell_result_bytes(request_id: int, argv: list[str], cwd: Path) -> int:
    """The modelled shell tool: the JSON-RPC answer a minimal shell tool would send."""
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    text = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    answer = {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": text}]}}
    return len(json.dumps(answer, separators=(",", ":")).encode()) + 1


def _ccw_loop(base: Path) -> dict[str, int]:
    workspace = _make_project(base / "ccw-ws")
    session = StdioSession([str(CCW_MCP)], _ccw_env(base / "ccw-state", "agent", workspace), str(workspace))
    steps: dict[str, int] = {}
    try:
        steps["initialize"] = session.open()
        steps["tools/list"], _, listed = _listed(session)
        # Check every result against the schema tools/list advertised, as a validating client
        # (the SDK's ClientSession) does: the advertised schemas must be true of real results.
        session.output_schemas = {tool["name"]: tool["outputSchema"] for tool in listed if "outputSchema" in tool}
        created, steps["capsule_create"] = session.call("capsule_create", {"workspace": str(workspace)})
        capsule_id = created["structuredContent"]["capsule_id"]
        read, steps["read 500 lines"] = session.call(
            "read_text_file", {"path": str(workspace / "mod.py"), "capsule_id": capsule_id})
        anchor = _tagged_anchor(read["structuredContent"]["content"], EDIT_LINE)
        _, steps["edit one line"] = session.call("edit_text_file", {
            "path": str(workspace / "mod.py"), "capsule_id": capsule_id,
            "file_hash": read["structuredContent"]["file_hash"],
            "ops": [{"op": "replace", "anchor": anchor,
                     "content": f"VALUE_{EDIT_LINE} = {EDIT_LINE} * 3  # constant {EDIT_LINE}, changed"}]})
        ran, steps["run the test"] = session.call(
            "capsule_exec", {"capsule_id": capsule_id, "cmd": TEST_COMMAND})
        if ran["structuredContent"]["exit_code"] != 0:
            raise RuntimeError(f"the test failed in the capsule: {ran['structuredContent']['stderr'][-500:]}")
        _, steps["diff"] = session.call("capsule_diff", {"capsule_id": capsule_id})
        promoted, steps["promote"] = session.call("capsule_promote", {"capsule_id": capsule_id})
        if not promoted["structuredContent"]["promoted"]:
            raise RuntimeError(f"not promoted: {promoted['structuredContent']}")
        session.call("capsule_destroy", {"capsule_id": capsule_id})
    finally:
        session.close()
    return steps


def _reference_loop(base: Path) -> dict[str, int]:
    workspace = _make_project(base / "ref-ws")
    session = StdioSession(["node", str(REFERENCE), str(workspace)], dict(os.environ), str(workspace))
    steps: dict[str, int] = {}
    try:
        steps["initialize"] = session.open()
        steps["tools/list"] = _listed(session)[0]
        steps["capsule_create"] = 0  # nothing to create: it works on the real tree
        _, steps["read 500 lines"] = session.call("read_text_file", {"path": str(workspace / "mod.py")})
        old = f"VALUE_{EDIT_LINE} = {EDIT_LINE} * 2  # constant {EDIT_LINE} of the module, kept for the benchmark"
        new = f"VALUE_{EDIT_LINE} = {EDIT_LINE} * 3  # constant {EDIT_LINE}, changed"
        _, steps["edit one line"] = session.call(
            "edit_file", {"path": str(workspace / "mod.py"), "edits": [{"oldText": old, "newText": new}]})
        steps["run the test"] = _shell_result_bytes(100, TEST_COMMAND, workspace)
        steps["diff"] = _shell_result_bytes(101, ["git", "diff"], workspace)
        steps["promote"] = 0  # already in the real tree
    finally:
        session.close()
    return steps


def run(quick: bool = False) -> Report:
    """Bytes of tools/list per profile and family, and of the agent loop, beside the reference server."""
    report = Report("surface")
    have_reference = REFERENCE.exists() and shutil.which("node") is not None
    if not have_reference:
        report.notes.append(f"reference server not installed ({REFERENCE}); run ./dev test once (npm)")
    from mcp_server.config import TOOLSETS

    with tempfile.TemporaryDirectory(prefix="ccw-bench-surface-") as tmp:
        base = Path(tmp)
        reference: tuple[int, int, int] | None = None
        if have_reference:
            empty = base / "ref-empty"
            empty.mkdir()
            session = StdioSession(["node", str(REFERENCE), str(empty)], dict(os.environ), str(empty))
            try:
                session.open()
                got, count, listed = _listed(session)
                reference = (got, count, _model_visible(listed))
            finally:
                session.close()
        # quick (a smoke run): the two lists with a baseline, not each family's (a ccw-mcp start each)
        for index, toolsets in enumerate((None, "agent") if quick else (None, "agent", *TOOLSETS)):
            name = toolsets or "all"
            state = base / f"list-{index}" / "state"
            state.parent.mkdir()
            session = StdioSession([str(CCW_MCP)], _ccw_env(state, toolsets, base), str(base))
            try:
                session.open()
                got, count, tools = _listed(session)
            finally:
                session.close()
            largest = max(tools, key=lambda tool: len(json.dumps(tool)))
            extra = {"tools": count, "bytes per tool": round(got / count), "model-visible bytes": _model_visible(tools),
                     "largest": f"{largest['name']} ({len(json.dumps(largest, separators=(',', ':')))} B)"}
            row = Row(f"tools/list {name}", float(got), unit="B", target=TARGETS.get(name, ""), extra=extra)
            if reference is not None and name in ("all", "agent"):
                row.baseline, row.baseline_ms = f"reference fs ({reference[1]} tools)", float(reference[0])
                row.extra["reference model-visible bytes"] = reference[2]
            report.add(row)
        ccw_steps = _ccw_loop(base)
        reference_steps = _reference_loop(base) if have_reference else {}
        for step, got in ccw_steps.items():
            row = Row(f"agent loop: {step}", float(got), unit="B")
            if step in reference_steps:
                row.baseline = "reference fs" + (" + shell (modelled)" if step in ("run the test", "diff") else "")
                row.baseline_ms = float(reference_steps[step])
            report.add(row)
        total = Row("agent loop: total received", float(sum(ccw_steps.values())), unit="B")
        if reference_steps:
            total.baseline, total.baseline_ms = "reference fs + shell", float(sum(reference_steps.values()))
        report.add(total)
    report.notes.append("bytes are the JSON-RPC lines the agent's client receives (UTF-8), notifications included")
    report.notes.append("the reference server has no shell: its 'run the test' and 'diff' are a modelled minimal "
                        "shell tool's answer (exit status and output as one text block)")
    return report
