"""``ccw client-config CLIENT``: the snippet that registers ccw-mcp with an MCP client.

By default every client starts ccw-mcp as a stdio server: the absolute path of the
installed ``ccw-mcp`` (the one beside this Python, so a venv install works without PATH),
and the environment it needs: ``CCW_STATE_DIR`` always (an agent's capsules then live
where ``ccw capsule list`` finds them), ``CCW_HELPER_SOCKET`` when a system helper is
configured or its socket exists.  A stdio server is the client's own child: no token.

``--http HOST:PORT`` instead points the client at a running ``ccw serve --http
HOST:PORT``: its URL, and an ``Authorization: Bearer`` header carrying a token, because
HTTP authenticates every caller, loopback included (transports/http.py).  The token is
the one the server generates in its state dir (``mcp_server.auth``; made here if the
server has not started yet, the same way), or, with ``CCW_TOKENS_FILE``, the entry
``--token-name`` names.  The snippet then holds a secret: keep it out of version control.

The snippet goes to stdout (so it can be redirected into the file); where the file is,
on stderr (as a comment line for TOML).

Formats, as the clients document them:

- claude: Claude Code reads ``mcpServers`` from ``.mcp.json`` in a project (or
  ``~/.claude.json``; ``claude mcp add-json ccw '<json>'`` writes it); Claude Desktop
  the same shape in ``claude_desktop_config.json``.  ``"type": "stdio"`` or ``"http"``
  with ``url`` and ``headers``.
- codex: ``~/.codex/config.toml``, a ``[mcp_servers.ccw]`` table: ``command`` and
  ``env``, or ``url`` and ``http_headers``; and ``tool_timeout_sec``, the one client here
  with a per-server tool timeout (default 60 s).  A long run answers "running" within its
  ``wait_ms`` (capsules/run.py), so the timeout is set above the largest
  ``wait_ms`` a call may ask for (``tool_timeout_s``).  Claude Code, Cursor and VS Code
  document no per-server tool timeout in these files: their calls stay under the default
  ``wait_ms``.
- cursor: ``~/.cursor/mcp.json`` (global) or ``.cursor/mcp.json`` (project),
  ``mcpServers``: ``command``, or ``url`` and ``headers``.
- vscode: ``.vscode/mcp.json`` in a workspace, ``servers`` with ``"type": "stdio"``, or
  ``"type": "http"`` with ``url`` and ``headers``.

``--toolsets`` puts ``CCW_TOOLSETS`` in the snippet: every tool in ``tools/list`` costs
the agent's context on every turn, so a client that needs only the agent loop should
use the ``agent`` profile (``TOOLSETS_HELP``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from mcp_server.auth import TokenTable
from mcp_server.config import PROFILES, TOOLSETS, Config
from sandbox.errors import CcwError

CLIENTS = ("claude", "codex", "cursor", "vscode")
SERVICE_SOCKET = "/run/ccw/helper.sock"

WHERE = {
    "claude": "Claude Code: .mcp.json in the project, or ~/.claude.json (or run: claude mcp add-json ccw "
              "'<the server object>'); Claude Desktop: ~/.config/Claude/claude_desktop_config.json",
    "codex": "~/.codex/config.toml",
    "cursor": "~/.cursor/mcp.json (all projects) or .cursor/mcp.json (one project)",
    "vscode": ".vscode/mcp.json in the workspace (or the \"mcp\" section of your user settings)",
}


TOOLSETS_HELP = (
    "CCW_TOOLSETS (--toolsets) chooses the tools ccw-mcp lists; each listed tool costs the "
    "agent's context on every turn.\n"
    f"  families: {', '.join(TOOLSETS)} (default: all of them)\n"
    + "".join(f"  profile {name}: {', '.join(tools)}\n" for name, tools in PROFILES.items())
    + "  Families and profiles combine: --toolsets agent,witness."
)


def tool_timeout_s() -> int:
    """Codex's tool_timeout_sec: the longest wait_ms, and time to answer."""
    # Imported here: every ccw command builds the parser from this module's CLIENTS, and
    # capsules/run.py brings the run machinery of the server (trio, the helper's replies).
    from mcp_server.capsules.run import WAIT_MS_MAX

    return WAIT_MS_MAX // 1000 + 60


def ccw_mcp_path() -> str:
    """The absolute path of the installed ccw-mcp script (beside this interpreter, else on PATH)."""
    beside = Path(sys.executable).parent / "ccw-mcp"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    found = shutil.which("ccw-mcp")
    return os.path.abspath(found) if found else str(beside.absolute())


