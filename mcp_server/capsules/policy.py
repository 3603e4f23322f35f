"""Promotion policies: the built-in ones (``policies/``) overlaid by those stored with policy_set.

Stored policies persist in the state database, validated against
``policies/policy.schema.json`` before they are stored (by the policy tools).

A policy's ``network`` rule speaks for the capsules whose network names it
(``network: {allow, policy: NAME}`` at capsule_create), and only for them:
``on_miss`` and ``ask_timeout_ms`` are their defaults where the capsule says nothing
(``network_defaults``, at create: a capsule's own word wins), and ``approve`` lists the
rules and presets a proposal may name to be approved at once, by ``policy NAME``
(``approves``, read when the proposal is made, so a changed policy counts from then on).
Promotion ignores it: it is about what a capsule may be given, not what it did.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mcp_server.core.netrules import NetworkSpec, parse_rules
from mcp_server.fs.netpresets import expand_rules
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

    def network_defaults(self, spec: NetworkSpec | None, given: Any) -> NetworkSpec | None:
        """``spec`` (parsed from capsule_create's ``given`` network) with its policy's
        ``on_miss`` and ``ask_timeout_ms`` where ``given`` does not say them; NOT_FOUND for
        a policy that does not exist."""
        if spec is None or spec.policy is None:
            return spec
        section = self.get(spec.policy)["rules"].get("network") or {}
        said = set(given) if isinstance(given, Mapping) else set()
        taken = {key: section[key] for key in ("on_miss", "ask_timeout_ms") if key in section and key not in said}
        return dataclasses.replace(spec, **taken) if taken else spec

    def approves(self, name: str, rules: Sequence[str], state_dir: str | Path) -> bool:
        """Whether policy ``name``'s ``network.approve`` holds every one of ``rules`` (parsed
        rules, presets expanded); a policy gone, or without the list, approves nothing."""
        try:
            listed = (self.get(name)["rules"].get("network") or {}).get("approve") or []
            allowed = set(parse_rules(expand_rules(listed, state_dir)))
        except CcwError:  # the policy was removed, or names a preset no longer there: a person decides
            return False
        return bool(rules) and set(parse_rules(rules)) <= allowed
