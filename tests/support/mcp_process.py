"""Run a real ``ccw-mcp`` process for tests: spawn, wait for ``mcp:ready``, stop, read logs.

Over HTTP every request needs a bearer token (transports/http.py, item 3): with no
``CCW_TOKENS_FILE`` a server generates one in its state dir, which ``ServerProcess.bearer``
reads for the tests; ``ServerProcess.client`` is an SDK client that sends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from mcp_server.auth import TokenTable

ROOT = Path(__file__).resolve().parents[2]
CCW_MCP = ROOT / ".venv" / "bin" / "ccw-mcp"
READY_RE = re.compile(r"^mcp:ready mode=(\S+) path=(\S+) ")


def _without_ccw_settings() -> dict[str, str]:
    """This process's environment less ccw's own settings (CCW_*, MCP_*, SYN_*): a server a
    test starts reads only the settings the test gives it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_", "SYN_"))}


def server_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment for an isolated server as a test of the server wants it: its own state
    dir, ready file, socket and port under ``tmp``; only the ``server`` tools and every
    result checked against its schema (CCW_DEBUG) unless ``extra`` says otherwise."""
    env = _without_ccw_settings()
    env.update(
        CCW_STATE_DIR=str(tmp / "state"),
        MCP_READY_FILE=str(tmp / "mcp.ready"),
        MCP_SOCKET_PATH=str(tmp / "mcp.sock"),
        CCW_HTTP_ADDR="127.0.0.1:0",
        CCW_TOOLSETS="server",
        CCW_DEBUG="1",
    )
    env.update(extra)
    return env


def http_token_env(tmp: Path, tokens: dict[str, Any], **extra: str) -> dict[str, str]:
    """``server_env`` for a server on HTTP whose tokens are ``tokens`` (``{"tokens": [...]}``),
    written to ``tmp/tokens.json`` as an operator writes it (mode 0600: the server refuses a looser one)."""
    path = tmp / "tokens.json"
    path.write_text(json.dumps(tokens))
    path.chmod(0o600)
    return server_env(tmp, MCP_ENDPOINT="http", CCW_TOKENS_FILE=str(path), **extra)


def agent_server_env(state_dir: Path, workspace: Path) -> dict[str, str]:
    """Environment for an isolated server as an agent's client starts it (on stdio): state
    in ``state_dir``, its ready file beside it, files on ``workspace``; every tool and no
    schema checks, the defaults an agent gets (``server_env`` chooses otherwise)."""
    env = _without_ccw_settings()
    env.update(CCW_STATE_DIR=str(state_dir), CCW_WORKSPACE=str(workspace),
               MCP_READY_FILE=str(state_dir.parent / f"{state_dir.name}.ready"))
    return env


def stdio_client(tmp: Path, **extra: str) -> Client:
    """An SDK client (legacy mode, as agents' clients are) of a ``ccw-mcp`` it starts on stdio,
    isolated as ``server_env`` makes it (``extra``: more settings, such as CCW_TOOLSETS)."""
    params = StdioServerParameters(command=str(CCW_MCP), env=server_env(tmp, **extra))
    return Client(params, mode="legacy")


class ServerProcess:
    """A ccw-mcp child; stderr is collected line by line in a thread."""

    def __init__(self, env: dict[str, str], stdin: int | None = subprocess.DEVNULL,
                 argv: list[str] | None = None) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [str(CCW_MCP), *(argv or [])], env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.path = ""
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            match = READY_RE.match(line)
            if match:
                self.path = match.group(2)
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 30) -> str:
        """Block until ``mcp:ready``; return its ``path=`` (socket path or URL)."""
        if not self._ready.wait(timeout) or not self.path:
            self.stop()
            raise AssertionError("ccw-mcp did not become ready:\n" + self.log)
        return self.path

    def bearer(self) -> dict[str, str]:
        """The ``Authorization`` header for this HTTP server: the token it generated in its state dir."""
        token = TokenTable.generated(self.env["CCW_STATE_DIR"]).token_named(None)
        return {"authorization": f"Bearer {token}"}

    @contextlib.asynccontextmanager
    async def client(self, mode: str = "legacy", **options: Any) -> AsyncIterator[Client]:
        """An SDK client of this HTTP server (after ``wait_ready``) that sends ``bearer()``."""
        async with (
            httpx2.AsyncClient(headers=self.bearer(), timeout=httpx2.Timeout(30, read=300)) as http,
            Client(streamable_http_client(self.path, http_client=http), mode=mode, **options) as client,
        ):
            yield client

    @property
    def log(self) -> str:
        """stderr so far."""
        return "\n".join(self.lines)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Send a signal."""
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        """Wait for exit; return the status (stderr fully read)."""
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
        return code

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.wait(10)

    def wait_for_line(self, pattern: str, timeout: float = 20) -> str:
        """Wait until a stderr line matches ``pattern``."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if regex.search(line):
                    return line
            time.sleep(0.02)
        raise AssertionError(f"no stderr line matching {pattern!r}:\n{self.log}")
