"""What a service is: its spec (command, readiness, restart policy), and where specs are kept.

A spec is what ``capsule_service_start`` was given, completed for its capsule (the cwd
made absolute).  It is kept in the state dir's ``services`` table, so a capsule's
services outlive the process that started them: a restarted front end finds them and
brings back those whose ``restart`` says so (capsules/services.py).  What is kept:

- the argv, cwd, limits, readiness and restart policy;
- the environment's *names*, and the values the caller gave explicitly in ``env``.  A
  whitelisted variable the caller did not name is taken, at each start, from the
  environment of the process that starts it, as an exec's is (capsules/exec.py:
  ``for_capsule``), so no value the agent never saw is written down.

A witness of an exec records the specs of the services that ran beside it, without any
value (``for_witness``); a replay starts them from there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mcp_server.capsules.exec import for_capsule
from mcp_server.core.witness_manifest import (
    SERVICE_READY_LINE_MAX,
    SERVICE_READY_TIMEOUT_MAX_MS,
    SERVICE_RESTARTS,
)
from mcp_server.state import State
from sandbox.checks import SERVICE_NAME_RE
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest
from sandbox.spec import CapsuleSpec, Limits

RESTARTS = SERVICE_RESTARTS
READY_TIMEOUT_MS = 30_000  # how long a start waits for readiness by default
READY_TIMEOUT_MAX_MS = SERVICE_READY_TIMEOUT_MAX_MS
LINE_MAX = SERVICE_READY_LINE_MAX  # characters of a readiness line (text looked for, never a pattern)

_DDL = """
CREATE TABLE IF NOT EXISTS services (
    capsule_id TEXT NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (capsule_id, name)
);
"""


@dataclass(frozen=True)
class Ready:
    """When a service counts as ready: a TCP port of the capsule accepts, a path is made (or
    changed) in the jail after its command started (capsules/service_ready.py says why not
    merely "exists"), or a line of its output contains ``line``; at most ``timeout_ms`` after it started.

    ``line`` is text, not a regular expression: a witness names both a service's readiness and
    the program whose output is searched, and a pattern chosen that way could stall the
    front end (catastrophic backtracking); a plain search is linear."""

    port: int | None = None
    path: str | None = None
    line: str | None = None
    timeout_ms: int = READY_TIMEOUT_MS

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"timeout_ms": self.timeout_ms}
        for key in ("port", "path", "line"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ready:
        ready = cls(data.get("port"), data.get("path"), data.get("line"), int(data.get("timeout_ms", READY_TIMEOUT_MS)))
        given = [key for key in ("port", "path", "line") if getattr(ready, key) is not None]
        if len(given) != 1:
            raise CcwError("INVALID_ARGUMENT", "ready takes exactly one of port, path or line (and timeout_ms); "
                           f"got {given or 'none'}", {"argument": "ready"})
        return ready

    def describe(self) -> str:
        if self.port is not None:
            return f"port {self.port} accepting"
        if self.path is not None:
            return f"{self.path} made or changed since the start"
        return f"a line containing {self.line!r}"


@dataclass(frozen=True)
class ServiceSpec:
    """One service of a capsule, as started."""

    capsule_id: str
    name: str
    argv: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] | None = None  # given explicitly; None: the capsule's whitelist, from the starter
    ready: Ready | None = None
    limits: Limits | None = None
    restart: str = "no"

    def __post_init__(self) -> None:
        if not SERVICE_NAME_RE.fullmatch(self.name):
            raise CcwError("INVALID_ARGUMENT", f"service name {self.name!r} must match {SERVICE_NAME_RE.pattern}",
                           {"argument": "name"})
        if self.restart not in RESTARTS:
            raise CcwError("INVALID_ARGUMENT", f"restart must be one of {list(RESTARTS)}", {"argument": "restart"})

    def to_json(self, values: bool = True) -> dict[str, Any]:
        """The spec as stored; ``values=False``: without the environment's values (a witness's)."""
        out: dict[str, Any] = {"name": self.name, "argv": list(self.argv), "cwd": self.cwd, "restart": self.restart}
        if self.env is not None:
            out["env"] = dict(self.env) if values else sorted(self.env)
        if self.ready is not None:
            out["ready"] = self.ready.to_json()
        if self.limits is not None:
            out["limits"] = self.limits.to_json()
        return out

    def for_witness(self) -> dict[str, Any]:
        return self.to_json(values=False)

    @classmethod
    def from_json(cls, capsule_id: str, data: Mapping[str, Any]) -> ServiceSpec:
        env = data.get("env")
        if isinstance(env, list):  # a witness's: names only, values from the replayer
            env = None
        return cls(capsule_id, data["name"], tuple(data["argv"]), data.get("cwd"), env,
                   Ready.from_json(data["ready"]) if data.get("ready") else None,
                   Limits(**data["limits"]) if data.get("limits") else None, data.get("restart", "no"))

    def in_capsule(self, capsule_id: str) -> ServiceSpec:
        return replace(self, capsule_id=capsule_id)

    def request(self, capsule: CapsuleSpec, progress_ms: int, output_cap: int,
                values: Mapping[str, str] | None = None) -> ExecRequest:
        """The helper's exec for one run of the service in a capsule made from ``capsule``: no time
        limit, its output streamed; whitelisted variables it does not set taken from ``values``."""
        return for_capsule(ExecRequest(self.capsule_id, self.argv, self.cwd, self.env, timeout_ms=0,
                                       limits=self.limits, output_cap=output_cap, stream=True, service=self.name),
                           capsule, values, progress_ms)


class SpecTable:
    """The state dir's ``services`` table: the specs of every live capsule's services."""

    def __init__(self, state: State) -> None:
        self.state = state
        state.ensure_schema("services", _DDL)

    def save(self, spec: ServiceSpec, created_at: str) -> None:
        self.state.execute("INSERT OR REPLACE INTO services (capsule_id, name, spec, created_at) VALUES (?, ?, ?, ?)",
                           (spec.capsule_id, spec.name, json.dumps(spec.to_json(), sort_keys=True), created_at))

    def remove(self, capsule_id: str, name: str | None = None) -> None:
        if name is None:
            self.state.execute("DELETE FROM services WHERE capsule_id = ?", (capsule_id,))
        else:
            self.state.execute("DELETE FROM services WHERE capsule_id = ? AND name = ?", (capsule_id, name))

    def all(self) -> list[tuple[ServiceSpec, str]]:
        """Every kept spec with when it was first started, by capsule and name."""
        rows = self.state.execute("SELECT capsule_id, spec, created_at FROM services ORDER BY capsule_id, name")
        return [(ServiceSpec.from_json(row["capsule_id"], json.loads(row["spec"])), row["created_at"]) for row in rows]
