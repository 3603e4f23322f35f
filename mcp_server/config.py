"""Every setting of ccw-mcp, in one frozen dataclass.

Each field names its environment variable, its default and its meaning (nsjail's habit:
one declarative schema).  Seed 001's ``SYN_*`` names are read as aliases of the
``CCW_*`` ones they stand for.  ``Config.from_env()`` is the only place that reads the
environment; everything else receives a ``Config``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from mcp_server.logs import FORMATS, LEVELS
from sandbox.errors import CcwError

ENDPOINTS = ("stdio", "socket", "http")
TOOLSETS = ("capsule", "policy", "witness", "snapshot", "workspace", "text", "file", "schema", "server")
# Named selections of single tools for CCW_TOOLSETS, beside the families.  ``agent``: what
# a coding agent's loop needs (make a capsule, read and edit files in it, run, diff,
# promote under a policy), about a quarter of the full list's bytes (bench/run.py surface).
PROFILES: dict[str, tuple[str, ...]] = {
    # capsule_run: an exec longer than its wait_ms answers "running" and is fetched with it.
    # capsule_network: an agent whose install meets a missing host proposes the rule and waits
    # for a person (over HTTP its token can do no more: the gate's scope follows the arguments).
    "agent": ("capsule_create", "capsule_exec", "capsule_run", "capsule_diff", "capsule_promote", "capsule_destroy",
              "capsule_list", "read_text_file", "edit_text_file", "policy_list", "capsule_network"),
}


def _default_state_dir(env: Mapping[str, str]) -> str:
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ccw")


def _setting(env: str, meaning: str, aliases: tuple[str, ...] = ()) -> dict[str, object]:
    return {"env": env, "meaning": meaning, "aliases": aliases}


@dataclass(frozen=True)
class Config:
    """ccw-mcp's configuration; see ``describe()`` for the table of settings."""

    endpoint: str = field(default="stdio", metadata=_setting("MCP_ENDPOINT", "transport: stdio | socket | http"))
    socket_path: str = field(default="/tmp/mcp.sock", metadata=_setting(
        "MCP_SOCKET_PATH", "unix socket path for MCP_ENDPOINT=socket"))
    socket_mode: int = field(default=0o600, metadata=_setting("MCP_SOCKET_MODE", "octal mode of the unix socket"))
    ready_file: str = field(default="/tmp/mcp.ready", metadata=_setting(
        "MCP_READY_FILE", "written with '<pid> <ISO8601>' when ready, removed on exit"))
    max_batch: int = field(default=100, metadata=_setting("MCP_MAX_BATCH", "most assets validate_many accepts"))
    state_dir: str = field(default="", metadata=_setting(
        "CCW_STATE_DIR", "SQLite, blobs and capsule dirs (default $XDG_STATE_HOME/ccw)"))
    helper_socket: str = field(default="", metadata=_setting(
        "CCW_HELPER_SOCKET", "helper's IPC socket; empty or unreachable: start an embedded helper"))
    http_addr: str = field(default="127.0.0.1:8765", metadata=_setting(
        "CCW_HTTP_ADDR", "host:port for MCP_ENDPOINT=http"))
    tokens_file: str = field(default="", metadata=_setting(
        "CCW_TOKENS_FILE", "HTTP bearer tokens and scopes (JSON); unset: HTTP binds loopback only and needs the admin "
        "token generated in $CCW_STATE_DIR/http-tokens.json (ccw client-config CLIENT --http prints it)"))
    toolsets: tuple[str, ...] = field(default=TOOLSETS, metadata=_setting(
        "CCW_TOOLSETS", "comma-separated tool families and profiles (agent) to expose (default: all)"))
    workspace: str = field(default="", metadata=_setting(
        "CCW_WORKSPACE", "workspace root for file tools when the client declares no roots (default: cwd)"))
    schemas_dir: str = field(default="", metadata=_setting(
        "CCW_SCHEMAS_DIR", "JSON Schema directory for the schema tools (default: ccw's own)", ("SYN_SCHEMAS_DIR",)))
    examples_dir: str = field(default="", metadata=_setting(
        "CCW_EXAMPLES_DIR", "examples directory for the schema tools", ("SYN_EXAMPLES_DIR",)))
    backend_url: str = field(default="", metadata=_setting(
        "CCW_BACKEND_URL", "enables populate_backend", ("SYN_BACKEND_URL",)))
    backend_assets_path: str = field(default="/synesthetic-assets/", metadata=_setting(
        "CCW_BACKEND_ASSETS_PATH", "POST path for populate_backend", ("SYN_BACKEND_ASSETS_PATH",)))
    log_level: str = field(default="info", metadata=_setting(
        "CCW_LOG_LEVEL", "debug | info | warning | error (ccw-mcp --log-level)"))
    log_format: str = field(default="text", metadata=_setting(
        "CCW_LOG_FORMAT", "text | json: one JSON object per log line (ccw-mcp --log-format)"))
    reapi_url: str = field(default="", metadata=_setting(
        "CCW_REAPI_URL", "grpc://host:port[/instance]: deltamin's trials and replays run on this REAPI cluster "
        "(ccw serve --reapi); empty: local capsules"))
    reapi_parallel: int = field(default=4, metadata=_setting(
        "CCW_REAPI_PARALLEL", "trials at once on the REAPI cluster: its capacity (the bots' slots)"))
    reapi_platform: str = field(default="OSFamily=linux", metadata=_setting(
        "CCW_REAPI_PLATFORM", "platform properties of every REAPI Action, name=value[,name=value]"))
    debug: bool = field(default=False, metadata=_setting(
        "CCW_DEBUG", "1: check every tool result against its output schema (tests set it)"))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read every setting from ``env`` (default ``os.environ``); bad values raise CcwError."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            raw = None
            for name in (f.metadata["env"], *f.metadata["aliases"]):
                if env.get(name, "") != "":
                    raw = env[name]
                    break
            if raw is None:
                continue
            values[f.name] = _parse(f.name, f.metadata["env"], raw)
        config = cls(**values)  # type: ignore[arg-type]
        if not config.state_dir:
            config = dataclasses.replace(config, state_dir=_default_state_dir(env))
        if not config.workspace:
            config = dataclasses.replace(config, workspace=os.getcwd())
        return config

    @staticmethod
    def describe() -> list[tuple[str, str, str]]:
        """(env var, default, meaning) for every setting, for docs and ``ccw doctor``."""
        rows = []
        for f in dataclasses.fields(Config):
            default = f.default
            if isinstance(default, tuple):
                default = ",".join(default)
            elif f.name == "socket_mode":
                default = "0600"
            rows.append((f.metadata["env"], str(default), f.metadata["meaning"]))
        return rows


