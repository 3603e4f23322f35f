"""The policy files: ``policies/policy.schema.json`` and the built-in policies, read from
package data once per process, and validating a policy against that schema.

Judging a capsule against policies is ``mcp_server.core.policy``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

from mcp_server.core.netrules import parse_rules
from mcp_server.core.policy import RULE_NAMES
from mcp_server.data import data_dir
from sandbox.errors import CcwError


def policies_dir() -> Path:
    """The built-in policies and their schema: ``policies/``, shipped as package data."""
    return data_dir("policies")


@functools.cache
def policy_schema() -> dict[str, Any]:
    """The JSON Schema every policy is validated against (policies/policy.schema.json)."""
    with open(policies_dir() / "policy.schema.json", encoding="utf-8") as f:
        schema: dict[str, Any] = json.load(f)
    return schema


def validate_policy(policy: dict[str, Any]) -> None:
    """Raise INVALID_ARGUMENT naming every problem, unknown rule names first."""
    rules = policy.get("rules")
    if isinstance(rules, dict):
        unknown = sorted(set(rules) - set(RULE_NAMES))
        if unknown:
            raise CcwError(
                "INVALID_ARGUMENT",
                f"unknown policy rule(s) {', '.join(unknown)}; known rules: {', '.join(RULE_NAMES)}",
                {"unknown_rules": unknown, "known_rules": list(RULE_NAMES)},
            )
    validator = jsonschema.Draft202012Validator(policy_schema())
    errors = sorted(validator.iter_errors(policy), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        problems = [{"path": "/" + "/".join(str(p) for p in e.absolute_path), "msg": e.message} for e in errors]
        raise CcwError(
            "INVALID_ARGUMENT",
            "policy does not match policies/policy.schema.json: "
            + "; ".join(f"{p['path']}: {p['msg']}" for p in problems),
            {"errors": problems},
        )
    for key in ("allow_hosts", "deny_hosts"):
        parse_rules(policy["rules"].get(key, ()))  # INVALID_ARGUMENT naming the rule and the grammar


@functools.cache
def builtin_policies() -> dict[str, dict[str, Any]]:
    """The policies shipped in policies/ (every *.json but the schema), by name."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(policies_dir().glob("*.json")):
        if path.name == "policy.schema.json":
            continue
        with open(path, encoding="utf-8") as f:
            policy = json.load(f)
        validate_policy(policy)
        out[policy["name"]] = policy
    return out
