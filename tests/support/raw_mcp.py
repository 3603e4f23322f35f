"""A raw MCP client over stdio: newline-delimited JSON-RPC to a ``ccw-mcp`` child.

The SDK's client cannot declare an extension per request nor send ``tasks/get``, so
tests of the Tasks extension speak the protocol as any client would: each 2026-07-28
request carries its envelope in ``params._meta`` (protocol version, client info, the
client's capabilities for this request); a 2025-11-25 client says ``initialize`` first.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CCW_MCP = ROOT / ".venv" / "bin" / "ccw-mcp"
MODERN = "2026-07-28"
LEGACY = "2025-11-25"
TASKS = "io.modelcontextprotocol/tasks"


def envelope(tasks: bool) -> dict[str, Any]:
    """A 2026-era request's ``_meta``: declaring the Tasks extension or not."""
    capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    return {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "raw-test-client", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": capabilities}


def structured(answer: dict[str, Any]) -> dict[str, Any]:
    """A CallToolResult's structured content (what ``RawStdio.call`` returned); fails on a tool error."""
    assert not answer.get("isError"), answer
    result: dict[str, Any] = answer["structuredContent"]
    return result


class RawStdio:
    """One ``ccw-mcp`` over stdio; ``request`` sends one JSON-RPC request and returns its response."""

    def __init__(self, state_dir: Path, toolsets: str, tasks: bool | None = True, roots: list[Path] | None = None,
                 **settings: str) -> None:
        """``tasks``: declare the extension on every request (True) or not (False); None: the
        2025-11-25 era.  ``roots`` (2025-11-25 era): declared, and given when the server asks.
        ``settings``: more of the server's environment (CCW_WORKSPACE=...)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_", "SYN_"))}
        # Its own ready file: the default /tmp/mcp.ready is one for every user, and in the
        # sticky /tmp another user's server (a test on the other worker) cannot replace ours.
        ready = os.path.join(os.path.dirname(os.path.abspath(state_dir)), f"{os.path.basename(state_dir)}.ready")
        env.update(CCW_STATE_DIR=str(state_dir), CCW_TOOLSETS=toolsets, CCW_DEBUG="1", MCP_READY_FILE=ready)
        env.update(settings)
        self.proc = subprocess.Popen([str(CCW_MCP)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.tasks = tasks
        self.roots = roots
        self._writing = threading.Lock()  # the reader thread answers the server's roots/list
        self._serial = 0
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()
        if tasks is None:
            # not in the 2025-11-25 schema: must change nothing
            capabilities: dict[str, Any] = {"extensions": {TASKS: {}}}
            if roots is not None:
                capabilities["roots"] = {"listChanged": False}
            self.initialized = self.request("initialize", {
                "protocolVersion": LEGACY, "capabilities": capabilities,
                "clientInfo": {"name": "raw-test-client", "version": "0"}})
            self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        """Send ``method`` and wait (at most ``timeout`` s) for its response: ``result`` or ``error``."""
        self._serial += 1
        params = dict(params or {})
        if self.tasks is not None:
            params["_meta"] = envelope(self.tasks)
        self._send({"jsonrpc": "2.0", "id": self._serial, "method": method, "params": params})
        while True:
            try:
                message = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no answer to {method} in {timeout} s:\n" + "\n".join(self.stderr)) from None
            if message is None:
                raise AssertionError(f"ccw-mcp ended before answering {method}:\n" + "\n".join(self.stderr))
            if message.get("id") == self._serial:
                return message

    def call(self, tool: str, args: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        """``tools/call``: its result (a CallToolResult or a CreateTaskResult); fails on a JSON-RPC error."""
        answer = self.request("tools/call", {"name": tool, "arguments": args}, timeout)
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    def close(self) -> int:
        """Close stdin (the server ends) and return its exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        for reader in self._readers:
            reader.join(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return code

    def __enter__(self) -> RawStdio:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        with self._writing:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            if message.get("method") == "roots/list" and self.roots is not None:
                given = [{"uri": root.as_uri(), "name": root.name} for root in self.roots]
                self._send({"jsonrpc": "2.0", "id": message["id"], "result": {"roots": given}})
                continue
            self._lines.put(message)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode("utf-8", "replace").rstrip("\n"))