def _parse(name: str, env_name: str, raw: str) -> object:
    if name == "endpoint":
        if raw not in ENDPOINTS:
            raise CcwError("INVALID_ARGUMENT", f"{env_name}={raw!r}: use one of {', '.join(ENDPOINTS)}")
        return raw
    if name == "socket_mode":
        try:
            return int(raw, 8)
        except ValueError:
            raise CcwError("INVALID_ARGUMENT", f"{env_name}={raw!r}: give an octal mode such as 0600") from None
    if name in ("max_batch", "reapi_parallel"):
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise CcwError("INVALID_ARGUMENT", f"{env_name}={raw!r}: give a positive integer")
        return value
    if name in ("log_level", "log_format"):
        choices = {"log_level": LEVELS, "log_format": FORMATS}[name]
        word = raw.strip().lower()
        if word not in choices:
            raise CcwError("INVALID_ARGUMENT", f"{env_name}={raw!r}: use one of {', '.join(choices)}")
        return word
    if name == "debug":
        return raw.strip().lower() not in ("0", "false", "no", "off")
    if name == "toolsets":
        chosen = tuple(sorted({part.strip() for part in raw.split(",") if part.strip()}))
        unknown = [t for t in chosen if t not in TOOLSETS and t not in PROFILES]
        if unknown:
            raise CcwError(
                "INVALID_ARGUMENT",
                f"{env_name}: unknown tool families {unknown}; known: {', '.join(TOOLSETS)}; "
                f"profiles: {', '.join(PROFILES)}",
            )
        return chosen
    return raw
