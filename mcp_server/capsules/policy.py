"""Promotion policies: the built-in ones (``policies/``) overlaid by those stored with policy_set.

Stored policies persist in the state database, validated against
``policies/policy.schema.json`` before they are stored (by the policy tools).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from mcp_server.fs.policy import builtin_policies
from mcp_server.state import State
from sandbox.errors import CcwError

_DDL = """
CREATE TABLE IF NOT EXISTS policies (
    name TEXT PRIMARY KEY,
    policy TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
"""


class PolicyStore:
    """Built-in policies overlaid by stored ones."""

    def __init__(self, state: State) -> None:
        self.state = state
        state.ensure_schema("policies", _DDL)

    def stored(self) -> dict[str, dict[str, Any]]:
        """Policies set with policy_set, by name."""
        rows = self.state.execute("SELECT name, policy FROM policies ORDER BY name")
        return {row["name"]: json.loads(row["policy"]) for row in rows}

    def get(self, name: str) -> dict[str, Any]:
        """The policy in force under ``name`` (stored overrides built-in)."""
        stored = self.stored()
        if name in stored:
            return stored[name]
        builtins = builtin_policies()
        if name in builtins:
            return builtins[name]
        known = sorted(set(stored) | set(builtins))
        raise CcwError(
            "NOT_FOUND",
            f"no policy named {name!r}; known policies: {', '.join(known)}. Create it with policy_set",
            {"name": name, "known": known},
        )

    def put(self, policy: dict[str, Any]) -> None:
        """Store (or replace) a validated policy."""
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.state.execute(
            "INSERT OR REPLACE INTO policies (name, policy, updated_at) VALUES (?, ?, ?)",
            (policy["name"], json.dumps(policy, sort_keys=True), now),
        )