def server_env(config: Config, toolsets: str | None = None) -> dict[str, str]:
    """The environment the client should start ccw-mcp with (``toolsets``: CCW_TOOLSETS, checked)."""
    env = {"CCW_STATE_DIR": os.path.abspath(config.state_dir)}
    if toolsets:
        chosen = Config.from_env({"CCW_TOOLSETS": toolsets}).toolsets  # refuses unknown names
        env["CCW_TOOLSETS"] = ",".join(chosen)
    helper = config.helper_socket or (SERVICE_SOCKET if os.path.exists(SERVICE_SOCKET) else "")
    if helper:
        env["CCW_HELPER_SOCKET"] = helper
    return env


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string.

    Not JSON's string syntax: TOML forbids raw control characters, U+007F included,
    which ``json.dumps`` leaves as they are.  A path that is not valid UTF-8 (Python
    holds its bytes as lone surrogates) has no TOML spelling at all: refused.
    """
    out = []
    for char in value:
        if char in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        elif 0xD800 <= ord(char) <= 0xDFFF:
            raise CcwError("INVALID_ARGUMENT", f"{value!r} is not valid UTF-8, which a TOML file cannot hold; "
                           "use a state dir and an install path whose names are UTF-8")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_key(key: str) -> str:
    """A TOML key: bare when it can be, quoted otherwise."""
    return key if _BARE_KEY.match(key) else toml_string(key)


def snippet(client: str, command: str, env: dict[str, str]) -> tuple[str, Any]:
    """(text to print, the same as a JSON value) for ``client``."""
    if client == "codex":
        timeout_s = tool_timeout_s()
        pairs = ", ".join(f"{toml_key(key)} = {toml_string(value)}" for key, value in sorted(env.items()))
        text = (f"[mcp_servers.ccw]\ncommand = {toml_string(command)}\nargs = []\nenv = {{ {pairs} }}\n"
                f"tool_timeout_sec = {timeout_s}\n")
        value: Any = {"mcp_servers": {"ccw": {"command": command, "args": [], "env": env,
                                              "tool_timeout_sec": timeout_s}}}
        return text, value
    server: dict[str, Any] = {"command": command, "args": [], "env": env}
    if client == "vscode":
        value = {"servers": {"ccw": {"type": "stdio", **server}}}
    elif client == "claude":
        value = {"mcpServers": {"ccw": {"type": "stdio", **server}}}
    else:
        value = {"mcpServers": {"ccw": server}}
    return json.dumps(value, indent=2, sort_keys=True) + "\n", value


def http_snippet(client: str, url: str, token: str) -> tuple[str, Any]:
    """(text to print, the same as a JSON value) for ``client`` calling ``url`` with ``token``."""
    headers = {"Authorization": f"Bearer {token}"}
    if client == "codex":
        timeout_s = tool_timeout_s()
        pairs = ", ".join(f"{toml_key(key)} = {toml_string(value)}" for key, value in headers.items())
        text = (f"[mcp_servers.ccw]\nurl = {toml_string(url)}\nhttp_headers = {{ {pairs} }}\n"
                f"tool_timeout_sec = {timeout_s}\n")
        return text, {"mcp_servers": {"ccw": {"url": url, "http_headers": headers, "tool_timeout_sec": timeout_s}}}
    server: dict[str, Any] = {"url": url, "headers": headers}
    if client == "vscode":
        value: Any = {"servers": {"ccw": {"type": "http", **server}}}
    elif client == "claude":
        value = {"mcpServers": {"ccw": {"type": "http", **server}}}
    else:
        value = {"mcpServers": {"ccw": server}}
    return json.dumps(value, indent=2, sort_keys=True) + "\n", value


def http_target(config: Config, addr: str, token_name: str | None) -> tuple[str, str]:
    """(URL, bearer token) of ``ccw serve --http addr`` over ``config``'s state dir or tokens file."""
    from mcp_server.transports.http import MCP_PATH, parse_addr

    host, port = parse_addr(addr)
    shown = f"[{host}]" if ":" in host else host
    token = TokenTable.for_server(config.tokens_file, config.state_dir).token_named(token_name)
    return f"http://{shown}:{port}{MCP_PATH}", token


def run(client: str, config: Config, as_json: bool, toolsets: str | None = None, http: str | None = None,
        token_name: str | None = None) -> int:
    """Print the snippet for ``client`` (and where it goes): stdio, or ``http`` (HOST:PORT) with a token."""
    if http is None:
        text, value = snippet(client, ccw_mcp_path(), server_env(config, toolsets))
    else:
        if toolsets:
            raise CcwError("INVALID_ARGUMENT", "over HTTP the server chooses its tools: pass --toolsets to "
                           "ccw serve, not to client-config --http")
        text, value = http_snippet(client, *http_target(config, http, token_name))
        print("ccw: this snippet holds a bearer token: keep the file private and out of version control",
              file=sys.stderr)
    if as_json:
        document = {"client": client, "file": WHERE[client], "format": "toml" if client == "codex" else "json",
                    "transport": "stdio" if http is None else "http", "config": value, "text": text}
        sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
        return 0
    if client == "codex":
        sys.stdout.write(f"# add to {WHERE[client]}\n")
    else:
        print(f"ccw: merge into {WHERE[client]}", file=sys.stderr)
    sys.stdout.write(text)
    return 0
